"""`TopologyWidget`: the cabling of a Mac cluster, drawn, diagnosed and acted on from a notebook.

The front end (`topology.js`, `topology.css` beside this file) draws the JSON model of
`topology_model.py`; actions (discover, apply setup, check cables, save hostfile, start a
cluster) run here, in the kernel, through the same `config` functions as `mlx-jupyter config`.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, TypedDict

import anywidget
import traitlets

from mlx_jupyter.topology import DiscoveryError, PlanError, Topology, TopologyError

from mlx_jupyter.configurator.runners import RecordingRunner, run_async
from .topology_model import topology_model

if TYPE_CHECKING:
    from mlx_jupyter.topology.addressing import SetupLine

HERE = Path(__file__).parent
ClusterFactory = Callable[[str, str], Any]  # (hostfile path, backend) -> an unstarted Cluster


def _default_cluster(hostfile: str, backend: str) -> Any:
    """A cluster for ``%%mlx_distributed`` (the widget says to use it): its messages use the magics' words."""
    from mlx_jupyter.cluster import Cluster
    from mlx_jupyter.cluster.restart_context import MAGICS

    return Cluster(n=1, hostfile=hostfile, backend=backend, context=MAGICS)


class _WidgetDiscoveryProgress:
    """`configurator.DiscoveryProgress`'s interface, reporting into the widget's status."""

    def __init__(self, widget: "TopologyWidget", total: int) -> None:
        self.widget, self.total, self.done = widget, total, 0

    def host_done(self, host: str, ok: bool) -> None:
        self.done += 1
        self.widget._report("discover", f"{host}: {'answered' if ok else 'unreachable'}",
                            done=self.done, total=self.total, busy=self.done < self.total)


class HostSetup(TypedDict):
    """One host's part of Apply setup: over ssh (auto) or by hand (manual), whether it worked, its errors, its
    commands and why it is left to the user."""

    mode: str
    ok: bool
    errors: list[str]
    commands: list[SetupLine]
    why: str


class _CheckProgress:
    """`configurator.measure.CableCheckProgress`: each measured cable moves the widget's progress bar."""

    def __init__(self, widget: "TopologyWidget") -> None:
        self.widget = widget

    def cable_done(self, result: Any, done: int, total: int) -> None:
        state = "failed" if result.error else "flagged" if result.flags else "ok"
        self.widget._report("check", f"{result.target.name}: {state}", busy=done < total, done=done, total=total)


class SetupNotAppliedWarning(UserWarning):
    """Check cables before this widget applied the setup: the cables may not have their addresses yet."""


def not_set_up_text(hosts: Sequence[str]) -> str:
    """``setup not applied here on a, b``."""
    return f"setup not applied here on {', '.join(hosts)}"


class TopologyWidget(anywidget.AnyWidget):
    """Hosts and cables as a graph, the backend choice with its reason, the address plan, and actions.

    Build it from a `Topology` (e.g. `Topology.from_recordings(folder)`), from recordings with
    `TopologyWidget.from_recordings(folder)`, or empty with `hosts=[...]` and press Discover.
    Check cables (after Apply setup) measures Gb/s each way and the round trip over every cable
    and marks the slow or lopsided ones (`check_cables`, `mlx-jupyter config --measure`).
    """

    _esm = HERE / "topology.js"
    _css = HERE / "topology.css"

    model = traitlets.Dict().tag(sync=True)
    hosts = traitlets.List(traitlets.Unicode()).tag(sync=True)
    backend = traitlets.Unicode("").tag(sync=True)  # "" = the best the cabling supports
    hostfile_path = traitlets.Unicode("hostfile.json").tag(sync=True)
    status = traitlets.Dict().tag(sync=True)  # {action, message, level, busy, done, total}
    setup_result = traitlets.Dict().tag(sync=True)  # host -> {mode, ok, errors, commands}

    def __init__(self, topology: Optional[Topology] = None, *, hosts: Optional[Sequence[str]] = None,
                 runner: Any = None, backend: Optional[str] = None, hostfile_path: str = "hostfile.json",
                 cluster_factory: Optional[ClusterFactory] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runner = runner
        self.cluster_factory = cluster_factory or _default_cluster
        self.cluster: Any = None
        self._topology: Optional[Topology] = None
        self._checks: dict[int, dict[str, Any]] = {}  # cable id -> the last cable check's annotation
        self.check_options: Any = None  # a `configurator.measure.CheckOptions`; None: the defaults
        self._lock = threading.Lock()
        self.hostfile_path = hostfile_path
        self.backend = backend or ""
        self.hosts = list(hosts or (topology.names if topology else []))
        self.status = {"action": "", "message": "", "level": "info", "busy": False, "done": 0, "total": 0}
        if topology is not None:
            self.topology = topology
        self.on_msg(self._on_front_end)

    @classmethod
    def from_recordings(cls, folder: str | Path, **kwargs: Any) -> "TopologyWidget":
        """A widget on a recorded cluster; Discover and Apply setup answer from the recordings."""
        runner = RecordingRunner(folder)
        return cls(Topology.from_recordings(folder), runner=runner, **kwargs)

    # -- the model ----------------------------------------------------------------------------

    @property
    def topology(self) -> Optional[Topology]:
        return self._topology

    @topology.setter
    def topology(self, topo: Topology) -> None:
        self._topology = topo
        self._checks = {}
        self._refresh()

    @traitlets.observe("backend")
    def _backend_changed(self, _change: Any) -> None:
        self._refresh()

    def _refresh(self) -> None:
        if self._topology is not None:
            self.model = topology_model(self._topology, self.backend or None, checks=self._checks)

    @property
    def choice(self) -> dict[str, Any]:
        """The backend part of the model: name, reason or error, ring, hostfile."""
        return dict(self.model.get("backend") or {})

    def _report(self, action: str, message: str, level: str = "info", busy: bool = False, **more: Any) -> None:
        self.status = {"action": action, "message": message, "level": level, "busy": busy,
                       "done": more.get("done", 0), "total": more.get("total", 0), "time": time.time()}

    # -- actions ------------------------------------------------------------------------------

    def _runner(self) -> tuple[Any, bool]:
        if self.runner is not None:
            return self.runner, False
        from mlx_jupyter.configurator import SSHRunner

        return SSHRunner(), True

    def discover(self, hosts: Optional[Sequence[str]] = None) -> Topology:
        """Run discovery over ssh (or the recordings) on `hosts`, with progress; unreachable hosts are left out."""
        from mlx_jupyter import configurator
        from mlx_jupyter.topology.commands import THUNDERBOLT_DISCOVERY

        names = list(dict.fromkeys(hosts or self.hosts))
        if not names:
            raise ValueError("no hosts to discover: pass hosts=[...] or type them in the widget")
        self.hosts = names
        self._report("discover", f"discovering {len(names)} hosts", busy=True, total=len(names))
        runner, own = self._runner()

        async def go() -> Any:
            try:
                return await configurator.discover(runner, names, THUNDERBOLT_DISCOVERY, _WidgetDiscoveryProgress(self, len(names)))
            finally:
                if own:
                    await runner.close()

        try:
            disc = run_async(go)
            reachable = [n for n in names if n not in disc.unreachable]
            if not reachable:
                raise DiscoveryError(names[0], "ssh", "no host is reachable")
            self.topology = Topology.from_outputs(reachable, disc.outputs, disc.sudo)
        except (DiscoveryError, TopologyError, OSError, TimeoutError) as exc:
            self._report("discover", f"discovery failed: {exc}", "error")
            raise
        if disc.unreachable:
            lost = "; ".join(f"{h}: {m}" for h, m in disc.unreachable.items())
            self._report("discover", f"left out unreachable hosts: {lost}", "error")
        else:
            self._report("discover", f"discovered {len(names)} hosts: {self.model['summary']}", "success")
        return self._topology  # type: ignore[return-value]

    def apply_setup(self, auto: bool = True, partial: bool = False) -> dict[str, HostSetup]:
        """Apply the address plan over ssh when every host has passwordless sudo (``partial``: on those
        that have it); the others get commands to copy, as `mlx-jupyter config --auto-setup`."""
        from mlx_jupyter import configurator

        topo = self._need_topology()
        commands = topo.setup_commands()
        allowed, why = configurator.hosts_to_set_up({h.name: h.sudo for h in topo.hosts}, auto, partial)
        result: dict[str, HostSetup] = {h.name: {"mode": "auto" if h.name in allowed else "manual", "ok": h.name in allowed,
                           "errors": [], "commands": commands[h.name], "why": why.get(h.name, "")}
                  for h in topo.hosts}
        if allowed:
            self._report("setup", f"setting up {', '.join(allowed)}", busy=True)
            runner, own = self._runner()

            async def go() -> dict[str, list[str]]:
                try:
                    return await configurator.apply_setup(runner, {h: commands[h] for h in allowed})
                finally:
                    if own:
                        await runner.close()

            for host, errors in run_async(go).items():
                result[host].update({"ok": False, "errors": errors})
        self.setup_result = result
        failed = [h for h, r in result.items() if r["mode"] == "auto" and not r["ok"]]
        manual = [h for h, r in result.items() if r["mode"] == "manual"]
        parts = [f"set up {len(allowed) - len(failed)} of {len(result)} hosts over ssh"]
        if manual:
            parts.append(f"run the commands shown on {', '.join(manual)} ({why[manual[0]]})")
        if failed:
            parts.append(f"failed on {', '.join(failed)}")
        self._report("setup", "; ".join(parts), "error" if failed else "success")
        return result

    def check_cables(self, options: Any = None) -> Any:
        """Measure every cable of the plan (Gb/s each way, round trip), draw the results on the cables.

        Run after Apply setup: the transfers use the plan's addresses. Returns the
        `topology.cablecheck.Report`; `options` is a `configurator.measure.CheckOptions`.
        """
        from mlx_jupyter.configurator import measure
        from mlx_jupyter.topology.cablecheck import targets

        topo = self._need_topology()
        cables = targets(topo)
        if not cables:
            self._report("check", "no cable between listed hosts to check", "error")
            raise ValueError("no cable between listed hosts to check")
        opts = options or self.check_options or measure.CheckOptions()
        unset = self.not_set_up()
        if unset:
            warnings.warn(SetupNotAppliedWarning(f"{not_set_up_text(unset)}; the check needs the plan's addresses on "
                                                 "every cable: Apply setup first, unless they are set up already"),
                          stacklevel=2)
        self._report("check", f"checking {len(cables)} cables" + (f" ({not_set_up_text(unset)})" if unset else ""),
                     "warning" if unset else "info", busy=True, total=len(cables))
        runner, own = self._runner()

        async def go() -> Any:
            try:
                return await measure.check(runner, cables, opts, _CheckProgress(self))
            finally:
                if own:
                    await runner.close()

        report = run_async(go, timeout=opts.budget + 60)
        self._checks = report.annotations()
        self._refresh()
        bad = [r.line() for r in report.results if not r.ok]
        more = f" (and {len(bad) - 1} more: hover a cable for its details)" if len(bad) > 1 else ""
        missing = unset and any(measure.NOT_SET_UP in (r.error or "") for r in report.failed)
        hint = f". {not_set_up_text(unset)}: press Apply setup, then Check cables" if missing else ""
        self._report("check", report.summary() + (f": {bad[0]}{more}" if bad else "") + hint,
                     "success" if report.ok else "error")
        return report

    def not_set_up(self) -> list[str]:
        """The hosts this widget has not set up (Apply setup not pressed, or it failed or was left to the user there)."""
        topo = self._need_topology()
        return [n for n in topo.names if not self.setup_result.get(n, {}).get("ok")]

    def save_hostfile(self, path: Optional[str | Path] = None, form: str = "object") -> Path:
        """Write the hostfile of the chosen backend, as `mlx-jupyter config --output-hostfile`
        (``form="list"``: the plain list MLX 0.29-0.31 read, as ``--hostfile-format list``)."""
        from mlx_jupyter.configurator.setup import hostfile_text

        choice = self.choice
        if not choice.get("hostfile"):
            msg = choice.get("error") or "no topology yet"
            self._report("save", f"no hostfile: {msg}", "error")
            raise PlanError(msg)
        target = Path(path or self.hostfile_path).expanduser().absolute()   # relative: the kernel's working dir
        text, notes = hostfile_text(choice["hostfile"], form)
        target.write_text(text)
        self.hostfile_path = str(path or self.hostfile_path)
        self._report("save", f"wrote {target} (backend {choice['name']}, {len(choice['hostfile']['hosts'])} hosts)"
                     + "".join(f"; {w}" for w in notes), "success")
        return target

    def start_cluster(self, timeout: Optional[float] = None) -> Any:
        """Save the hostfile, then start a cluster on it (one rank per host); also the `%%mlx_distributed` one."""
        path = self.save_hostfile()
        cluster = self.cluster_factory(str(path), self.choice["name"])
        self._report("start", f"wrote {path}; starting a cluster on it", busy=True)

        def progress(have: int, total: int) -> None:
            self._report("start", f"{have}/{total} ranks connected", busy=have < total, done=have, total=total)

        try:
            cluster.start(progress=progress, **({"timeout": timeout} if timeout else {}))
        except Exception as exc:
            self._report("start", f"the cluster did not start: {exc}", "error")
            raise
        self.cluster = cluster
        _make_current(cluster)
        self._report("start", f"{cluster.size} ranks ready ({self.choice['name']}) on hostfile {path}; "
                              "use %%mlx_distributed", "success")
        return cluster

    def _need_topology(self) -> Topology:
        if self._topology is None:
            raise ValueError("no topology yet: discover first")
        return self._topology

    # -- the front end's buttons ----------------------------------------------------------------

    def _on_front_end(self, _widget: Any, content: dict[str, Any], _buffers: Any) -> None:
        """Buttons send {"action": ...}; each runs in a thread so the kernel stays responsive."""
        actions: dict[str, Callable[[], object]] = {
            "discover": self.discover, "apply": self.apply_setup, "check": self.check_cables,
            "save": self.save_hostfile, "start": self.start_cluster}
        action = actions.get(content.get("action", ""))
        if action is None:
            return
        if not self._lock.acquire(blocking=False):
            self._report(content["action"], "another action is still running", "error")
            return

        def run() -> None:
            try:
                action()
            except Exception as exc:  # already reported where it is known; make sure it shows
                if self.status.get("level") != "error":
                    self._report(content["action"], f"{type(exc).__name__}: {exc}", "error")
            finally:
                self._lock.release()

        threading.Thread(target=run, name=f"mlx-topology-{content['action']}", daemon=True).start()


def _make_current(cluster: Any) -> None:
    """Let `%%mlx_distributed` use this cluster when the kernel has none running."""
    try:
        from mlx_jupyter import magics

        current = magics.current()
        if current is None or not current.running:
            magics.set_current(cluster)
    except Exception:
        pass
