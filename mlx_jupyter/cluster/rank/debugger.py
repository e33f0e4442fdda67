"""pdb on one rank, answered from the notebook over the cell channel.

``breakpoint()`` in a channel cell starts a :class:`RankPdb` whose output goes
to the notebook in ``dbg`` messages and whose input lines come back as
``dbg_in`` (see :mod:`mlx_jupyter.cluster.shared.wire`). The cell runs on the
engine's main thread, which is then blocked anyway: the lines are read from the
channel's socket right there (:meth:`RankChannel.wait_debug_line`), cells that
arrive meanwhile are queued as usual. Ctrl-C (the stop button's abort) ends the
session and interrupts the cell. A cell that came through the controller (a
connected notebook's) talks through a :class:`ControlPort` instead: its notebook
asks for pdb's output and sends its lines with ``mlx_debug_request`` on the
control channel (answered on the kernel's control thread while the cell blocks).
A front end that cannot prompt, or a controller cell whose sender never asks
(``%px``, ``Cluster.execute``), gets one line and the cell goes on.
"""

from __future__ import annotations

import io
import pdb
import pprint
import re
import sys
import sysconfig
from typing import Any, Optional, Protocol

from mlx_jupyter.cluster.rank import debug_control
from mlx_jupyter.cluster.rank.debug_control import ControlPort as ControlPort, control_port
from mlx_jupyter.where import sample


class DebugPort(Protocol):
    """What a pdb session talks through: the cell channel (:class:`~.channel.RankChannel`) or a :class:`ControlPort`."""

    @property
    def rank(self) -> int | str: ...
    def post(self, msg: dict[str, Any]) -> None: ...
    def wait_debug_line(self) -> Optional[str]: ...  # None: nobody can answer
    def drop_debug_lines(self) -> None: ...


class _Output(io.TextIOBase):
    """pdb's stdout: text kept until the next prompt (or the session's end) sends it."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)

    def take(self) -> str:
        text, self.parts = "".join(self.parts), []
        return text


class _Input:
    """pdb's stdin: each line asked of the notebook, or ``fallback`` when it cannot answer."""

    def __init__(self, debugger: "RankPdb"):
        self.debugger = debugger

    def readline(self) -> str:
        return self.debugger.ask()


#: packages whose frames pdb steps over, with the standard library's: the kernel and our rank side
#: run between a cell's statements (IPython runs each as its own code object), so that ``n`` at the
#: end of one goes to the next statement, not into the kernel
SKIP = ["IPython.*", "ipykernel.*", "ipyparallel.*", "tornado.*", "traitlets.*", "zmq.*", "jupyter_client.*",
        "mlx_jupyter.cluster.*"]
_STDLIB = sysconfig.get_paths()["stdlib"]


def _in_stdlib(module_name: str) -> bool:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None) or ""
    return path.startswith(_STDLIB) and "site-packages" not in path


#: IPython's output cache and input history names (``_``, ``_i3``, ``_12``): the kernel's, not the user's
_IPYTHON_CACHE = re.compile(r"_{1,3}|_i{1,3}|_i?\d+|_(?:ih|oh|dh)")
#: what IPython binds in every namespace, for when its own list (``user_ns_hidden``) cannot be read
_IPYTHON_NAMES = frozenset(("In", "Out", "exit", "quit", "get_ipython"))


def user_names(ns: dict[str, Any]) -> dict[str, Any]:
    """``ns`` without what IPython put in a cell's namespace (``In``, ``Out``, ``exit``, ``_ih``, ``_i3``,
    dunders): what the user defined (and ``mx``/``world``/``group``, which the product gave them)."""
    try:
        from IPython import get_ipython

        hidden = getattr(get_ipython(), "user_ns_hidden", {}) or {}
    except Exception:
        hidden = {}
    return {k: v for k, v in ns.items()
            if not (k.startswith("__") and k.endswith("__")) and not _IPYTHON_CACHE.fullmatch(k)
            and not (k in hidden and hidden[k] is v) and not (not hidden and k in _IPYTHON_NAMES)}


class UserNamesPdb(pdb.Pdb):
    """pdb whose ``p locals()`` (``pp``, ``vars()``, ``globals()``) in a cell's own frame shows the user's names,
    not the ~25 IPython puts there; everything else is pdb's."""

    _WHOLE = ("locals()", "vars()", "globals()")

    def _user_view(self, arg: str) -> Optional[dict[str, Any]]:
        frame = getattr(self, "curframe", None)
        if arg.strip() not in self._WHOLE or frame is None:
            return None
        ns = frame.f_globals if arg.strip() == "globals()" else self.curframe_locals
        if ns is not frame.f_globals:   # a function's locals are all the user's
            return None
        return user_names(ns)

    def do_p(self, arg: str) -> None:
        view = self._user_view(arg)
        if view is None:
            super().do_p(arg)
            return
        self.message(repr(view))

    def do_pp(self, arg: str) -> None:
        view = self._user_view(arg)
        if view is None:
            super().do_pp(arg)
            return
        self.message(pprint.pformat(view))


class RankPdb(UserNamesPdb):
    """A pdb whose prompt is labelled with the rank and answered by the notebook."""

    def __init__(self, channel: DebugPort, cell_id: str, fallback: str = "c"):
        self.out = _Output()
        # pdb reads only readline() of its stdin and writes to its stdout: ours are no IO[str]
        super().__init__(stdin=_Input(self), stdout=self.out, skip=SKIP, nosigint=True)  # type: ignore[arg-type]
        self.use_rawinput = False
        self.channel = channel
        self.cell_id = cell_id
        self.rank = channel.rank
        channel.drop_debug_lines()  # a line typed as an earlier session was being aborted is not for this one
        self.prompt = f"(Pdb rank {self.rank}) "
        self.fallback = fallback
        self.unanswered = False
        self.post_mortem = False  # %mlx_debug's session on a traceback (the where table says so)

    def is_skipped_module(self, module_name: str) -> bool:
        return bool(module_name) and (super().is_skipped_module(module_name) or _in_stdlib(module_name))

    def user_call(self, frame: Any, argument_list: Any) -> None:
        if frame.f_code.co_name != "<module>":  # a cell's next statement: stop at its line, not its call
            super().user_call(frame, argument_list)

    def user_return(self, frame: Any, return_value: Any) -> None:
        if frame.f_code.co_name != "<module>":  # the end of a cell's statement: go on to the next one
            super().user_return(frame, return_value)

    def ask(self) -> str:
        """Send what pdb wrote and its prompt; wait (no timeout: Ctrl-C ends it) for the line."""
        text = self.out.take()
        if text.endswith(self.prompt):
            text = text[: -len(self.prompt)]
        if self.unanswered:
            return self.fallback + "\n"
        # "in pdb" while it waits, at the frame where the rank stopped (not the one `up` shows); said before the
        # prompt goes out, so that a where asked as soon as the prompt shows finds it
        stack = getattr(self, "stack", None)
        sample.set_debugger(stack[-1][0] if stack else getattr(self, "curframe", None), self.post_mortem)
        try:
            self.channel.post({"t": "dbg", "id": self.cell_id, "text": text, "prompt": self.prompt})
            line = self.channel.wait_debug_line()
        finally:
            sample.set_debugger(None)
        if line is None:  # the notebook cannot prompt: said there, once
            self.unanswered = True
            return self.fallback + "\n"
        return line.rstrip("\n") + "\n"

    def flush_output(self, done: bool = False) -> None:
        """Send what pdb wrote after its last prompt; ``done``: the session ends (the notebook may
        then open another rank's)."""
        text = self.out.take()
        if text or done:
            self.channel.post({"t": "dbg", "id": self.cell_id, "text": text, "prompt": None, "done": done})

    def set_continue(self) -> None:
        super().set_continue()
        if not self.breaks:  # pdb stops tracing: this session is over
            self.flush_output(done=True)

    def set_quit(self) -> None:
        super().set_quit()
        self.flush_output(done=True)

    def _cmdloop(self) -> None:  # pdb's own swallows KeyboardInterrupt: here it ends the session
        try:
            self.allow_kbdint = True
            self.cmdloop()
            self.allow_kbdint = False
        except KeyboardInterrupt:
            self.out.write("--KeyboardInterrupt-- (the debug session ended)\n")
            self.set_quit()
            raise
        self.flush_output()


def _cell_id(kernel: Any) -> str:
    """The id of the channel cell running now ('' when the cell came through the controller)."""
    from mlx_jupyter.cluster.shared.wire import CHANNEL_SESSION

    header = (kernel.get_parent() or {}).get("header", {}) if kernel is not None else {}
    return str(header.get("msg_id", "")) if header.get("session") == CHANNEL_SESSION else ""


def _channel_and_cell() -> tuple[Optional[DebugPort], str]:
    from mlx_jupyter.cluster.rank import channel as channel_mod

    chan = channel_mod.CHANNEL
    if chan is None or not chan.connected.is_set():
        return None, ""
    return chan, _cell_id(chan.kernel)


#: said (the same on every rank, so that it is shown once) where a breakpoint cannot prompt
SKIPPED = ("breakpoint() skipped: this cell came through the controller, not the notebook's cell channel (a "
           "connected notebook, %px, or beside a --noblock request), so no prompt can reach a notebook; "
           "after an error, %mlx_debug --all -c \"p x\" works from anywhere")
def _controller_cell() -> str:
    """The request id of the cell running now when it came through the controller, else ''."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        header = (kernel.get_parent() or {}).get("header", {}) if kernel is not None else {}
    except Exception:
        return ""
    from mlx_jupyter.cluster.shared.wire import CHANNEL_SESSION

    return str(header.get("msg_id", "")) if header.get("msg_type") == "execute_request" and \
        header.get("session") != CHANNEL_SESSION else ""


def _session_ends() -> tuple[Optional[DebugPort], str]:
    """What a pdb session talks through (the cell channel, or a controller cell's port) and the cell's id."""
    chan, cell_id = _channel_and_cell()
    if chan is not None and cell_id:
        return chan, cell_id
    cell = _controller_cell() if _HANDLER_INSTALLED else ""
    return (control_port(cell), cell) if cell else (None, "")


def breakpointhook(*args: Any, **kwargs: Any) -> None:
    """``sys.breakpointhook`` on a rank: a :class:`RankPdb` at the caller's frame."""
    chan, cell_id = _session_ends()
    if chan is None or not cell_id:
        print(SKIPPED, file=sys.stderr)
        return
    RankPdb(chan, cell_id).set_trace(sys._getframe(1))


_HANDLER_INSTALLED = False


def install() -> None:
    """Make ``breakpoint()`` and ``pdb.set_trace()`` on this rank open a :class:`RankPdb`; answer
    ``mlx_debug_request`` (the rank's sampler, installed first, names the kernel and the rank)."""
    global _HANDLER_INSTALLED
    sys.breakpointhook = breakpointhook
    pdb.set_trace = lambda *, header=None: breakpointhook_at(sys._getframe(1), header)
    from mlx_jupyter.cluster.rank import sampler

    if sampler.SAMPLER is not None:
        debug_control.answer_requests(sampler.SAMPLER.kernel, sampler.SAMPLER.rank)
        _HANDLER_INSTALLED = True


def breakpointhook_at(frame: Any, header: Optional[str] = None) -> None:
    chan, cell_id = _session_ends()
    if chan is None or not cell_id:
        print(SKIPPED, file=sys.stderr)
        return
    debugger = RankPdb(chan, cell_id)
    if header:
        debugger.message(header)
    debugger.set_trace(frame)


def post_mortem(commands: str = "", grouped: bool = False) -> None:
    """pdb on this rank's last traceback (``sys.last_traceback``), in the frame that raised.

    ``commands``: ``;``-separated pdb commands, run without prompting, then quit. ``grouped``
    (``%mlx_debug --all``): their output as alike on every rank as it can be (``(Pdb)``, ``<cell>``),
    so that the notebook groups the ranks that agree.
    """
    tb = getattr(sys, "last_traceback", None)
    chan, cell_id = _session_ends()
    rank = getattr(chan, "rank", "?")
    if tb is None:
        print(f"rank {rank}: no traceback to debug (no cell has raised on this rank)")
        return
    if commands:
        script = "".join(c.strip() + "\n" for c in commands.split(";") if c.strip()) + "q\n"
        # whole lines only: no one answers the prompt, so "(Pdb) " waits for its echoed command (a prompt alone
        # would be shown as an unfinished line, and the ranks' lines could no longer be grouped)
        out = _WholeLines(_CellNamed(sys.stdout) if grouped else sys.stdout)
        debugger = UserNamesPdb(stdin=_Script(script, out), stdout=out, nosigint=True)  # type: ignore[arg-type]  # as in RankPdb
        debugger.use_rawinput = False
        debugger.prompt = "(Pdb) " if grouped else f"(Pdb rank {rank}) "
    elif chan is None or not cell_id:
        print(f"rank {rank}: cannot prompt from here; use %mlx_debug {rank} -c \"p locals(); where\"")
        return
    else:
        debugger = RankPdb(chan, cell_id, fallback="q")
        debugger.post_mortem = True
    debugger.reset()
    try:
        debugger.interaction(None, tb)  # pdb shows the frame that raised
    finally:
        if isinstance(debugger.stdout, _WholeLines):
            debugger.stdout.end()


class _Script:
    """Non-interactive pdb's stdin: the given lines, each echoed after its prompt as a terminal would."""

    def __init__(self, script: str, out: Any = None):
        self.lines = script.splitlines(keepends=True)
        self.out = out

    def readline(self) -> str:
        line = self.lines.pop(0) if self.lines else "q\n"
        (self.out or sys.stdout).write(line)
        return line


#: a cell's file as this rank's kernel names it (its pid in the folder): the same cell on every rank
_CELL_FILE = re.compile(r"\S*ipykernel_\d+/\d+\.py")


class _CellNamed(io.TextIOBase):
    """A stream writing to ``out`` with the kernel's cell file names written ``<cell>``."""

    def __init__(self, out: Any):
        self.out = out

    def write(self, text: str) -> int:
        self.out.write(_CELL_FILE.sub("<cell>", text))
        return len(text)

    def flush(self) -> None:
        self.out.flush()


class _WholeLines(io.TextIOBase):
    """A stream passing ``out`` whole lines only; what is left unfinished is written by :meth:`end`."""

    def __init__(self, out: Any):
        self.out = out
        self.held = ""

    def write(self, text: str) -> int:
        lines, _, self.held = (self.held + text).rpartition("\n")
        if lines or _:
            self.out.write(lines + "\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def end(self) -> None:
        """Write what is left and flush."""
        held, self.held = self.held, ""
        if held:
            self.out.write(held)
        self.out.flush()
