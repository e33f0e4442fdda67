"""The lockstep pdb prompt on 2 namespace hosts (real sshd, 1 and 2 ranks per host), in a real kernel: one prompt for
every rank, `p loss` names the nan rank, and ranks blocked in our all_sum (on the other host too) do not time out
while the last rank sits at the prompt longer than the timeout; held without pdb, the same wait does time out.
Needs root (the test bed; else skipped)."""

from __future__ import annotations

import re
import shlex
import time

import pytest

from tests.cluster.kernel import Kernel
from tests.cluster.test_debug_lockstep import ANSI, Session

#: the collectives' timeout: shorter than the time the last rank is held at the prompt while the others wait on it
TIMEOUT = 3.0
HOLD = TIMEOUT + 2
pytestmark = pytest.mark.timeout(300)

CELL = f"""%%mlx_distributed
import numpy as np
from mlx_jupyter import distributed as dist
last = group.size() - 1
loss = float('nan') if group.rank() == last else 3.0
before = int(dist.all_sum(np.array([1]), group=group, timeout={TIMEOUT})[0])
breakpoint()
if group.rank() == last:
    breakpoint()
total = int(dist.all_sum(np.array([group.rank() + 1]), group=group, timeout={TIMEOUT})[0])
print('total', total, 'before', before, 'loss', loss)
"""


@pytest.fixture(params=[1, 2], ids=["1-per-host", "2-per-host"])
def kernel_on_hosts(testbed, request):
    """A real kernel whose cluster has 1 or 2 ranks on each of the bed's first 2 hosts (ssh'd, over its bridge)."""
    bed, per_host = testbed, request.param
    ssh = shlex.join(bed.cli_ssh_args())
    k = Kernel()
    try:
        res = k.run(f"%load_ext mlx_jupyter\n%mlx_cluster start --hosts {','.join(bed.ips[:2])} "
                    f"-n {per_host} --controller-ip {bed.net}.1 {ssh}", 120)
        assert res.status == "ok", res
        yield k, per_host
        assert "cluster stopped" in k.run("%mlx_cluster stop", 60).stdout
        assert bed.procs_matching("mlx_jupyter.cluster.rank.engine") == {}, "ranks left on the hosts"
    finally:
        k.close()


def test_one_prompt_on_two_hosts_and_peers_wait_past_their_timeout(kernel_on_hosts):
    k, per_host = kernel_on_hosts
    n = 2 * per_host
    last, everyone = n - 1, f"ranks 0-{n - 1}"
    others = "rank 0" if n == 2 else f"ranks 0-{n - 2}"
    cluster_id = k.run("import mlx_jupyter.magics as _m\nprint(_m.current().cluster_id)", 10).stdout.strip()
    from mlx_jupyter.cluster import Cluster

    other = Cluster.connect(cluster_id, timeout=30)  # where() from another process, while the kernel's cell runs
    try:
        s = Session(k, CELL)
        assert s.prompt() == f"(Pdb {everyone}) ", s.prompts
        head = s.shown(0, f"[{everyone}] -> if group.rank() == last:")
        assert f"--- pdb on {everyone} together" in head, head
        s.ask("p loss", f"[{others}] 3.0\n[rank {last}] nan\n")  # the nan rank, on the other host, in one command
        # `c`: the others go on into the all_sum; the last rank stops again, alone, at its second breakpoint
        before = len(s.res.stdout)
        s.answer("c")
        assert re.fullmatch(rf"\(Pdb ranks? {last}\) ", s.prompt()), s.prompts
        s.shown(before, "-> total = ")
        # each waiting rank's core record names the rank its own wait is on (in a ring, maybe a waiting peer);
        # the rank on the other host from the paused one names it, in pdb
        waits = re.compile(r"in all_sum #\d+ at line 10 waiting on rank \d+")
        on_pdb = re.compile(rf"in all_sum #\d+ at line 10 waiting on rank {last} \(in pdb\)")

        def blocked(where) -> bool:
            return (where is not None and all(waits.search(where.state(r)) for r in range(last))
                    and any(on_pdb.search(where.state(r)) for r in range(per_host)))

        deadline, where = time.monotonic() + 20, None
        while not blocked(where):
            assert time.monotonic() < deadline, f"the others not seen waiting on rank {last} in pdb: {where}"
            where = other.where(timeout=5)
        assert where.state(last) == "in pdb (line 10)", where
        waiting = time.monotonic()  # the others have waited at least since now: hold the last rank longer
        while time.monotonic() - waiting < HOLD:  # the pause under test (not a synchronisation)
            where = other.where(timeout=5)
            assert all(waits.search(where.state(r)) for r in range(last)), where  # not failed on their timeout
            time.sleep(0.5)
        res = s.finish("c")
    finally:
        other.stop()
    out = ANSI.sub("", res.stdout)
    assert res.status == "ok", (res, out)
    total = n * (n + 1) // 2
    assert f"[{others}] total {total} before {n} loss 3.0" in out, out
    assert f"[rank {last}] total {total} before {n} loss nan" in out, out
    hosts = k.run("%%mlx_distributed\nimport socket\nfrom mlx_jupyter import distributed as dist\nimport numpy as np\n"
                  "print(socket.gethostname(), int(dist.all_sum(np.array([5]), group=group)[0]))", 60)
    assert hosts.status == "ok", hosts   # the group intact on both hosts
    for host in (1, 2):
        first = (host - 1) * per_host
        ranks = f"rank {first}" if per_host == 1 else f"ranks {first}-{first + 1}"
        assert f"[{ranks}] h{host} {5 * n}" in hosts.stdout, hosts.stdout
    # the control: the same wait with the last rank busy instead of at the prompt times out
    ctrl = k.run(f"%%mlx_distributed\nimport time\nif group.rank() == last:\n    time.sleep({HOLD})\n"
                 f"dist.all_sum(np.array([1]), group=group, timeout={TIMEOUT})", 60)
    assert ctrl.status == "error" and "all_sum timed out after 3 s" in ctrl.traceback, ctrl
