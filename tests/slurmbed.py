"""A real Slurm cluster on one machine: slurmctld here, one slurmd per network namespace, munge.

    python tests/slurmbed.py up [--nodes 4] [--cpus 2] [--dir DIR]   # then: export SLURM_CONF=DIR/slurm.conf
    python tests/slurmbed.py status [--dir DIR]
    python tests/slurmbed.py down [--dir DIR]

Node ``nodeI`` is host ``hI`` of the namespace test bed (``testbed.py``, no sshd):
its own network namespace, address ``10.201.K.1I`` on a private bridge and hostname.
slurmctld runs in the root network namespace, bound to the bridge's address
``10.201.K.1`` only, on port ``16000 + K``; K is per bed, so concurrent beds do
not collide. One munged (its own key and socket) serves every daemon: a
pathname socket is reachable from any network namespace. Everything lives
under DIR; ``down`` kills every daemon and job, removes the namespaces and DIR.
Needs root, Debian's slurmctld, slurmd, slurm-client and munge (22.05 tested),
iproute2 and util-linux (unshare, nsenter).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from testbed import TestBed, _run  # noqa: E402

DEFAULT_DIR = Path("/tmp/mlx-jupyter-slurmbed")
TOOLS = ("slurmctld", "slurmd", "munged", "mungekey", "scontrol", "sinfo", "srun", "sbatch", "squeue", "scancel",
         "unshare", "nsenter", "mount", "ip")
CTL_NAME = "ctl"
START_TIMEOUT = 30.0   # each daemon's readiness probe is bounded by this


def missing_requirements() -> Optional[str]:
    """Why the Slurm bed cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm test bed needs root"
    for tool in TOOLS:
        if shutil.which(tool) is None and not os.access(f"/usr/sbin/{tool}", os.X_OK):
            return (f"the Slurm test bed needs {tool!r} "
                    "(apt-get install slurmctld slurmd slurm-client munge iproute2 util-linux)")
    return None


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def slurm_conf(*, cluster: str, ctl_addr: str, port: int, root: Path, munge_socket: Path,
               nodes: list[tuple[str, str]], cpus: int) -> str:
    """slurm.conf for the bed; each setting says why it is there."""
    lines = [
        f"ClusterName={cluster}",
        # The controller's name is its hostname in its own UTS namespace; the address is the bridge's, so
        # that slurmds in the namespaces reach it. NoCtldInAddrAny binds it to that address only (it
        # resolves "ctl" through the /etc/hosts bind-mounted in its mount namespace).
        f"SlurmctldHost={CTL_NAME}({ctl_addr})",
        f"SlurmctldPort={port}",
        "CommunicationParameters=NoCtldInAddrAny",
        "SlurmdPort=6818",   # the same in every namespace: each slurmd has its own network stack
        "SlurmUser=root",    # the bed runs as root; no slurm user account needed
        "SlurmdUser=root",
        # Our own munged (key and socket under the bed's dir), for requests and job credentials.
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        # Every path under the bed's dir; %n is the node name, so that the slurmds (all on one
        # filesystem) have their own spool, pid file and log.
        f"StateSaveLocation={root}/ctld/state",
        f"SlurmctldPidFile={root}/ctld/slurmctld.pid",
        f"SlurmctldLogFile={root}/ctld/slurmctld.log",
        f"SlurmdSpoolDir={root}/%n/spool",
        f"SlurmdPidFile={root}/%n/slurmd.pid",
        f"SlurmdLogFile={root}/%n/slurmd.log",
        # Each node's own temporary storage: the nodes share this machine's /tmp, where two slurmstepds of one
        # step would create the same PMIx directory (srun --mpi=pmix fails with "File exists").
        f"TmpFS={root}/%n/tmp",
        f"PlugStackConfig={root}/plugstack.conf",   # empty: no site SPANK plugins from /etc/slurm
        "MailProg=/bin/true",                       # no mail program on CI machines
        # No cgroups: tasks are tracked through their process tree and left unconfined, which works in
        # a namespace and on any cgroup layout (slurmd still loads its cgroup plugin: cgroup.conf).
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        # Cores are the resource; jobs may share a node (as on real clusters), memory is not tracked.
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # The node's configured CPUs count even on a machine with fewer cores (CI has 2 for all nodes).
        "SlurmdParameters=config_overrides",
        # FIFO: a job waits with reason Resources or Priority and starts as soon as nodes free up.
        "SchedulerType=sched/builtin",
        # A node that was DOWN (cut, killed) is back in service as soon as its slurmd registers again.
        "ReturnToService=2",
        # Quick failure detection for tests: nodes are pinged every SlurmdTimeout/3 s and set DOWN
        # (their jobs NODE_FAIL) after SlurmdTimeout s of silence; MessageTimeout bounds each RPC.
        # Not shorter: on a loaded 2-core CI machine a busy slurmd must not be taken for dead.
        "SlurmdTimeout=8",
        "MessageTimeout=4",
        "KillWait=2",          # SIGTERM -> SIGKILL when a job ends (time limit, scancel): 2 s, not 30
        "InactiveLimit=0",     # an allocation without a live srun/salloc is kept (ours are scancel'ed)
        "MinJobAge=300",       # finished jobs stay visible to squeue --states=all for 5 minutes
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for name, addr in nodes:
        lines.append(f"NodeName={name} NodeAddr={addr} CPUs={cpus} State=UNKNOWN")
    names = ",".join(n for n, _ in nodes)
    lines.append(f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


# slurmd 22.05 always loads a cgroup plugin. On a cgroup v2 machine the v2 plugin would talk to
# systemd over D-Bus to place slurmstepd; IgnoreSystemd makes it do without (no D-Bus in a test bed).
CGROUP_CONF = "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n"


class SlurmBed:
    """``up()`` a Slurm cluster of ``n`` nodes with ``cpus`` CPUs each; ``down()`` removes it all."""

    __test__ = False

    def __init__(self, root: Path, n: int = 4, cpus: int = 2, k: Optional[int] = None):
        self.root = Path(root)
        self.n, self.cpus = n, cpus
        self.net = TestBed(self.root / "net", n=n, sshd=False, k=k)
        self.k = self.net.k
        self.port = 16000 + self.k
        self.ctl_addr = f"{self.net.net}.1"
        self.nodes = [f"node{i}" for i in range(1, n + 1)]
        self.conf = self.root / "slurm.conf"
        self.munge_dir = self.root / "munge"
        self.munge_socket = self.munge_dir / "munge.socket"
        self.pids: dict[str, int] = {}
        self._procs: list[subprocess.Popen] = []   # started by this process: reaped in down()

    # ---------------------------------------------------------------- use --
    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs to talk to this bed."""
        return {"SLURM_CONF": str(self.conf)}

    def addr(self, i: int) -> str:
        """Node i's address (1-based)."""
        return self.net.ips[i - 1]

    def slurm(self, *argv: str, timeout: float = 20, check: bool = True) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this bed."""
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, **self.env()})
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
        return res

    def node_states(self) -> dict[str, str]:
        """Node -> sinfo state (``idle``, ``allocated``, ``down*``...)."""
        out = self.slurm("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if len(line.split()) == 2)

    def wait_idle(self, nodes: Optional[list[str]] = None, timeout: float = START_TIMEOUT) -> None:
        """Return once ``nodes`` (default all) are idle; raise naming the others."""
        want = nodes or self.nodes
        states = _probe(lambda: self.node_states(), lambda s: all(s.get(n) == "idle" for n in want), timeout)
        bad = {n: states.get(n, "missing") for n in want if states.get(n) != "idle"}
        if bad:
            raise RuntimeError(f"Slurm nodes not idle after {timeout:g} s: {bad}; see {self.root}/node*/slurmd.log")

    def cut(self, i: int) -> None:
        """Pull node i's cable (silence: its slurmd and tasks keep running)."""
        self.net.cut(i)

    def heal(self, i: int) -> None:
        """Plug node i back in and restart its slurmd, so that it registers (back in service) at once."""
        self.net.heal(i)
        self.restart_slurmd(i)

    def restart_slurmd(self, i: int) -> None:
        """Kill node i's processes (slurmd, steps, tasks) and start its slurmd again; wait for idle."""
        self.net.kill_host_procs(i, keep_sshd=False)
        self._start_slurmd(i)
        self.wait_idle([self.nodes[i - 1]])

    # ----------------------------------------------------------------- up --
    def up(self) -> "SlurmBed":
        """Namespaces, munged, slurmctld, slurmds; return once every node is idle."""
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self) -> None:
        self.net.up()
        if not _port_free(self.ctl_addr, self.port):
            raise RuntimeError(f"port {self.port} on {self.ctl_addr} is taken: slurmctld cannot listen there")
        for d in ("ctld/state", *(f"{n}/{sub}" for n in self.nodes for sub in ("spool", "tmp"))):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._start_munged()
        (self.root / "plugstack.conf").write_text("")
        (self.root / "cgroup.conf").write_text(CGROUP_CONF)
        (self.root / "hosts").write_text(f"127.0.0.1 localhost\n{self.ctl_addr} {CTL_NAME}\n")
        self.conf.write_text(slurm_conf(
            cluster=f"mj{self.k}", ctl_addr=self.ctl_addr, port=self.port, root=self.root,
            munge_socket=self.munge_socket, nodes=[(n, self.addr(i + 1)) for i, n in enumerate(self.nodes)],
            cpus=self.cpus))
        self._start_slurmctld()
        for i in range(1, self.n + 1):
            self._start_slurmd(i)
        self.wait_idle()
        self._save()

    def _spawn(self, name: str, argv: list[str]) -> int:
        log = open(self.root / f"{name}.out", "ab")
        with log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    start_new_session=True, env={**os.environ, **self.env()})
        self.pids[name] = proc.pid
        self._procs.append(proc)
        return proc.pid

    def _start_munged(self) -> None:
        self.munge_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = self.munge_dir / "munge.key"
        _run([_tool("mungekey"), "--create", "--bits=1024", f"--keyfile={key}"])
        # -f: our socket's dir is under /tmp, whose permissions munged would otherwise refuse
        self._spawn("munged", [_tool("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={self.munge_dir}/munged.pid",
                               f"--seed-file={self.munge_dir}/munged.seed", f"--log-file={self.munge_dir}/munged.log"])
        _probe(self.munge_socket.exists, bool, START_TIMEOUT)
        if not self.munge_socket.exists():
            raise RuntimeError(f"munged did not create {self.munge_socket}; see {self.root}/munged.out")

    def _start_slurmctld(self) -> None:
        # its own UTS namespace (hostname "ctl") and mount namespace (/etc/hosts naming ctl's address)
        script = 'mount --bind "$0" /etc/hosts && hostname "$1" && exec "$2" -D -f "$3"'
        self._spawn("slurmctld", ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script,
                                  str(self.root / "hosts"), CTL_NAME, _tool("slurmctld"), str(self.conf)])
        up = _probe(lambda: self.slurm("scontrol", "ping", check=False).stdout, lambda s: " is UP" in s,
                    START_TIMEOUT)
        if " is UP" not in up:
            raise RuntimeError(f"slurmctld is not up after {START_TIMEOUT:g} s: {up.strip()}; "
                               f"see {self.root}/ctld/slurmctld.log")

    def _start_slurmd(self, i: int) -> None:
        """slurmd -N nodeI in host i's network namespace with hostname nodeI.

        nsenter --net, not ``ip netns exec``: the latter remounts /sys, hiding the cgroup
        filesystem that slurmd's cgroup plugin insists on finding at start-up.
        """
        name = self.nodes[i - 1]
        script = 'hostname "$0" && exec "$1" -D -f "$2" -N "$0"'
        self._spawn(name, ["nsenter", f"--net=/run/netns/{self.net.ns(i)}", "unshare", "--uts", "sh", "-c", script,
                           name, _tool("slurmd"), str(self.conf)])

    def _save(self) -> None:
        state = {"k": self.k, "n": self.n, "cpus": self.cpus, "pids": self.pids}
        (self.root / "bed.json").write_text(json.dumps(state))

    @classmethod
    def load(cls, root: Path) -> "SlurmBed":
        """The bed that ``up`` left in ``root`` (for ``down`` from another process)."""
        state = json.loads((Path(root) / "bed.json").read_text())
        bed = cls(root, n=state["n"], cpus=state["cpus"], k=state["k"])
        bed.pids = {k: int(v) for k, v in state["pids"].items()}
        return bed

    # --------------------------------------------------------------- down --
    def down(self) -> None:
        """Kill every job and daemon, remove the namespaces, the bridge and the bed's dir."""
        self.net.down()      # SIGKILLs everything in the namespaces: slurmds, slurmstepds, tasks
        for name in ("slurmctld", "munged"):
            pid = self.pids.get(name)
            if pid is not None and _ours(pid, self.root):
                _kill_group(pid)
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """Anything of this bed still present."""
        found = self.net.leftovers()
        found += [f"{name} (pid {pid})" for name, pid in self.pids.items() if _alive(pid)]
        if self.root.exists():
            found.append(str(self.root))
        return found


def _probe(read, ok, timeout: float):
    """Call ``read()`` every 0.1 s until ``ok(value)`` or ``timeout``; return the last value."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        try:
            value = read()
        except (OSError, subprocess.SubprocessError) as exc:
            value = str(exc)
        if ok(value) or time.monotonic() > deadline:
            return value
        pause.wait(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie child of this process (the bed was started here) is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _ours(pid: int, root: Path) -> bool:
    """Whether ``pid`` still runs a command of this bed (not a reused pid)."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return str(root) in cmd


def _kill_group(pid: int, timeout: float = 5.0) -> None:
    """SIGTERM the daemon's process group (it leads its own session), SIGKILL it if still alive after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        if not _probe(lambda: _alive(pid), lambda alive: not alive, wait):
            return


def _port_free(addr: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((addr, port))
        except OSError:
            return False
    return True


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="slurmbed", description="A Slurm cluster on this machine (root).")
    p.add_argument("action", choices=("up", "down", "status"))
    p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help=f"where the bed lives (default {DEFAULT_DIR})")
    p.add_argument("--nodes", type=int, default=4, help="number of nodes (default 4)")
    p.add_argument("--cpus", type=int, default=2, help="CPUs per node (default 2)")
    args = p.parse_args(argv)
    state = args.dir / "bed.json"
    if args.action == "up":
        if why := missing_requirements():
            print(f"slurmbed: {why}", file=sys.stderr)
            return 1
        if state.exists():
            print(f"slurmbed: a bed is already up in {args.dir}; run `down` first", file=sys.stderr)
            return 1
        if args.dir.exists() and any(args.dir.iterdir()):
            print(f"slurmbed: {args.dir} exists and is not empty; give another --dir", file=sys.stderr)
            return 1
        bed = SlurmBed(args.dir, n=args.nodes, cpus=args.cpus).up()
        print(f"export SLURM_CONF={bed.conf}")
        print(f"# {args.nodes} nodes up ({', '.join(bed.nodes)}); try: SLURM_CONF={bed.conf} sinfo", file=sys.stderr)
        return 0
    if not state.exists():
        print(f"slurmbed: no bed in {args.dir}", file=sys.stderr)
        return 1 if args.action == "status" else 0
    bed = SlurmBed.load(args.dir)
    if args.action == "status":
        print(bed.slurm("sinfo", "-N", check=False).stdout, end="")
        return 0
    bed.down()
    left = bed.leftovers()
    if left:
        print(f"slurmbed: left behind: {left}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
