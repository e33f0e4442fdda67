"""Quoting: every value reaching a remote shell arrives literally (checked with a real /bin/sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_jupyter.launch.script import MARKER, RankStart, rank_script
from mlx_jupyter.net.ssh import QuotingError, export, join, quote, sh_command, split_destination

HOSTILE = ["a'b", 'a"b', "$(touch /tmp/pwned)", "`id`", "a;b", "a\nb", "a b", "\\", "$HOME", "*", "-n", "", "'",
           "!x", "a\tb", "é ✓", "%s", "${IFS}"]
_text = st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=30)


def sh(script: "str | RankStart", stdin: str = "", argv0: str = "/bin/sh", env: "dict | None" = None
       ) -> subprocess.CompletedProcess:
    """Run a script (a rank's: its setup first on stdin); bytes in and out, so no newline translation hides
    a quoting bug."""
    if isinstance(script, RankStart):
        script, stdin = script.script, script.setup + stdin
    res = subprocess.run([argv0, "-c", script], input=stdin.encode(), capture_output=True, timeout=20, env=env)
    res.stdout, res.stderr = res.stdout.decode(), res.stderr.decode()
    return res


@pytest.mark.parametrize("value", HOSTILE)
def test_quote_is_literal(value):
    assert sh(f"printf '%s' {quote(value)}").stdout == value


@settings(max_examples=200, deadline=None)
@given(st.lists(_text, min_size=1, max_size=4))
def test_join_roundtrips_through_sh(argv):
    out = sh(f'for a in {join(argv)}; do printf "%s\\0" "$a"; done').stdout
    assert out.split("\0")[:-1] == argv


@settings(max_examples=100, deadline=None)
@given(_text)
def test_sh_command_survives_a_login_shell(value):
    # the remote login shell parses our command line, then /bin/sh runs the script
    assert sh(sh_command(f"printf '%s' {quote(value)}"), argv0="bash").stdout == value


def test_nul_and_bad_names_are_refused():
    with pytest.raises(QuotingError, match="NUL"):
        quote("a\0b")
    for name in ["A-B", "1A", "A B", "A;B", ""]:
        with pytest.raises(QuotingError, match="environment variable name"):
            export(name, "x")


def test_split_destination():
    assert split_destination("root@10.0.0.1") == ("root", "10.0.0.1")
    assert split_destination("[::1]") == (None, "::1")
    assert split_destination("mac") == (None, "mac")


@settings(max_examples=25, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True), _text, max_size=3), _text)
def test_rank_script_passes_env_args_and_files_literally(tmp_path_factory, env, content):
    cwd = tmp_path_factory.mktemp("cwd 'with $(odd) name\n")
    probe = ("import os, sys, json; print(json.dumps([sys.argv[1:], {k: os.environ.get(k) for k in sys.argv[1:]}, "
             "open(os.environ['PAYLOAD'], newline='').read(), os.getcwd()]))")
    argv = ["python3", "-c", probe, *env]
    script = rank_script(argv, env, {"PAYLOAD": content}, str(cwd), True, "rank 0 on h'1")
    res = sh(script)
    assert res.returncode == 0, res.stderr
    first, rest = res.stdout.split("\n", 1)
    assert first.startswith(MARKER + " ")
    import json
    got_args, got_env, got_content, got_cwd = json.loads(rest)
    assert got_args == list(env) and got_env == env and got_content == content and got_cwd == str(cwd)


def test_rank_script_reports_a_bad_cwd_and_cleans_up(tmp_path):
    tmp = tmp_path / "tmp"   # a TMPDIR of its own: other users' launches write into /tmp meanwhile
    tmp.mkdir()
    res = sh(rank_script(["true"], {}, {"F": "x"}, str(tmp_path / "missing;$(x)"), True, "rank 3 on h4"),
             env={**os.environ, "TMPDIR": str(tmp)})
    assert res.returncode == 125
    assert "rank 3 on h4: cannot change directory to" in res.stderr and "missing;$(x)" in res.stderr
    assert not list(tmp.iterdir())   # its temp dir was made there, and removed


def test_rank_script_forwards_stdin_and_exit_code():
    res = sh(rank_script(["sh", "-c", "read x; echo got:$x; exit 7"], {}, {}, None, False, "r"), stdin="hi\n")
    assert res.returncode == 7 and res.stdout.split("\n")[1] == "got:hi"


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True),
                       st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=12, max_size=30), max_size=3))
def test_no_env_value_is_in_the_script(env):
    """The script is a long-lived shell's argv (readable by every user of the host): no value in it."""
    start = rank_script(["true"], env, {"F": "file-content-xyzzy-42"}, None, False, "r")
    for value in [*env.values(), "file-content-xyzzy-42"]:
        assert value not in start.script and value in start.setup


def test_settings_leave_the_ranks_own_stdin_intact():
    start = rank_script(["sh", "-c", 'read x; echo "got:$x:$K"'], {"K": "v\n2"}, {}, None, False, "r")
    res = sh(start, stdin="hi\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n", 1)[1] == "got:hi:v\n2\n"


def test_an_env_var_named_like_the_scripts_own_cannot_redirect_its_cleanup(tmp_path):
    keep = tmp_path / "keep"
    keep.mkdir()
    # `d`, `pid` and `GUARD` were the script's own names once: an env var `d` made it remove that dir at exit
    res = sh(rank_script(["true"], {"d": str(keep), "pid": "1", "GUARD": str(keep)}, {}, None, False, "r"))
    assert res.returncode == 0, res.stderr
    assert keep.is_dir()
    with pytest.raises(ValueError, match="_mj_d.*rank script's own"):
        rank_script(["true"], {"_mj_d": "/"}, {}, None, False, "r")


@pytest.mark.parametrize("stdin, why", [("", "its settings did not arrive on stdin"), ("x\n", "its settings are garbled"),
                                        ("3\nexport A=1\n", "its settings were cut short")])
def test_missing_or_garbled_settings_stop_the_rank_with_a_message(stdin, why):
    res = sh(rank_script(["true"], {}, {}, None, False, "rank 2 on h3").script, stdin=stdin)
    assert res.returncode == 125 and f"rank 2 on h3: {why}" in res.stderr


#: prints how the rank starts with SIGINT, SIGQUIT and SIGUSR1: "dfl" (default) or "ign" (ignored)
DISPOSITIONS = ("import signal; print(*['ign' if signal.getsignal(s) == signal.SIG_IGN else 'dfl' "
                "for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1)])")


@pytest.mark.parametrize("hold_usr1, want", [(False, "dfl dfl dfl"), (True, "dfl dfl ign")])
def test_the_rank_starts_with_ctrl_c_at_its_default(hold_usr1, want):
    """Not ignored as a shell's ``&`` leaves it: the launcher's forwarded Ctrl-C must reach a remote rank.
    ``hold_usr1`` (--where-on-signal): SIGUSR1 ignored until the rank's boot code takes it."""
    res = sh(rank_script([sys.executable, "-c", DISPOSITIONS], {}, {}, None, False, "r", hold_usr1=hold_usr1))
    assert res.returncode == 0, res.stderr
    assert res.stdout.split("\n")[1] == want


def test_without_perl_setsid_starts_the_rank(tmp_path):
    """A host without perl (a slim Linux image) starts ranks with setsid(1): they run, only with the shell's
    ignored SIGINT (the documented limit)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "mktemp", "rm", "setsid"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    res = sh(rank_script([sys.executable, "-c", DISPOSITIONS], {}, {}, None, False, "r"), env={"PATH": str(bin_dir)})
    assert res.returncode == 0, res.stderr
    first, rest = res.stdout.split("\n", 1)
    assert first.startswith(MARKER + " ") and rest == "ign ign dfl\n"


def test_a_command_that_cannot_start_exits_127_naming_it():
    res = sh(rank_script(["no-such-cmd-xyz"], {}, {}, None, False, "r"))
    assert res.returncode == 127 and "no-such-cmd-xyz: No such file or directory" in res.stderr, res


# ---------------------------------------------------------------- watchdog --

def _popen_sh(script: str) -> subprocess.Popen:
    return subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def test_watchdog_signals_then_kills_registered_groups_at_eof():
    """Lines are delivered as signals; at EOF every registered rank group is killed and the dirs removed."""
    import os
    import signal
    from pathlib import Path

    from mlx_jupyter.launch.script import watchdog_script

    dog = _popen_sh(watchdog_script())
    first = dog.stdout.readline().decode()
    assert first.startswith(MARKER + " ")
    guard = Path(first.split(" ", 1)[1].strip())
    start = rank_script(["sh", "-c", "trap 'echo usr1' USR1; echo ready; sleep 60 & wait; sleep 60 & wait"], {},
                        {"F": "x"}, None, False, "rank 0", str(guard))
    rank = _popen_sh(start.script)
    rank.stdin.write(start.setup.encode())
    rank.stdin.flush()
    pgid = int(rank.stdout.readline().split()[1])
    assert rank.stdout.readline() == b"ready\n"   # its trap is set
    registered = guard / str(pgid)
    pause = __import__("threading").Event()
    for _ in range(100):   # bounded readiness probe: the wrapper registers just after the fork
        if registered.exists():
            break
        pause.wait(0.05)
    from mlx_jupyter.proc_identity import start_token

    lines = registered.read_text().splitlines()   # the rank's temp dir, then its start
    rank_dir = Path(lines[0])
    assert rank_dir.is_dir() and os.getpgid(pgid) == pgid and lines[1] == start_token(pgid)
    dog.stdin.write(f"USR1 -{pgid}\n".encode())
    dog.stdin.flush()
    assert rank.stdout.readline() == b"usr1\n"
    dog.stdin.close()            # the launcher is gone
    assert dog.wait(10) == 0
    assert rank.wait(10) == 128 + signal.SIGKILL
    assert not guard.exists() and not rank_dir.exists()
    for p in (dog, rank):
        p.stdout.close()
        p.stderr.close()


def test_rank_refuses_to_run_without_its_watchdog(tmp_path):
    res = sh(rank_script(["sleep", "60"], {}, {}, None, False, "rank 1 on h2", str(tmp_path / "gone")))
    assert res.returncode == 125 and "rank 1 on h2: the launcher's watchdog on this host is gone" in res.stderr


# -------------------------------------------------------- ssh config, hops --

def test_split_hop():
    from mlx_jupyter.net.ssh import _split_hop

    assert _split_hop("jump") == ("jump", None)
    assert _split_hop("bob@jump:2222") == ("bob@jump", 2222)
    assert _split_hop("[fe80::1]:22") == ("fe80::1", 22)
    assert _split_hop("fe80::1") == ("fe80::1", None)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True)),
       st.from_regex(r"[a-z0-9][a-z0-9.-]{0,15}", fullmatch=True), st.one_of(st.none(), st.integers(1, 65535)))
def test_split_hop_roundtrips(user, host, port):
    from mlx_jupyter.net.ssh import _split_hop

    hop = (f"{user}@" if user else "") + host + (f":{port}" if port else "")
    assert _split_hop(hop) == ((f"{user}@{host}" if user else host), port)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30))
def test_split_hop_never_raises(hop):
    from mlx_jupyter.net.ssh import _split_hop

    dest, port = _split_hop(hop)
    assert isinstance(dest, str) and (port is None or isinstance(port, int))


def test_resolve_lists_the_known_hosts_files_openssh_would_read(tmp_path, monkeypatch):
    from mlx_jupyter.net.ssh import SSHOptions, resolve

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("a", "b", "g", "p-node-x-2200"):
        (tmp_path / name).write_text("")
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "known_hosts").write_text("")
    cfg = tmp_path / "config"
    cfg.write_text("Host two\n  HostName 10.9.9.9\n  UserKnownHostsFile ~/a %d/b ~/missing\n  GlobalKnownHostsFile ~/g\n"
                   "Host tok\n  HostName node-x\n  Port 2200\n  UserKnownHostsFile ~/p-%h-%p\n"
                   "Host off\n  UserKnownHostsFile none\n  GlobalKnownHostsFile none\n")
    opts = SSHOptions(config=[str(cfg)])
    t = resolve("two", opts)
    assert (t.host, t.port, t.known_hosts_files) == ("10.9.9.9", 22, [str(tmp_path / n) for n in ("a", "b", "g")])
    assert resolve("tok", opts).known_hosts_files[0] == str(tmp_path / "p-node-x-2200")
    assert resolve("off", opts).known_hosts_files == []
    assert resolve("other", opts).known_hosts_files[0] == str(tmp_path / ".ssh" / "known_hosts")
    assert resolve("two", SSHOptions(config=[str(cfg)], known_hosts=str(tmp_path / "b"))).known_hosts_files == \
        [str(tmp_path / "b"), str(tmp_path / "g")]


# ------------------------------------------------------------ mpi output --

def _tagged(lines, version=(4, 1)):
    from mlx_jupyter.launch.mpi import TaggedOutput

    out, parts = [], {}

    def emit(rank, stream, text, ends):   # a rank's pieces joined into its line
        parts[rank, stream] = parts.get((rank, stream), "") + text
        if ends:
            out.append((rank, stream, parts.pop((rank, stream))))

    t = TaggedOutput(emit, version)
    for stream, line in lines:
        t.line(stream, line)
    t.flush()
    return out, t


def test_mpi_tagged_output_is_split_per_rank():
    # as measured from Open MPI 4.1.4 with unbuffered ranks: a rank's line spread over mpirun's lines
    out, t = _tagged([("stdout", "[1,1]<stdout>:vm 1 [1,0]<stdout>:vm[1,0]<stdout>: 0 2 2 "),
                      ("stdout", "[1,1]<stdout>:2 2 "),
                      ("stderr", "[1,1]<stderr>:err"), ("stderr", "[1,3]<stddiag>:diag"),
                      ("stdout", "plain [1,x] text"), ("stderr", "  Process name: [[20464,1],2]"),
                      ("stderr", "  Exit code:    5"), ("stdout", "[1,2]<stdout>:(Pdb) [1,0]<stdout>:x")])
    assert out == [(0, "stdout", "vm 0 2 2 "), (1, "stdout", "vm 1 2 2 "), (1, "stderr", "err"), (3, "stderr", "diag"),
                   (-1, "stdout", "plain [1,x] text"), (-1, "stderr", "  Process name: [[20464,1],2]"),
                   (-1, "stderr", "  Exit code:    5"), (0, "stdout", "x"), (2, "stdout", "(Pdb) ")]
    assert (t.failure.rank, t.failure.what, t.failure.node) == (2, "exited with code 5", None)
    _, t = _tagged([("stderr", "mpirun noticed that process rank 3 with PID 77 on node h4 exited on signal 9 (Killed).")])
    assert (t.failure.rank, t.failure.what, t.failure.node) == (3, "was killed by signal 9 (Killed)", "h4")
    assert _tagged([("stdout", "[1,0]<stdout>: x")])[0] == [(0, "stdout", " x")]          # 4.x: the space is the rank's
    assert _tagged([("stdout", "[1,0]<stdout>: x")], (5, 0))[0] == [(0, "stdout", "x")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9999), st.sampled_from(["stdout", "stderr", "stddiag"]),
                          st.text(alphabet=st.characters(blacklist_characters="\n[", blacklist_categories=("Cs",)),
                                  max_size=12)), min_size=1, max_size=5))
def test_mpi_tagged_output_keeps_every_rank_text(pieces):
    line = "".join(f"[1,{r}]<{k}>:{text}" for r, k, text in pieces)
    out, _ = _tagged([("stdout", line)])
    joined: dict = {}
    for r, k, text in pieces:
        key = (r, "stdout" if k == "stdout" else "stderr")
        joined[key] = joined.get(key, "") + text
    last = (pieces[-1][0], "stdout" if pieces[-1][1] == "stdout" else "stderr")
    # a rank's line is its text, ended by the newline after the last tag or by the end of the run
    # (an empty chunk mid-line, which mpirun never writes, opens no line)
    assert sorted(out) == sorted((r, s, text) for (r, s), text in joined.items() if text or (r, s) == last)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_mpi_tagged_output_never_raises(text):
    out, _ = _tagged([("stderr", text)])
    assert all(isinstance(r, int) for r, _, _ in out)
