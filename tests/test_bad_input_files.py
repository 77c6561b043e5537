"""Every file pgspec reads is checked before it is opened (issue 39, principle 2), by class:

- a user's file (a golden family file, the MANIFEST, a presets file, a declarations file) that is a
  directory, a FIFO (whose read would block forever), larger than its bound, or not UTF-8 text is one
  usage error naming the file (and the line, for text): exit 2, never a hang or exit 3;
- a damaged cache entry (truncated, garbage, empty, a changed value under its checksum, a directory
  or a FIFO in its place) is a miss: evaluated again, giving exactly the fresh result, never a hang
  or a wrong value.

A FIFO that pgspec opened for reading would block the test forever: each test that makes one runs
under an alarm that turns a hang into a failure."""

from __future__ import annotations

import json
import re
import os
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from pgspec.conformance.base import files
from pgspec.conformance.corpus import golden, namemap
from pgspec.conformance.verdicts.declarations import DeclarationError, load as load_declarations
from pgspec.conformance.corpus.golden import GoldenError
from pgspec.conformance.corpus.namemap import PresetError


@contextmanager
def no_hang(seconds: int = 30):
    def alarm(signum, frame):
        raise TimeoutError(f"pgspec blocked for {seconds} s reading the file")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _replace(path: Path, how: str) -> None:
    """Put ``how`` in the place of the file ``path``."""
    data = path.read_bytes() if path.exists() else b""
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(bytes(range(256)) * 4)
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "directory":
        path.unlink()
        path.mkdir()
        (path / "inside").write_text("x")
    elif how == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif how == "symlink-to-directory":
        path.unlink()
        path.symlink_to(path.parent)
    else:
        raise AssertionError(how)


NOT_A_FILE = {"directory": "is a directory, not a regular file", "fifo": "is a FIFO (named pipe), not a regular file",
              "symlink-to-directory": "is a directory, not a regular file"}


# files.py itself ----------------------------------------------------------------------------------

@pytest.mark.parametrize("how", sorted(NOT_A_FILE))
def test_check_regular_refuses_what_is_not_a_regular_file(tmp_path, how):
    p = tmp_path / "f.toml"
    p.write_text("x")
    _replace(p, how)
    with no_hang(), pytest.raises(files.FileProblem, match=f"^{p}: {re.escape(NOT_A_FILE[how])}"):
        files.read_text(p)


def test_a_missing_file(tmp_path):
    with pytest.raises(files.FileProblem, match=f"^{tmp_path}/none.toml: no such file"):
        files.read_text(tmp_path / "none.toml")


def test_a_file_past_its_bound(tmp_path):
    p = tmp_path / "big.toml"
    p.write_bytes(b"a" * 101)
    with pytest.raises(files.FileProblem, match=f"^{p}: 101 bytes, more than the 100 bytes such a file may have"):
        files.read_text(p, max_bytes=100)
    p.write_bytes(b"a" * 100)
    assert files.read_text(p, max_bytes=100) == "a" * 100


@pytest.mark.parametrize("data, line, column", [(b"\xff", 1, 1), (b"ok\nok\n  \xc3(", 3, 3), (b"a\n\n\n\x80b", 4, 1),
                                                (b"x = 1\ny = '\xed\xa0\x80'\n", 2, 6)])
def test_text_that_is_not_utf8_names_the_line_and_column(tmp_path, data, line, column):
    p = tmp_path / "t.toml"
    p.write_bytes(data)
    with pytest.raises(files.FileProblem, match=f"^{p}, line {line}, column {column}: not UTF-8 text"):
        files.read_text(p)


def test_a_byte_order_mark_is_allowed(tmp_path):
    p = tmp_path / "t.toml"
    p.write_bytes(b"\xef\xbb\xbfa = 1\n")
    assert files.read_text(p) == "a = 1\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text("a = 1")
    p.chmod(0)
    with pytest.raises(files.FileProblem, match="cannot be read"):
        files.read_text(p)


# a user's files: exit 2 naming the file ---------------------------------------------------------

@pytest.fixture
def golden_dir(tmp_path):
    d = tmp_path / "golden"
    d.mkdir()
    for p in golden.GOLDEN_DIR.iterdir():
        shutil.copy(p, d / p.name)
    return d


@pytest.mark.parametrize("how", sorted(NOT_A_FILE))
def test_a_golden_file_that_is_not_a_file(golden_dir, how):
    _replace(golden_dir / "kl.json", how)
    with no_hang(), pytest.raises(GoldenError, match=f"^{golden_dir}/kl.json: {re.escape(NOT_A_FILE[how])}"):
        golden.load_family("kl", golden_dir)


def test_a_golden_file_past_its_bound(golden_dir, monkeypatch):
    monkeypatch.setattr(files, "MAX_GOLDEN_BYTES", 1000)
    with pytest.raises(GoldenError, match=f"^{golden_dir}/kl.json: \\d+ bytes, more than the 1000 bytes"):
        golden.load_family("kl", golden_dir)


@pytest.mark.parametrize("how, message", [("directory", "is a directory, not a regular file"),
                                          ("fifo", "is a FIFO"), ("garbage", ", line 2, column 118: not UTF-8 text"),
                                          ("truncated", "not valid JSON")])
def test_a_damaged_manifest(golden_dir, how, message):
    _replace(golden_dir / "MANIFEST", how)
    with no_hang(), pytest.raises(GoldenError, match=f"^{golden_dir}/MANIFEST:? ?{message}"):
        golden.load_manifest(golden_dir)


@pytest.fixture
def presets_dir(tmp_path, monkeypatch):
    d = tmp_path / "presets"
    shutil.copytree(namemap.PRESETS_DIR, d)
    monkeypatch.setattr(namemap, "PRESETS_DIR", d)
    return d


@pytest.mark.parametrize("how", sorted(NOT_A_FILE))
def test_a_presets_file_that_is_not_a_file(presets_dir, how):
    _replace(presets_dir / "verl.toml", how)
    with no_hang(), pytest.raises(PresetError, match=f"^conformance/presets/verl.toml: {re.escape(NOT_A_FILE[how])}"):
        namemap.load_all()


def test_a_presets_file_past_its_bound(presets_dir, monkeypatch):
    monkeypatch.setattr(namemap, "MAX_PRESETS_BYTES", 10)
    with pytest.raises(PresetError, match=r"^conformance/presets/\w+.toml: \d+ bytes, more than the 10 bytes"):
        namemap.load_all()


def test_a_presets_file_with_a_bad_byte_names_its_line(presets_dir):
    p = presets_dir / "verl.toml"
    text = p.read_bytes()
    p.write_bytes(text + b"\n# caf\xe9\n")
    line = text.count(b"\n") + 2
    with pytest.raises(PresetError, match=f"^conformance/presets/verl.toml, line {line}, column 6: not UTF-8 text"):
        namemap.load_all()


def test_a_presets_directory_named_toml_in_the_cli_is_exit_2(presets_dir, capsys, monkeypatch):
    from pgspec.conformance.cli import main

    (presets_dir / "zz.toml").mkdir()
    monkeypatch.setenv("PGSPEC_JOBS", "1")
    code = main(["golden", "verify"])
    err = capsys.readouterr().err
    assert code == 2 and "conformance/presets/zz.toml: is a directory, not a regular file" in err
    assert "internal error" not in err and "Traceback" not in err


DECLARATIONS = "[[convention]]\nname = \"x\"\n"


@pytest.mark.parametrize("how", sorted(NOT_A_FILE) + ["bad-byte", "too-large"])
def test_a_declarations_file_that_cannot_be_read(tmp_path, monkeypatch, how):
    p = tmp_path / "deviations.toml"
    p.write_text(DECLARATIONS)
    if how == "bad-byte":
        p.write_bytes(b"# ok\n# \xff\n")
        expected = "deviations.toml, line 2, column 3: not UTF-8 text"
    elif how == "too-large":
        p.write_bytes(b"#" * (files.MAX_CONFIG_BYTES + 1))
        expected = f"deviations.toml: {files.MAX_CONFIG_BYTES + 1} bytes, more than"
    else:
        _replace(p, how)
        expected = f"deviations.toml: {re.escape(NOT_A_FILE[how])}"
    with no_hang(), pytest.raises(DeclarationError, match=expected) as e:
        load_declarations(p)
    assert "Traceback" not in str(e.value)


def test_a_declarations_file_extending_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "base.toml")
    p = tmp_path / "deviations.toml"
    p.write_text('extends = "base.toml"\n')
    with no_hang(), pytest.raises(DeclarationError, match="base.toml"):
        load_declarations(p)


# damaged cache entries: a miss, exactly the fresh result, never a hang ----------------------------

DAMAGE = ["truncated", "garbage", "empty", "directory", "fifo", "wrong-checksum"]


def _record_entries(root: Path) -> list[Path]:
    return sorted(p for p in (root / "golden").rglob("*.json"))


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_golden_record_entry_is_evaluated_again(tmp_path, monkeypatch, how):
    from pgspec.conformance.corpus.cases import all_cases

    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    cases = [c for c in all_cases() if c.id.startswith("ratio.token/")][:2]
    fresh = golden._generate_records(cases, cache=True, reuse=False)
    entries = _record_entries(tmp_path)
    assert len(entries) == len(cases)
    for path in entries:
        if how == "wrong-checksum":   # valid JSON, a value changed under the checksum
            entry = json.loads(path.read_text())
            entry["record"]["description"] = "a wrong value"
            path.write_text(json.dumps(entry))
        else:
            _replace(path, how)
    with no_hang():
        again = golden._generate_records(cases)
    assert golden._STATS == {"cached": 0, "evaluated": len(cases)}
    assert json.dumps(again) == json.dumps(fresh)


def test_an_intact_golden_record_entry_is_used(tmp_path, monkeypatch):
    """The other side of the damage tests: an entry as written is read back."""
    from pgspec.conformance.corpus.cases import all_cases

    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    cases = [c for c in all_cases() if c.id.startswith("ratio.token/")][:2]
    golden._generate_records(cases, cache=True, reuse=False)
    golden._generate_records(cases)
    assert golden._STATS == {"cached": len(cases), "evaluated": 0}


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "directory", "fifo"])
def test_a_damaged_prepared_entry_is_prepared_again(tmp_path, monkeypatch, how):
    import numpy as np

    from pgspec.conformance.judge import prepared_cache as compare     # the prepared references' disk cache

    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(compare, "_FAMILIES", {})
    case = next(c for c in golden.load_all() if c["formula"] == "kl.k3" and not c.get("expect_error"))
    key = next(iter(case["outputs"]))
    compare._loaded_entry(case, key, False)
    (path,) = compare._prepared_dir().glob("*.npz")
    _replace(path, how)
    compare._FAMILIES.clear()
    with no_hang():
        got = compare._loaded_entry(case, key, False)
    want = compare.prepare(case["outputs"][key], case["scale"].get(key))
    assert np.array_equal(got.r_hi, want.r_hi) and np.array_equal(got.r_lo, want.r_lo)


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "directory", "fifo", "wrong-checksum"])
def test_a_damaged_property_reference_entry_is_a_miss(tmp_path, monkeypatch, how):
    from mpmath import mp, mpf

    from pgspec.conformance.run.properties import _common as C

    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    with mp.workdps(60):
        result = {"value": mpf(1) / 3, "grad": {}, "scale": {"value": mpf(1) / 3}}
    key = C._key("agg.token_mean", {"values": [[1.0]], "mask": [[True]]}, {})
    C._disk_put(key, result)
    path = C._disk_path(key)
    assert C._disk_get(key)["value"] == result["value"]
    if how == "wrong-checksum":
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 1
        path.write_bytes(bytes(raw))
    else:
        _replace(path, how)
    with no_hang():
        assert C._disk_get(key) is None


@pytest.mark.parametrize("value, why", [(0.1, "not exactly representable in bfloat16"),
                                        ("-1.0009765625", "not exactly representable in bfloat16")])
def test_a_case_definition_the_corpus_cannot_hold_is_exit_2(monkeypatch, capsys, tmp_path, value, why):
    """A contributor's case with a real input that is not bfloat16-exact: `pgspec golden generate`
    names the case and the input and exits 2, writing nothing (it was an internal error, exit 3)."""
    from pgspec.conformance.cli import main
    from pgspec.conformance.corpus import cases as case_defs
    from pgspec.conformance.corpus import golden

    (ok,) = [c for c in case_defs.all_cases() if c.id == "kl.k1/log-ratio-20"]
    bad = case_defs.Case(**{**ok.__dict__, "id": "kl.k1/not-bf16",
                            "inputs": {**ok.inputs, "logprobs": [[value] + list(ok.inputs["logprobs"][0][1:])]
                                       + [list(r) for r in ok.inputs["logprobs"][1:]]}})
    monkeypatch.setattr(golden, "all_cases", lambda: [ok, bad])
    monkeypatch.setattr(golden, "GOLDEN_DIR", tmp_path)
    monkeypatch.setenv("PGSPEC_JOBS", "1")
    code = main(["golden", "generate"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "case kl.k1/not-bf16: input logprobs[0][0]" in err and why in err
    assert "internal error" not in err and not list(tmp_path.iterdir())
