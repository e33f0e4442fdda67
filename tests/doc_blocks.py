"""The code blocks of the README and docs/, and how each is run as written.

A block's language says what it is: `python` (run with this venv's Python; a block with `%` lines
is notebook cells, run in a real kernel), `bash`/`sh` (run with bash, `set -e`), `json` (parsed),
`text` (a listing: output, commands sent to hosts; not run). An HTML comment on the line before a
block qualifies it:

- `<!-- file: NAME -->`: not run itself; written as NAME for the doc's other blocks;
- `<!-- hosts: mac1 mac2 -->`: runs on the namespace test hosts under those names (ssh config aliases);
- `<!-- not run: REASON -->`: cannot run here (Macs, GPUs, an installation); REASON says why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
LANGUAGES = ("python", "bash", "sh", "json", "text")
#: The top-level entries of the clone a doc's commands may name (relative paths), linked into their folder.
LINKED = ("tests", "notebooks", "benchmarks")

_BLOCK = re.compile(r"(?:^<!--\s*(?P<key>[a-z ]+):\s*(?P<value>.*?)\s*-->\n)?^```(?P<lang>[^\n`]*)\n(?P<code>.*?)^```\s*$",
                    re.S | re.M)


@dataclass
class Block:
    doc: str
    line: int
    lang: str
    code: str
    key: str = ""      # file | hosts | not run
    value: str = ""

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def is_notebook(self) -> bool:
        return self.lang == "python" and any(x.lstrip().startswith("%") for x in self.code.splitlines())

    @property
    def runs(self) -> bool:
        return self.lang not in ("text", "json") and self.key not in ("file", "not run")


def blocks(doc: str) -> list[Block]:
    text = (ROOT / doc).read_text()
    return [Block(doc, text.count("\n", 0, m.start("lang")) + 1, m["lang"].strip(), m["code"], (m["key"] or "").strip(),
                  (m["value"] or "").strip()) for m in _BLOCK.finditer(text)]


@dataclass
class Outcome:
    """What running a doc's blocks printed, per block (stdout, or the notebook's text)."""

    outputs: dict[str, str] = field(default_factory=dict)

    def of(self, needle: str) -> str:
        """The output of the one block whose code contains ``needle``."""
        found = [out for where, out in self.outputs.items() if needle in where]
        assert len(found) == 1, f"{needle!r} matches {len(found)} blocks: {list(self.outputs)}"
        return found[0]


def workdir(folder: Path, doc: str) -> Path:
    """A folder where the doc's relative paths work: its file blocks, .venv and the clone's data folders."""
    folder.mkdir(parents=True, exist_ok=True)
    venv = folder / ".venv"
    if not venv.exists():
        venv.symlink_to(Path(sys.prefix))
    for name in LINKED:
        if not (folder / name).exists():
            (folder / name).symlink_to(ROOT / name)
    for b in blocks(doc):
        if b.key == "file":
            (folder / b.value).write_text(b.code)
    return folder


def shell_env(extra: Optional[dict] = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "OMPI_", "PMI", "SLURM_"))}
    env.update(extra or {})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])   # as if activated
    return env


def run_shell(b: Block, cwd: Path, env: dict, timeout: float = 120) -> str:
    p = subprocess.run(["bash", "-e", "-c", b.code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{b.where} exited {p.returncode}:\n{b.code}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
    return p.stdout


def run_python(b: Block, cwd: Path, env: dict, timeout: float = 120) -> str:
    p = subprocess.run([sys.executable, "-c", b.code], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{b.where} failed:\n{b.code}\n--- stderr\n{p.stderr}"
    return p.stdout


def run_notebook(cells: list[Block], cwd: Path, timeout: float = 120) -> dict[str, str]:
    """The doc's notebook blocks as cells of one notebook in a real kernel (a cluster it started is stopped)."""
    import nbformat
    from nbclient import NotebookClient

    sources = [b.code.strip() for b in cells]
    if any("%mlx_cluster start" in s for s in sources) and "%mlx_cluster stop" not in sources[-1]:
        sources.append("%mlx_cluster stop")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    out = {}
    for b, cell in zip(cells, nb.cells):
        out[f"{b.where} {b.code}"] = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                                              for o in cell.outputs)
    return out


def run_doc(doc: str, folder: Path, hosts: bool = False, env: Optional[dict] = None) -> Outcome:
    """Run every block of ``doc`` that runs here, in order (notebook cells last, in one kernel).

    ``hosts``: only the blocks marked `hosts:` (``env`` then points ssh at the test hosts); else the others.
    """
    cwd = workdir(folder, doc)
    env = shell_env(env)
    outcome = Outcome()
    notebook = []
    for b in blocks(doc):
        if b.lang == "json":
            json.loads(b.code)
        if not b.runs or (b.key == "hosts") != hosts:
            continue
        if b.is_notebook:
            notebook.append(b)
        elif b.lang == "python":
            outcome.outputs[f"{b.where} {b.code}"] = run_python(b, cwd, env)
        else:
            outcome.outputs[f"{b.where} {b.code}"] = run_shell(b, cwd, env)
    if notebook:
        outcome.outputs.update(run_notebook(notebook, cwd))
    return outcome
