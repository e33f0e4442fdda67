"""A keep-state restart's folder names (whose they are), the stale ones chosen for removal on other
hosts, and the shell command that removes them there: pure, no cluster."""

from __future__ import annotations

import shlex
import subprocess
from types import SimpleNamespace

from hypothesis import given, strategies as st

from mlx_jupyter.cluster.keep_cleanup import removal_command, remove_on_hosts
from mlx_jupyter.cluster.kept_state import KeptState
from mlx_jupyter.cluster.restart_context import MAGICS, PANEL
from mlx_jupyter.cluster.rank import keep_files

OWNERS = st.builds(keep_files.Owner, st.text("0123456789abcdef", min_size=8, max_size=8),
                   st.integers(1, 2 ** 31), st.integers(0, 2 ** 40))


@given(OWNERS, st.from_regex(r"[A-Za-z0-9_.-]{1,40}", fullmatch=True))
def test_a_folder_name_gives_back_its_owner(owner, cluster_id):
    assert keep_files.owner_of(keep_files.folder_name(cluster_id, "0" * 16, owner)) == owner


@given(st.text(max_size=120))
def test_any_other_name_has_no_owner_or_is_a_plain_word(name):
    owner = keep_files.owner_of(name)
    if owner is not None:   # only our own pattern: no path, no shell syntax
        assert "/" not in name and shlex.quote(name) == name


def test_the_removal_command_removes_only_the_named_folders(tmp_path):
    keep, other = keep_files.folder_name("mlx-1", "a" * 16), "mlx-jupyter-keep-not-ours"
    for name in (keep, other):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank0.data").write_bytes(b"x")
    script = removal_command([keep]).replace("/dev/shm", str(tmp_path), 1)
    subprocess.run(["sh", "-c", script], check=True, env={"TMPDIR": str(tmp_path / "none")}, timeout=10)
    assert sorted(p.name for p in tmp_path.iterdir()) == [other]
    try:
        removal_command(["../../etc"])
    except ValueError as exc:
        assert "not a keep folder name" in str(exc)
    else:
        raise AssertionError("a name not of ours was accepted")


def test_only_stale_folders_of_this_hosts_gone_processes_are_chosen_on_another_host():
    gone = keep_files.Owner(keep_files.host_tag(), 2 ** 22 + 7, 1)   # no such pid here
    live, elsewhere = keep_files.this_owner(), keep_files.Owner(keep_files.host_tag("h9"), 1, 1)
    names = [keep_files.folder_name("mlx-a", "1" * 16, o) for o in (gone, live, elsewhere)] + ["junk"]
    state = KeptState(SimpleNamespace(cluster_id="mlx-b"))
    state.hosts = {0: "10.0.0.2", 1: "127.0.0.1"}
    state._note_stale(0, names)
    state._note_stale(1, names)   # this host's: swept here directly
    assert state.stale == {"10.0.0.2": [names[0]]}


def test_local_folders_are_removed_without_ssh():
    name = keep_files.folder_name("mlx-c", "2" * 16)
    keep_files.private_dir(keep_files.keep_root() / name, create=True)
    assert remove_on_hosts({"127.0.0.1": [name]}) == {}
    assert not (keep_files.keep_root() / name).exists()


def test_a_failures_message_says_what_was_kept_and_lost_and_what_works_from_where_it_is_shown():
    magics = SimpleNamespace(cluster_id="mlx-d", context=MAGICS)
    state = KeptState(magics)
    state.saved = {0: {"kept": ["model", "opt"], "bytes": 3 << 20}, 1: {"kept": ["model", "opt"], "bytes": 3 << 20}}
    assert state.failure(KeyboardInterrupt()) == (
        "interrupted while saving the ranks' names; nothing was lost: the ranks were not restarted and keep "
        "their names. Next: restart again once the cause is gone (it keeps the names), or "
        "%mlx_cluster restart --clean to start the ranks empty")
    state.phase, state.left = "restarting", {"h2": "ssh: connection refused"}
    assert state.failure(RuntimeError("rank 1 on h2: exited 1\nmore")).startswith(
        "starting the new ranks failed (rank 1 on h2: exited 1); lost: the 2 names saved on 2 ranks (6.0 MiB), "
        f"as the old ranks are gone; the saved files were removed; could not remove {state.dirname} on h2 "
        "(ssh: connection refused): remove it by hand. Next: ")
    panel = SimpleNamespace(cluster_id="mlx-e", context=PANEL)
    state = KeptState(panel)
    state.phase, state.restored = "restoring", {0: {"restored": ["model"]}}
    assert state.failure(RuntimeError("boom")) == (
        "restoring the names failed (boom); kept: the names restored on rank 0; lost: the rest, and the saved "
        "files were removed. Next: dismiss it in the MLX Cluster panel and start a new cluster")
