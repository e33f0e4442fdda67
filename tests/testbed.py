"""A throwaway multi-host cluster on one machine for tests: network namespaces + real sshd.

Each host ``hI`` is a network namespace with its own ``eth0`` on a private
bridge, its own IP (``10.201.K.1I``), hostname and OpenSSH server on port 22.
Each host's PATH starts with its own, normally empty, ``bin`` directory
(``host_bin(i)``): tests drop command shims there to make a host look like
another machine (a Mac, say) and empty it afterwards.
Names carry a per-run prefix (``mjK``) and subnet ``10.201.K.0/24`` so that
concurrent runs do not collide. Traffic stays on this machine: a guard route
makes the subnet unreachable, not routed, whenever a host is missing.
Needs root, iproute2, util-linux ``unshare`` and openssh-server.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

SSHD = "/usr/sbin/sshd"
GUARD_METRIC = 4243
TIMEOUT = 20  # every helper command is bounded by this


def missing_requirements() -> Optional[str]:
    """Why the test bed cannot run here, or None."""
    if os.geteuid() != 0:
        return "the namespace test bed needs root"
    for tool in ("ip", "unshare", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"the namespace test bed needs {tool!r} (apt-get install iproute2 util-linux openssh-client)"
    if not os.access(SSHD, os.X_OK):
        return f"the namespace test bed needs {SSHD} (apt-get install openssh-server)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, timeout=TIMEOUT)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.decode().strip()}"
    return None


def _run(argv: Sequence[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT, **kw)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}): {res.stderr.strip()}")
    return res


def _free_subnet() -> int:
    """A third octet K such that 10.201.K.0/24 and the prefix mjK are unused."""
    routes = _run(["ip", "-o", "route", "show", "table", "all"]).stdout
    links = _run(["ip", "-o", "link", "show"]).stdout
    nets = _run(["ip", "netns", "list"]).stdout
    start = os.getpid() % 200 + 20
    for k in [*range(start, 250), *range(20, start)]:
        if f"10.201.{k}." not in routes and f"mj{k}-" not in links and f"mj{k}-" not in nets:
            return k
    raise RuntimeError("no free 10.201.K.0/24 subnet for the test bed")


class TestBed:
    """``up()`` n hosts, use ``ips`` / ``ssh_options()``, inject ``cut``/``heal``, then ``down()``."""

    __test__ = False  # not a pytest test class

    def __init__(self, root: Path, n: int = 4, sshd: bool = True, k: Optional[int] = None):
        self.root = Path(root)
        self.n = n
        self.sshd = sshd    # False: the namespaces and their network only (the Slurm bed runs its own daemons)
        self.k = _free_subnet() if k is None else k   # an existing bed's K: to take it down from another process
        self.prefix = f"mj{self.k}"
        self.net = f"10.201.{self.k}"
        self.ips = [f"{self.net}.{10 + i}" for i in range(1, n + 1)]
        self.names = [f"h{i}" for i in range(1, n + 1)]
        self.bridge = f"{self.prefix}-br"
        self.key = self.root / "ssh" / "id_ed25519"
        self.known_hosts = self.root / "ssh" / "known_hosts"
        self._sshd: dict[int, subprocess.Popen] = {}
        self._drains: list[threading.Thread] = []

    # ---------------------------------------------------------------- names --
    def ns(self, i: int) -> str:
        """Namespace of host i (1-based)."""
        return f"{self.prefix}-h{i}"

    def veth(self, i: int) -> str:
        """Root-side veth of host i."""
        return f"{self.prefix}-h{i}-v"

    def host_bin(self, i: int) -> Path:
        """Directory first on host i's PATH (empty unless a test puts shims there)."""
        return self.root / f"h{i}" / "bin"

    # ------------------------------------------------------------------- up --
    def up(self) -> "TestBed":
        """Create the bridge, the hosts and their sshds; return when every sshd listens."""
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def _up(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if self.sshd:
            (self.root / "ssh").mkdir(parents=True, exist_ok=True)
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "testbed-client", "-f", str(self.key)])
            shutil.copy(f"{self.key}.pub", self.root / "ssh" / "authorized_keys")
            self.known_hosts.write_text("")
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privsep dir; shared, left in place
        _run(["ip", "route", "replace", "unreachable", f"{self.net}.0/24", "metric", str(GUARD_METRIC)])
        _run(["ip", "link", "add", self.bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
        _run(["ip", "addr", "add", f"{self.net}.1/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for i in range(1, self.n + 1):
            self._make_host(i)
        for i in range(1, self.n + 1 if self.sshd else 1):
            self._start_sshd(i)

    def _make_host(self, i: int) -> None:
        ns, tmp = self.ns(i), f"{self.prefix}t{i}"
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", self.veth(i), "type", "veth", "peer", "name", tmp])
        _run(["ip", "link", "set", tmp, "netns", ns])
        _run(["ip", "link", "set", self.veth(i), "master", self.bridge, "up"])
        _run(["ip", "-n", ns, "link", "set", tmp, "name", "eth0"])
        _run(["ip", "-n", ns, "addr", "add", f"{self.ips[i - 1]}/24", "dev", "eth0"])
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        d = self.root / f"h{i}"
        d.mkdir(exist_ok=True)
        self.host_bin(i).mkdir(exist_ok=True)
        if not self.sshd:
            return
        hostkey = d / "ssh_host_ed25519_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"testbed-h{i}", "-f", str(hostkey)])
        pub = Path(f"{hostkey}.pub").read_text().split()
        with open(self.known_hosts, "a") as f:
            f.write(f"{self.ips[i - 1]} {pub[0]} {pub[1]}\n")
        (d / "sshd_config").write_text(self._sshd_config(i, hostkey))

    def _sshd_config(self, i: int, hostkey: Path) -> str:
        # SHLVL=1: bash then skips ~/.bashrc for ssh commands (fast, predictable)
        return "\n".join([
            "Port 22", f"ListenAddress {self.ips[i - 1]}", f"HostKey {hostkey}", "PidFile none",
            f"AuthorizedKeysFile {self.root}/ssh/authorized_keys",
            "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no", "UseDNS no",
            "PrintMotd no", "PrintLastLog no", "MaxStartups 128:30:256", "MaxSessions 128",
            "AllowTcpForwarding yes", "AcceptEnv TMPDIR",
            f"SetEnv TB_HOST=h{i} TB_HOST_IP={self.ips[i - 1]} "
            f"PATH={self.host_bin(i)}:{os.environ.get('PATH', '/usr/bin:/bin')} SHLVL=1",
            "LogLevel INFO", "",
        ])

    def _start_sshd(self, i: int, timeout: float = 10.0) -> None:
        """Run sshd in the foreground (-D -e) and wait for its "Server listening" line."""
        cfg = self.root / f"h{i}" / "sshd_config"
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns(i), "unshare", "--uts", "sh", "-c",
             'hostname "$0" && exec "$1" -D -e -f "$2"', f"h{i}", SSHD, str(cfg)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        self._sshd[i] = proc
        assert proc.stderr is not None
        log = open(self.root / f"h{i}" / "sshd.log", "ab")
        sel = selectors.DefaultSelector()
        sel.register(proc.stderr, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        buf = b""
        try:
            while b"Server listening" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise RuntimeError(f"sshd of h{i} did not start listening within {timeout:g} s: {buf.decode()}")
                chunk = os.read(proc.stderr.fileno(), 4096)
                if not chunk:
                    raise RuntimeError(f"sshd of h{i} exited: {buf.decode()}")
                buf += chunk
        finally:
            sel.close()
        log.write(buf)
        log.flush()
        # keep draining its log so sshd never blocks on a full pipe
        t = threading.Thread(target=_drain, args=(proc.stderr, log), daemon=True)
        t.start()
        self._drains.append(t)

    # ----------------------------------------------------------------- use --
    def ssh_options(self, **overrides):
        """SSHOptions for this bed: its key and known_hosts only, no user config or agent."""
        from mlx_jupyter.net.ssh import SSHOptions

        kw = dict(config=[], known_hosts=str(self.known_hosts), client_keys=[str(self.key)], agent=False,
                  username="root", connect_timeout=5.0, keepalive_interval=1.0, keepalive_count_max=3)
        kw.update(overrides)
        return SSHOptions(**kw)

    def cli_ssh_args(self) -> list[str]:
        """The same, as ``mlx-jupyter launch`` options."""
        cfg = self.root / "ssh" / "config"
        if not cfg.exists():
            cfg.write_text("Host *\n    User root\n")
        return ["--ssh-config", str(cfg), "--known-hosts", str(self.known_hosts), "-i", str(self.key),
                "--connect-timeout", "5"]

    def write_ssh_config(self, path: Path, aliases: Mapping[str, Optional[int]]) -> Path:
        """An OpenSSH client config naming hosts: alias -> host index (1-based).

        ``None`` maps an alias to a closed port of h1 (connection refused at
        once), for an unreachable host that still dials only the bed's IPs.
        Any other name or address goes there too (the first value found wins),
        so nothing outside the bed is ever dialled. Works for asyncssh and ``ssh -F``.
        """
        lines = []
        for alias, i in aliases.items():
            ip, port = (self.ips[0], 1) if i is None else (self.ips[i - 1], 22)
            lines += [f"Host {alias}", f"    HostName {ip}", f"    Port {port}"]
        lines += ["Host *", f"    HostName {self.ips[0]}", "    Port 1", "    User root", f"    IdentityFile {self.key}", "    IdentitiesOnly yes",
                  f"    UserKnownHostsFile {self.known_hosts}", "    GlobalKnownHostsFile /dev/null",
                  "    StrictHostKeyChecking yes", "    BatchMode yes", "    ConnectTimeout 5",
                  "    ControlMaster no", "    ControlPath none", ""]
        Path(path).write_text("\n".join(lines))
        return Path(path)

    def ns_pids(self, i: int) -> list[int]:
        """Pids of every process in host i."""
        res = _run(["ip", "netns", "pids", self.ns(i)], check=False)
        return [int(p) for p in res.stdout.split()]

    def procs_matching(self, needle: str, exe: Optional[str] = None) -> dict[int, list[int]]:
        """Per host, pids whose command line contains ``needle`` (and starts with ``exe``)."""
        out: dict[int, list[int]] = {}
        for i in range(1, self.n + 1):
            for pid in self.ns_pids(i):
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if needle in cmd and (exe is None or cmd.startswith(exe + " ")):
                    out.setdefault(i, []).append(pid)
        return out

    def exec(self, i: int, argv: Sequence[str], timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
        """Run argv inside host i."""
        return subprocess.run(["ip", "netns", "exec", self.ns(i), *argv], capture_output=True, text=True,
                              timeout=timeout)

    def cut(self, i: int) -> None:
        """Pull host i's cable: silence, no RST."""
        _run(["ip", "link", "set", self.veth(i), "down"])

    def heal(self, i: int) -> None:
        """Plug it back in."""
        _run(["ip", "link", "set", self.veth(i), "up"])

    # ---------------------------------------------------------------- down --
    def kill_host_procs(self, i: int, keep_sshd: bool = True, timeout: float = 5.0) -> None:
        """SIGKILL every process in host i (except its sshd listener) and wait until they are gone."""
        # our Popen exec'd its way (ip netns exec, unshare, sh) into the sshd listener
        keep = {self._sshd[i].pid} if keep_sshd and i in self._sshd else set()
        deadline = time.monotonic() + timeout
        while True:
            pids = [p for p in self.ns_pids(i) if p not in keep]
            if not pids:
                return
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"host h{i}: processes {pids} survive SIGKILL")
            _wait_gone(pids, deadline - time.monotonic())

    def down(self) -> None:
        """Kill everything in the hosts, delete namespaces, bridge, guard route and files."""
        for i in range(1, self.n + 1):
            if _run(["ip", "netns", "pids", self.ns(i)], check=False).returncode == 0:
                self.kill_host_procs(i, keep_sshd=False)
            _run(["ip", "netns", "del", self.ns(i)], check=False)
            _run(["ip", "link", "del", self.veth(i)], check=False)
        for proc in self._sshd.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
            if proc.stderr:
                proc.stderr.close()
        for t in self._drains:
            t.join(timeout=5)
        _run(["ip", "link", "del", self.bridge], check=False)
        while _run(["ip", "route", "del", "unreachable", f"{self.net}.0/24", "metric", str(GUARD_METRIC)],
                   check=False).returncode == 0:
            pass
        shutil.rmtree(self.root, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """Anything of this bed still present (for the cleanup check)."""
        found = []
        if self.prefix + "-" in _run(["ip", "netns", "list"]).stdout:
            found.append("namespaces")
        if self.prefix + "-" in _run(["ip", "-o", "link", "show"]).stdout:
            found.append("links")
        if f"{self.net}.0/24" in _run(["ip", "route", "show", "table", "all"]).stdout:
            found.append("routes")
        if self.root.exists():
            found.append(str(self.root))
        return found


def _drain(stream, log) -> None:
    try:
        while chunk := stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536):
            log.write(chunk)
            log.flush()
    except (OSError, ValueError):
        pass
    finally:
        log.close()


def _wait_gone(pids: list[int], timeout: float) -> None:
    """Wait (bounded) until none of ``pids`` exists, using pidfds where possible."""
    deadline = time.monotonic() + max(timeout, 0.1)
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except (ProcessLookupError, OSError):
            continue
        try:
            sel = selectors.DefaultSelector()
            sel.register(fd, selectors.EVENT_READ)
            sel.select(max(deadline - time.monotonic(), 0))
            sel.close()
        finally:
            os.close(fd)
