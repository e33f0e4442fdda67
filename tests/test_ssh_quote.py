"""Quoting: every value reaching a remote shell arrives literally (checked with a real /bin/sh)."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_jupyter.launch.script import MARKER, rank_script
from mlx_jupyter.ssh import QuotingError, export, join, quote, sh_command, split_destination

HOSTILE = ["a'b", 'a"b', "$(touch /tmp/pwned)", "`id`", "a;b", "a\nb", "a b", "\\", "$HOME", "*", "-n", "", "'",
           "!x", "a\tb", "é ✓", "%s", "${IFS}"]
_text = st.text(alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=30)


def sh(script: str, stdin: str = "", argv0: str = "/bin/sh") -> subprocess.CompletedProcess:
    """Run a script; bytes in and out, so no newline translation hides a quoting bug."""
    res = subprocess.run([argv0, "-c", script], input=stdin.encode(), capture_output=True, timeout=20)
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
    before = set(p.name for p in __import__("pathlib").Path("/tmp").glob("mlx-jupyter.*"))
    res = sh(rank_script(["true"], {}, {"F": "x"}, str(tmp_path / "missing;$(x)"), True, "rank 3 on h4"))
    assert res.returncode == 125
    assert "rank 3 on h4: cannot change directory to" in res.stderr and "missing;$(x)" in res.stderr
    after = set(p.name for p in __import__("pathlib").Path("/tmp").glob("mlx-jupyter.*"))
    assert after <= before


def test_rank_script_forwards_stdin_and_exit_code():
    res = sh(rank_script(["sh", "-c", "read x; echo got:$x; exit 7"], {}, {}, None, False, "r"), stdin="hi\n")
    assert res.returncode == 7 and res.stdout.split("\n")[1] == "got:hi"
