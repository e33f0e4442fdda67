"""The documentation's code blocks, run as written (tests/doc_blocks.py says how each kind runs), and
the commands and recipes the docs describe."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from doc_blocks import DOCS, LANGUAGES, blocks, run_doc

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "mlx_jupyter"]
#: Blocks that cannot run here, each marked in its doc with the reason; keep this short.
NOT_RUN = {"README.md": 2, "docs/getting-started.md": 4, "docs/notebooks-and-widgets.md": 1,
           "docs/configurator.md": 1, "docs/without-launcher.md": 1, "docs/slurm.md": 5}


def code_blocks(doc: str, lang: str) -> list[str]:
    return [b.code for b in blocks(doc) if b.lang == lang]


def test_readme_opens_with_the_two_commands() -> None:
    first = (ROOT / "README.md").read_text().split("```")[1].strip().splitlines()
    assert first[0] == "bash" and len(first) == 3
    assert "mlx-jupyter demo" in first[1] and first[2].startswith("bash .ci/run ")
    # the core is compiled once, with the notebooks extra, and the line says it compiles (issue 30 §4.10)
    readme = (ROOT / "README.md").read_text()
    assert 'pip install ".[notebooks]"' in first[1] and "compiles" in first[1], first[1]
    assert len(re.findall(r"pip install (?:-q )?(?:-e )?\.(?:\s|$)|pip install [^\n]*\"\.\[", readme)) == 1, \
        "the README installs the package once: a second `pip install .` compiles the core again"
    # the tests (the README's command, with only a report of the slowest added), then the speed guard
    # once; either failing fails CI (issue 30 §2). `took` lines print how long each step took.
    ci = [line.split("#")[0].strip() for line in (ROOT / ".ci/run").read_text().strip().splitlines()
          if not line.startswith("took ")]
    assert ci[-3:] == [".venv/bin/pytest -q --durations=25 --durations-min=10 || status=$?",
                       ".venv/bin/python benchmarks/guard.py || status=$((status ? status : 1))", 'exit "$status"']
    assert "`.venv/bin/pytest -q`" in (ROOT / "README.md").read_text()


def test_every_block_has_a_language_and_every_skip_a_reason() -> None:
    found = {}
    for doc in DOCS:
        for b in blocks(doc):
            assert b.lang in LANGUAGES, f"{b.where}: give the block a language ({', '.join(LANGUAGES)})"
            assert b.key in ("", "file", "hosts", "not run"), f"{b.where}: unknown marker {b.key!r}"
            assert b.key != "not run" or len(b.value) > 10, f"{b.where}: say why it cannot run here"
            if b.key == "not run":
                found[doc] = found.get(doc, 0) + 1
    assert found == NOT_RUN


@pytest.mark.timeout(300)
@pytest.mark.parametrize("doc", [d for d in DOCS if any(b.runs and b.key != "hosts" for b in blocks(d))])
def test_doc_blocks_run_as_written(doc: str, tmp_path: Path) -> None:
    outcome = run_doc(doc, tmp_path)
    if doc == "README.md":
        assert "rank 0: [3.0, 3.0, 3.0, 3.0]" in outcome.of("%%mlx_distributed")
        assert outcome.of("from mlx_jupyter import Cluster").strip() == ("['[2.0, 4.0]', '[2.0, 4.0]']\n"
                                                                         "[[2.0, 4.0], [2.0, 4.0]]")
        launched = outcome.of("launch -n 2 -- python train.py")
        assert "rank 0 of 2: [3.0, 3.0] [2.0, 2.0]" in launched and "rank 1 of 2: [3.0, 3.0] [2.0, 2.0]" in launched
    if doc == "docs/debugging.md":
        assert re.search(r"rank 0 is in all_sum #1 at line 4 waiting on rank 1 for [0-9.]+ s; rank 1 is idle",
                         outcome.of("hung.wait")), outcome.of("hung.wait")
        launched = outcome.of("--where-on-signal")
        assert "waits in MLX all_sum #1 (float32[3], built at line 6, evaluated at line 6) on rank 1" in launched, launched
        assert "has called 0 MLX collectives and is at line 5: time.sleep(4)" in launched, launched
    if doc == "docs/getting-started.md":
        assert "3, 3, 3, 3" in outcome.of("%%mlx_distributed").replace(".", "")
        assert outcome.of("launch -n 2 -- python train.py").count(": [3.0, 3.0]") == 2
    if doc == "docs/collective-core.md":
        tour = outcome.of("python tour.py")
        assert "rank 1 received [0. 1. 2. 3.]" in tour and tour.count("[0, 1, 10, 11] [[2.0, 2.0], [2.0, 2.0]]") == 2
        assert outcome.of("Buffer.wrap").strip() == "42.0 42.0 True"
        assert ("[('all_sum', 1, 4096, 'float32'), ('all_sum', 2, 4096, 'float32'), ('all_sum', 3, 4096, 'float32')]\n"
                "[('idle', None, 3)]") in outcome.of("dist.profile()")
    if doc == "docs/debugging.md":
        assert "straggler: rank 1" in outcome.of("%%mlx_distributed --profile")
        assert "[0, 1] {'all_sum'}" in outcome.of("magics.current().profile()")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("doc", [d for d in DOCS if any(b.key == "hosts" for b in blocks(d))])
def test_doc_blocks_for_named_hosts_run_on_test_hosts(doc: str, testbed, tmp_path: Path) -> None:
    """`mac1`, `mac2` and the like: the namespace test hosts under those names, in a home whose
    ~/.ssh/config names them (asyncssh reads $HOME; OpenSSH's ssh gets it with -F)."""
    names = sorted({n for b in blocks(doc) if b.key == "hosts" for n in b.value.split()})
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    cfg = testbed.write_ssh_config(home / ".ssh" / "config", {n: i + 1 for i, n in enumerate(names)})
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "ssh").write_text(f'#!/bin/sh\nexec {shutil.which("ssh")} -F {cfg} "$@"\n')
    (shim / "ssh").chmod(0o755)
    env = {"HOME": str(home), "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}
    outcome = run_doc(doc, tmp_path / "work", hosts=True, env=env)
    if doc == "docs/getting-started.md":
        out = outcome.of("--hosts mac1,mac2 --backend ring")
        assert out.count("of 2: [3.0, 3.0]") == 4, out   # --hosts, then the hostfile config wrote
    if doc == "docs/troubleshooting.md":
        assert outcome.of("BatchMode=yes mac2").strip() == "ok"


@pytest.mark.parametrize("command", [["doctor"], ["demo"]])
def test_terminal_checks_from_getting_started(command: list[str], tmp_path: Path) -> None:
    p = subprocess.run(CLI + command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    if command == ["doctor"]:
        assert "ring" in p.stdout
        return
    for r in (0, 1):  # each rank's own sums, from both libraries, and the checked summary
        assert f"rank {r} of 2: mlx_jupyter all_sum = [1.0, 3.0, 5.0, 7.0], MLX all_sum = [1.0, 3.0, 5.0, 7.0]" \
            in p.stdout, p.stdout
    assert "demo: 2 ranks agree: ours and MLX's all_sum both gave [1.0, 3.0, 5.0, 7.0] on every rank" in p.stdout


def test_demo_fails_when_a_rank_disagrees(capsys) -> None:
    """The demo's agreement is checked on the ranks: a wrong expectation on them fails it, naming the rank."""
    from mlx_jupyter.commands import demo

    wrong = demo.RANK_CODE.replace("expected = [", "expected = [0.5] + [")
    assert wrong != demo.RANK_CODE
    assert demo.main([], rank_code=wrong) != 0
    out = capsys.readouterr()
    assert "agree" not in out.out


def section(doc: str, heading: str) -> str:
    """The text of `## heading` in doc, up to the next `## `."""
    text = (ROOT / doc).read_text()
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_mpi_notebook_lines_parse_and_run_locally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MPI section's notebook lines: valid %mlx_cluster arguments, and the one-machine one runs."""
    import shutil

    from IPython.core.magic_arguments import parse_argstring

    from mlx_jupyter.magics import MLXMagics

    lines = re.findall(r"`(%mlx_cluster start [^`]*)`", section("docs/getting-started.md", "MPI"))
    assert lines == ["%mlx_cluster start --hosts h1,h2 -n 1 --backend mpi", "%mlx_cluster start -n 2 --backend mpi"]
    for line in lines:
        args = parse_argstring(MLXMagics.mlx_cluster, line.split(" ", 1)[1])
        assert args.action == "start" and args.backend == "mpi"
    if shutil.which("mpirun") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("mpirun is missing under CI: .ci/run installs openmpi-bin")
        pytest.skip("mpirun is not installed (apt-get install openmpi-bin)")
    if os.geteuid() == 0:  # as the doc says: Open MPI refuses root without these
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cells = ["%load_ext mlx_jupyter", lines[1],
             "%%mlx_distributed\nprint('mpi', world.size(), mx.distributed.all_sum(mx.ones(2) * (world.rank() + 1), group=world).tolist())",
             "%mlx_cluster stop"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert "mpi 2 [3.0, 3.0]" in text, text
    assert "cluster stopped" in "".join(o.get("text", "") for o in nb.cells[3].outputs)


def test_hostfile_doc_examples_read_with_our_reader(tmp_path: Path) -> None:
    from mlx_jupyter.hostfile import read_hostfile

    examples = code_blocks("docs/hostfiles.md", "json")
    assert len(examples) == 2
    plain, configured = examples
    path = tmp_path / "plain.json"
    path.write_text(plain)
    hf = read_hostfile(str(path))
    assert [(h.ssh, list(h.ips)) for h in hf.hosts] == [("mac1", ["192.168.0.1"]), ("mac2", ["192.168.0.2"])]
    path = tmp_path / "configured.json"
    path.write_text(configured)
    hf = read_hostfile(str(path))
    assert [h.ssh for h in hf.hosts] == ["m1", "m2", "m3"]
    assert hf.backend == "jaccl" and list(hf.envs) == ["MLX_METAL_FAST_SYNCH=1"]
    assert [list(h.rdma) for h in hf.hosts][0] == [None, "rdma_en5", "rdma_en4"]


RECIPE = """
import json, os, sys
import mlx.core as mx
import numpy as np
from mlx_jupyter import distributed as dist

world = mx.distributed.init(backend="ring", strict=True)
mine = mx.distributed.all_sum(mx.ones(3) * (world.rank() + 1), group=world)
group = dist.init(strict=True, timeout=60)
ours = dist.all_sum(np.arange(3, dtype=np.float32) * (group.rank() + 1), group=group, timeout=60)
print(json.dumps({"rank": world.rank(), "size": world.size(), "mlx": mine.tolist(), "core": ours.tolist(),
                  "core_rank": group.rank()}))
"""


@pytest.mark.timeout(120)
def test_without_launcher_recipe_two_local_ranks(tmp_path: Path) -> None:
    """docs/without-launcher.md's ring recipe by hand: MLX_HOSTFILE and MLX_RANK only, no launcher."""
    import json
    import secrets

    from mlx_jupyter.vocab.ports import free_port_block

    doc = (ROOT / "docs/without-launcher.md").read_text()
    assert "`MLX_HOSTFILE` = path of a JSON list" in doc and "+`MLX_JUPYTER_PORT_OFFSET` (default 1000, or −1000 where" in doc
    port = free_port_block(2)
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port}"], [f"127.0.0.1:{port + 1}"]]))
    (tmp_path / "train.py").write_text(RECIPE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "OMPI_", "PMI", "SLURM_"))}
    env.update(MLX_HOSTFILE=str(hostfile), MLX_JUPYTER_TOKEN=secrets.token_hex(16))
    procs = [subprocess.Popen([sys.executable, "train.py"], cwd=tmp_path, env={**env, "MLX_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, err
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert [o["rank"] for o in outs] == [0, 1] and [o["core_rank"] for o in outs] == [0, 1]
    assert all(o["size"] == 2 and o["mlx"] == [3.0, 3.0, 3.0] and o["core"] == [0.0, 3.0, 6.0] for o in outs)


NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")


def _matches(shown: str, kept: list[float]) -> bool:
    """``shown`` is one of the kept figures, rounded as printed (also in the next unit: ms <-> s, µs <-> ms)."""
    places = len(shown.split(".")[1]) if "." in shown else 0
    value = float(shown)
    return any(round(f * scale, places) == value for f in kept for scale in (1, 1e-3, 1e3))


def test_performance_quotes_only_runs_kept_in_benchmarks_results() -> None:
    text = (ROOT / "docs/performance.md").read_text()
    for phrase in ("before this change", "after this change", "not kept", "used to take"):
        assert phrase not in text.lower(), f"docs/performance.md has history in it: {phrase!r}"
    for section in text.split("\n## ")[1:]:
        title = section.splitlines()[0]
        files = sorted(set(re.findall(r"benchmarks/results/[\w.]+\.txt", section)))
        for f in files:
            assert (ROOT / f).is_file(), f"{title}: {f} is not kept"
        lines = section.splitlines()
        rows = [row for k, row in enumerate(lines) if row.startswith("|") and not re.fullmatch(r"[|\- ]+", row)
                and not (k + 1 < len(lines) and re.fullmatch(r"[|\- ]+", lines[k + 1]))]   # not the header
        if not rows:
            continue
        assert files, f"{title}: a table without the results file it comes from"
        kept = [float(x) for f in files for x in NUMBER.findall((ROOT / f).read_text())]
        for row in rows:
            for cell in row.strip("|").split("|")[1:]:
                for shown in NUMBER.findall(cell):
                    assert _matches(shown, kept), f"{title}: {shown} in {row!r} is in none of {files}"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_the_second_command_uses_sudo_only_when_not_root() -> None:
    """`bash .ci/run`: as root it runs as is (no sudo needed, none installed on a fresh machine);
    as another user it re-runs itself through sudo, keeping PATH; without sudo it goes on as that user."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        d = Path(folder)
        d.chmod(0o755)
        (d / "bin").mkdir(mode=0o755)
        sudo = d / "bin" / "sudo"
        sudo.write_text('#!/bin/sh\necho "sudo $*"\n')
        sudo.chmod(0o755)
        script = d / "run"
        script.write_text(f'set -e\n. {ROOT}/.ci/as-root "$0" "$@"\necho "ran as $(id -u) with $*"\n')
        script.chmod(0o755)
        path = f"{d / 'bin'}:/usr/bin:/bin"

        def run(*prefix: str, env_path: str = path) -> subprocess.CompletedProcess:
            return subprocess.run([*prefix, "/bin/bash", str(script), "a b"], capture_output=True, text=True,
                                  timeout=30, env={"PATH": env_path})

        as_root = run()
        assert as_root.stdout == "ran as 0 with a b\n", as_root.stderr
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        elevated = run(*nobody)
        assert elevated.stdout == f"sudo env PATH={path} MLXJ_AS_ROOT_TRIED=1 bash {script} a b\n", elevated.stderr
        assert "not root: running it through sudo" in elevated.stderr
        without_sudo = run(*nobody, env_path="/usr/bin:/bin")
        if shutil.which("sudo", path="/usr/bin:/bin") is None:
            assert without_sudo.stdout == "ran as 65534 with a b\n", without_sudo.stderr


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a markdown file."""
    heads = re.findall(r"^#+\s+(.*)$", path.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_links_between_the_docs_resolve() -> None:
    for doc in DOCS:
        path = ROOT / doc
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", path.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            linked = (path.parent / target).resolve() if target else path
            assert linked.exists(), f"{doc}: link to {target} leads nowhere"
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked), f"{doc}: {target}#{anchor}: no such heading"
