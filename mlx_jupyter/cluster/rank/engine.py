"""`python -m mlx_jupyter.cluster.rank.engine`: an ipyparallel engine whose id is this process's MLX rank.

The launcher sets the environment contract (``MLX_RANK`` ...); this module
requests that rank as the engine id, turns off the per-engine nanny process
(our launcher watches the processes), starts its heart as soon as the hub answers its
registration (ipyparallel starts it only after building the kernel), and installs the rank agent
(:mod:`mlx_jupyter.cluster.rank.agent`) and connects the direct cell channel
(:mod:`mlx_jupyter.cluster.rank.channel`) once the engine's kernel exists. MLX's ring world is
begun only once the rank is up (the cluster asks for it after its start-up probe):
MLX's init holds the GIL and would stall the engine's registration.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Any, Iterator, Optional

from ipyparallel.engine.app import IPEngine

from mlx_jupyter.cluster.shared.connection_files import await_json_file
from mlx_jupyter.cluster.shared.ipp_compat import exit_unless_usable
from mlx_jupyter.cluster.rank import agent
from mlx_jupyter.cluster.rank import cell_runner, channel, debugger, sampler
from mlx_jupyter.vocab import rank_env


class MLXEngine(IPEngine):  # type: ignore[misc]  # ipyparallel ships no types
    """IPEngine with the rank agent installed after registration.

    An agent that could not be installed is reported by :func:`agent.agent_state`,
    which the cluster's start-up probe asks (start then fails naming the cause);
    an ipyparallel without ``complete_registration`` never calls it, which the probe
    reports too.
    """

    _terminated = False
    _heart_started = False

    def init_signal(self) -> None:
        super().init_signal()
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, sig: int, frame: object) -> None:
        """SIGTERM (our launcher's stop or restart): end the event loop; the process exits 0.

        ipyparallel's own handler logs a critical "received signal 15" and the stopped
        loop ends in a RuntimeError traceback and exit code 1: noise for a stop asked for.
        """
        self._terminated = True
        try:
            self.restore_output()  # what is printed from here on is not a cell's output
        except Exception:
            pass
        self.loop.add_callback_from_signal(self.loop.stop)

    def start(self) -> None:
        try:
            super().start()
        except RuntimeError:
            if not self._terminated:  # "Event loop stopped before Future completed": our stop
                raise

    def init_engine(self) -> None:
        # ipyparallel polls for the controller's connection file every 0.1 s (and warns);
        # engines start with the controller, so wait for it here, finely, first
        if not self.connection_info_env:
            self.find_connection_file()
            await_json_file(self.url_file, self.wait_for_url_file)
        super().init_engine()

    def start_heartbeat(self, *args: Any, **kwargs: Any) -> None:
        if self._heart_started:  # already beating: see _beat_early
            return
        self._heart_started = True
        super().start_heartbeat(*args, **kwargs)

    def _beat_early(self, msg: list[Any], maybe_tunnel: Any) -> None:
        """Start the heart before the kernel is built, not after: the hub lists an engine only
        at its heartbeat after the engine's first pong (one to two ``HeartMonitor.period``), so
        that wait now overlaps the build. Requests sent meanwhile queue in the engine's sockets
        (connected right after this, before the build) until the kernel reads them."""
        try:
            _, parts = self.session.feed_identities(msg)
            content = self.session.unpack(parts[4])  # [signature, header, parent, metadata, content]
            if content.get("status") != "ok":
                return  # ipyparallel's own handling reports the failure
            url = f"{self.connection_info['interface']}:{{}}".format
            self.start_heartbeat(maybe_tunnel(url(self.connection_info["hb_ping"])),
                                 maybe_tunnel(url(self.connection_info["hb_pong"])), content["hb_period"], self.bident)
        except Exception as exc:  # ipyparallel starts it after the build, as without this
            self.log.debug("could not start the heart early: %s", exc)

    async def complete_registration(self, msg: list[Any], connect: Any, maybe_tunnel: Any) -> None:
        self._beat_early(msg, maybe_tunnel)
        with without_debugpy():  # the kernel is built here
            await super().complete_registration(msg, connect, maybe_tunnel)
        if self.kernel is None:
            agent.AGENT_ERROR = "the engine has no kernel after registration"
            return
        try:  # the rank's environment, read once: every part of the rank side takes it from here
            env = rank_env.current()
            rank = self.id if self.id is not None else env.process_rank
            agent.install(self.kernel, rank, env)
            cell_runner.install(self.kernel)   # cells with top-level await through the controller
            sampler.install(self.kernel, rank)
        except Exception as exc:
            agent.AGENT_ERROR = f"{type(exc).__name__}: {exc}"
            self.log.error("the MLX rank agent could not be installed: %s", agent.AGENT_ERROR)
            return
        try:  # cells straight from the notebook; without it they come through the controller
            channel.start(self.kernel, rank, self.connection_info["interface"], env.cell_port)
            debugger.install()  # breakpoint() prompts in the notebook, over that channel
        except Exception as exc:
            channel.ERROR = f"{type(exc).__name__}: {exc}"
            self.log.warning("the direct cell channel could not be set up: %s", channel.ERROR)


@contextlib.contextmanager
def without_debugpy() -> Iterator[None]:
    """Build the engine's kernel without ipykernel's debugger: it needs a debug channel that
    ipyparallel engines do not have, and importing debugpy costs ~0.15 s of each rank's start.

    Only while the kernel is built: ``import debugpy`` in a cell still works.
    """
    if "debugpy" in sys.modules or "ipykernel.debugger" in sys.modules:
        yield
        return
    sys.modules["debugpy"] = None  # type: ignore[assignment]  # ipykernel.debugger: debugger unavailable
    try:
        yield
    finally:
        if "debugpy" in sys.modules and sys.modules["debugpy"] is None:
            del sys.modules["debugpy"]


def main(argv: Optional[list[str]] = None) -> None:
    exit_unless_usable("engine")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        rank = rank_env.current().process_rank
    except rank_env.RankEnvError as exc:
        sys.exit(f"mlx_jupyter engine: {exc}")
    pinned = [f"--IPEngine.id={rank}", "--IPEngine.enable_nanny=False"]
    MLXEngine.launch_instance(argv=pinned + argv)


if __name__ == "__main__":
    main()
