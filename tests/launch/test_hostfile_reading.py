"""The one hostfile reader of every entry point (issue 31 §4, issue 35 §1): bounded, depth-safe, and
tolerant of the fields MLX ignores; fuzzed with hypothesis."""

from __future__ import annotations

import json
import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlx_jupyter import safe_read
from mlx_jupyter.hostfile import (HOST_FIELDS, TOP_FIELDS, Host, Hostfile, HostfileError, dumps_hostfile,
                                  loads_hostfile, merge_settings, read_hostfile)
from mlx_jupyter.suggest import edit_distance, typo_of

HOSTS = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "mac-2", "ips": ["10.0.0.2"], "rdma": []}]


def write(tmp_path, data, name="h.json") -> str:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


# ------------------------------------------------------------------ unknown fields (issue 35 §1) --

def test_unknown_fields_at_both_levels_are_ignored_with_one_warning_naming_them(tmp_path):
    path = write(tmp_path, {"note": "lab rack 3", "backend": "ring", "hosts": [
        {**HOSTS[0], "comment": "the left one"}, {**HOSTS[1], "comment": "right", "owner": "ann"}]})
    hf = read_hostfile(path)
    assert [h.ssh for h in hf.hosts] == ["127.0.0.1", "mac-2"] and hf.backend == "ring"
    assert len(hf.warnings) == 1, hf.warnings
    (w,) = hf.warnings
    assert w.startswith(f"hostfile {path!r}: ignored unknown field(s) 'note' (top level), 'comment' (hosts 0, 1), "
                        "'owner' (host 1), as MLX ignores them"), w
    # the warning reaches every entry point through the one merge of settings (launch, Cluster)
    assert merge_settings(hf, f"hostfile {path}").notices[0] == w


def test_a_file_without_unknown_fields_warns_nothing(tmp_path):
    assert read_hostfile(write(tmp_path, {"backend": "ring", "envs": [], "hosts": HOSTS})).warnings == []
    assert read_hostfile(write(tmp_path, HOSTS)).warnings == []   # backend and envs stay optional


@pytest.mark.parametrize("text, typo, meant", [
    ({"hosts": HOSTS, "backnd": "ring"}, "backnd", "backend"),
    ({"hosts": HOSTS, "env": ["A=1"]}, "env", "envs"),
    ({"hots": HOSTS}, "hots", "hosts"),
    ([{"ssh": "a", "ip": ["10.0.0.1"]}], "ip", "ips"),
    ([{"ssh": "a", "rdam": []}], "rdam", "rdma"),
    ([{"sh": "a"}], "sh", "ssh"),
    ([{"SSH": "a"}], "SSH", "ssh"),
])
def test_near_misses_of_known_fields_are_refused_with_did_you_mean(tmp_path, text, typo, meant):
    with pytest.raises(HostfileError, match=f"unknown field '{typo}': did you mean '{meant}'"):
        read_hostfile(write(tmp_path, text))


@pytest.mark.parametrize("key", ["comment", "note", "id", "name", "notes", "user", "port", "tags", "x"])
def test_annotations_are_not_taken_for_typos(key):
    assert typo_of(key, HOST_FIELDS) is None and typo_of(key, TOP_FIELDS) is None


def test_rdma_is_always_written_as_mlx_writes_it():
    hf = Hostfile([Host("a", ["10.0.0.1"]), Host("b", ["10.0.0.2"], [None, "rdma_en3"])])
    for form in ("list", "object"):
        data = json.loads(dumps_hostfile(hf, form))
        hosts = data if form == "list" else data["hosts"]
        assert [h["rdma"] for h in hosts] == [[], [None, "rdma_en3"]]
    assert json.loads(dumps_hostfile(hf, "object"))["backend"] == ""


# ------------------------------------------------------------------ no hang, no traceback (31 §4) --

def test_a_fifo_is_refused_at_once_never_waited_on(tmp_path):
    fifo = tmp_path / "hosts.json"
    os.mkfifo(fifo)
    with pytest.raises(HostfileError, match="hosts.json' is not a regular file .*give a JSON file"):
        read_hostfile(fifo, timeout=30)   # nobody writes it: a blocking open would wait for good


@pytest.mark.parametrize("content, match", [
    (b"[" * 100000, "nested deeper than 32 levels"),
    (b'[{"ssh": "a", "note": ' + b"[" * 900 + b"]" * 900 + b"}]", "nested deeper than 32 levels"),
    (b" " * (safe_read.MAX_BYTES + 1), "larger than 1024 KiB"),
    (b"\xff\xfe[]", "not UTF-8 text"),
    (b"1" * 5000, "not valid JSON"),
    (b"[{]", "not valid JSON .line 1, column 3"),
])
def test_bad_content_is_named_never_a_traceback(tmp_path, content, match):
    path = tmp_path / "h.json"
    path.write_bytes(content)
    with pytest.raises(HostfileError, match=match) as err:
        read_hostfile(path)
    assert str(err.value).startswith(f"hostfile {str(path)!r}")


def test_a_directory_and_a_missing_file_are_named(tmp_path):
    with pytest.raises(HostfileError, match="is not a regular file"):
        read_hostfile(tmp_path)
    with pytest.raises(HostfileError, match="nope.json': cannot open it .No such file"):
        read_hostfile(tmp_path / "nope.json")


def test_a_read_that_hangs_is_given_up_after_the_timeout(tmp_path, monkeypatch):
    """A hung network mount (which cannot be made here), stood in for by a read blocking until released."""
    release = threading.Event()
    monkeypatch.setattr(safe_read, "read_now", lambda *a, **k: release.wait(30) and "[]")
    try:
        with pytest.raises(HostfileError, match=r"could not be read within 0.2 s .a hung network mount"):
            read_hostfile(write(tmp_path, HOSTS), timeout=0.2)
    finally:
        release.set()


# ------------------------------------------------------------------------------ properties --

_key = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=12)
_value = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                      lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                      max_leaves=6)
_unknown = st.dictionaries(_key.filter(lambda k: k.lower() not in (*TOP_FIELDS, *HOST_FIELDS)), _value, max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(top=_unknown, per_host=st.lists(_unknown, min_size=2, max_size=2))
def test_unknown_fields_round_trip_or_are_named_as_typos(tmp_path, top, per_host):
    """Extra fields either are ignored (the hosts read back as without them, one warning naming each)
    or are a near miss of a known field (refused, naming it): never anything else."""
    data = {**top, "backend": "ring", "hosts": [{**h, **extra} for h, extra in zip(HOSTS, per_host)]}
    path = write(tmp_path, data)
    clean = read_hostfile(write(tmp_path, {"backend": "ring", "hosts": HOSTS}, "clean.json"))
    try:
        hf = read_hostfile(path)
    except HostfileError as exc:
        assert "did you mean" in str(exc) and str(exc).startswith(f"hostfile {path!r}"), exc
        return
    assert hf == clean
    named = [*top, *dict.fromkeys(k for extra in per_host for k in extra)]   # as the warning lists them
    assert len(hf.warnings) == (1 if named else 0)
    if not named:
        return
    for key in named[:8]:
        assert repr(key)[:30].rstrip("'") in hf.warnings[0]
    assert (f"and {len(named) - 8} more" in hf.warnings[0]) == (len(named) > 8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_bytes_give_a_hostfile_or_an_error_naming_the_file(tmp_path, content):
    path = tmp_path / "fuzz.json"
    path.write_bytes(content)
    try:
        read_hostfile(path)
    except HostfileError as exc:
        assert str(exc).startswith(f"hostfile {str(path)!r}"), exc


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 3000), st.sampled_from(["[", "{\"a\":", "[{\"ssh\":"]))
def test_any_nesting_gives_a_hostfile_error(depth, opener):
    try:
        loads_hostfile(opener * depth, "hostfile 'deep.json'")
    except HostfileError as exc:
        assert str(exc).startswith("hostfile 'deep.json'")


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(min_codepoint=97, max_codepoint=122), max_size=8),
       st.text(st.characters(min_codepoint=97, max_codepoint=122), max_size=8))
def test_edit_distance_is_a_distance(a, b):
    d = edit_distance(a, b)
    assert d == edit_distance(b, a) and (d == 0) == (a == b) and abs(len(a) - len(b)) <= d <= max(len(a), len(b))
