"""How a launched Python rank starts when the launch may ask it where it is (``--where-on-signal``).

:func:`wrap` turns ``python script.py args`` (or ``python -m mod args``) into
``python -c BOOT script.py args``: BOOT installs :mod:`.signal_report` (or, where mlx_jupyter
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
else:
    sys.argv = args
    sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
    runpy.run_path(args[0], run_name="__main__")
"""


def wrap(argv: Sequence[str]) -> Optional[list[str]]:
    """``argv`` started through BOOT, or None when it does not run a Python script or module."""
    if len(argv) < 2 or not os.path.basename(argv[0]).startswith("python"):
        return None
    rest = list(argv[1:])
    if rest[0] == "-m" and len(rest) > 1:
        return [argv[0], "-c", BOOT, *rest]
    if rest[0].startswith("-"):
        return None  # interpreter options before the script: left as they are
    return [argv[0], "-c", BOOT, *rest]
