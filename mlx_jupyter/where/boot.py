"""How a launched Python rank starts when the launch may ask it where it is (``--where-on-signal``).

:func:`wrap` turns ``python [options] script.py args`` (or ``-m mod``, ``-c code``) into
``python [options] -c BOOT script.py args``: BOOT installs :mod:`.signal_report` (or, where mlx_jupyter
is not importable by the rank's Python, ``faulthandler`` on SIGUSR1, which prints every thread's
stack) and then runs the script as ``__main__``. Pure: argv in, argv out.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

#: the code run first (self-contained: the rank's Python may lack mlx_jupyter)
BOOT = """\
import os, runpy, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # held, not fatal, while the imports run
signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # a remote rank starts with it ignored (launch.script)
args = sys.argv[1:]
try:
    from mlx_jupyter.where.signal_report import install
    install()
    del install
except Exception:
    import faulthandler
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
if args[:1] == ["-m"]:
    sys.argv = args[1:]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
elif args[:1] == ["-c"]:
    import linecache, types
    sys.argv = ["-c", *args[2:]]
    linecache.cache["<string>"] = (len(args[1]), None, args[1].splitlines(True), "<string>")  # its source, for where
    main = sys.modules["__main__"] = types.ModuleType("__main__")
    exec(compile(args[1], "<string>", "exec"), main.__dict__)
else:
    sys.argv = args
    sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
    runpy.run_path(args[0], run_name="__main__")
"""

#: interpreter options that take no value (they combine: ``-uB``)
_FLAGS = frozenset("bBdEiIOPqsSuvx")
#: interpreter options whose value is the next argument unless attached (``-X dev``, ``-Xdev``)
_VALUED = ("-X", "-W")


def wrap(argv: Sequence[str]) -> Optional[list[str]]:
    """``argv`` started through BOOT, or None when it does not run a Python script, module or ``-c``
    command. Interpreter options before it stay in front of BOOT (``python -u t.py``)."""
    if len(argv) < 2 or not os.path.basename(argv[0]).startswith("python"):
        return None
    options: list[str] = []
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] not in ("-m", "-c"):
        arg = argv[i]
        if arg in _VALUED and i + 1 < len(argv):
            options += argv[i:i + 2]
            i += 2
        elif arg.startswith(_VALUED) and len(arg) > 2 or len(arg) > 1 and set(arg[1:]) <= _FLAGS:
            options.append(arg)
            i += 1
        else:
            return None   # stdin (-), --, --help, an option we do not know
    rest = list(argv[i:])
    if not rest or rest[0] in ("-m", "-c") and len(rest) < 2:
        return None
    return [argv[0], *options, "-c", BOOT, *rest]
