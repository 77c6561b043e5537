"""Every value the environment supplies is checked against its documented range before any work
(issue 39, principle 1; conformance/base/settings.py, docs/bad-input.md): one line naming the variable,
its range and the value, exit 2 (pytest's usage error in the plugin); nothing is clipped, and a
PGSPEC_* name pgspec does not read is named in a warning instead of being ignored silently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgspec.conformance.base import settings
from pgspec.conformance.cli import main

ROOT = Path(__file__).resolve().parent.parent

BAD = [
    ("PGSPEC_JOBS", "abc", "PGSPEC_JOBS must be an integer from 1 to 256"),
    ("PGSPEC_JOBS", "0", "got '0'"),
    ("PGSPEC_JOBS", "257", "got '257'"),
    ("PGSPEC_JOBS", "99999999999999999999", "from 1 to 256"),
    ("PGSPEC_JOBS", "4.0", "got '4.0'"),
    ("PGSPEC_JOBS", "0x10", "got '0x10'"),
    ("PGSPEC_JOBS", "-1", "got '-1'"),
    ("PGSPEC_LIGER_RECOMPILE_LIMIT", "0", "PGSPEC_LIGER_RECOMPILE_LIMIT must be an integer from 1 to 65536"),
    ("PGSPEC_LIGER_RECOMPILE_LIMIT", "1e9", "got '1e9'"),
    ("PGSPEC_LIGER_RECOMPILE_LIMIT", "65537", "got '65537'"),
    ("PGSPEC_COMPARE", "FAST", "PGSPEC_COMPARE must be"),
    ("PGSPEC_LOGPROB_ORACLE", "triton", "PGSPEC_LOGPROB_ORACLE must be one of '', 'fused', 'torch', got 'triton'"),
    ("PGSPEC_AREAL_COMPILE", "max-autotune", "PGSPEC_AREAL_COMPILE must be one of 'eager', 'default'"),
    ("PGSPEC_SLIME_COMPILE", "yes", "PGSPEC_SLIME_COMPILE must be one of 'eager', 'specialize', 'default'"),
    ("PGSPEC_FAST_LLM_COMPILE", "Eager", "PGSPEC_FAST_LLM_COMPILE must be one of 'eager', 'default'"),
    ("PGSPEC_FAST_LLM_COMPAT", "yes", "PGSPEC_FAST_LLM_COMPAT must be one of 'off', 'pep695', got 'yes'"),
    ("PGSPEC_FAST_LLM_COMPAT", "PEP695", "got 'PEP695'"),
    ("PGSPEC_MEGATRON_LAYOUT", "thd", "PGSPEC_MEGATRON_LAYOUT must be one of 'unpacked', 'packed', got 'thd'"),
    ("PGSPEC_CACHE", "", "PGSPEC_CACHE is set but empty"),
    ("PGSPEC_CACHE", "{file}", "PGSPEC_CACHE={file}: exists and is not a folder"),
    ("PGSPEC_CACHE", "x" * 5000, "at most 4096 characters"),
    ("PGSPEC_LOG_DIR", "{file}", "PGSPEC_LOG_DIR={file}: exists and is not a folder"),
    ("PGSPEC_LOG_DIR", " ", "PGSPEC_LOG_DIR is set but empty"),
    ("PGSPEC_NEMO_RL_SOURCE", "{missing}", "PGSPEC_NEMO_RL_SOURCE={missing}: no such folder"),
    ("PGSPEC_SLIME_SOURCE", "{file}", "PGSPEC_SLIME_SOURCE={file}: exists and is not a folder"),
    ("PGSPEC_MEGATRON_SOURCE", "", "PGSPEC_MEGATRON_SOURCE is set but empty"),
    ("PGSPEC_FAST_LLM_SOURCE", "{missing}", "no such folder"),
    ("PGSPEC_FAST_LLM_PYTHON", "", "PGSPEC_FAST_LLM_PYTHON is set but empty"),
]


def _fill(text: str, tmp_path: Path) -> str:
    f = tmp_path / "a-file"
    f.write_text("x")
    return text.format(file=f, missing=tmp_path / "missing")


@pytest.mark.parametrize("name, value, expected", BAD)
def test_a_value_out_of_range_is_one_line_before_any_work(capsys, monkeypatch, tmp_path, name, value, expected):
    monkeypatch.setenv(name, _fill(value, tmp_path))
    code = main(["formulas", "--formulas", "kl.k1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", out
    assert err.splitlines() == [f"pgspec formulas: {_fill(expected, tmp_path)}"] or \
        (len(err.splitlines()) == 1 and _fill(expected, tmp_path) in err), err


GOOD = [("PGSPEC_JOBS", "1"), ("PGSPEC_JOBS", "256"), ("PGSPEC_JOBS", " 4 "), ("PGSPEC_JOBS", ""),
        ("PGSPEC_LIGER_RECOMPILE_LIMIT", "65536"), ("PGSPEC_COMPARE", "exact"), ("PGSPEC_LOGPROB_ORACLE", "torch"),
        ("PGSPEC_SLIME_COMPILE", "specialize"), ("PGSPEC_MEGATRON_LAYOUT", "packed"), ("PGSPEC_FAST_LLM_COMPAT", "pep695"), ("PGSPEC_FAST_LLM_COMPAT", "off"),
        ("PGSPEC_CACHE", "off"),
        ("PGSPEC_CACHE", "{missing}"), ("PGSPEC_LOG_DIR", "{missing}")]


@pytest.mark.parametrize("name, value", GOOD)
def test_a_value_in_range_is_accepted(capsys, monkeypatch, tmp_path, name, value):
    monkeypatch.setenv(name, _fill(value, tmp_path))
    assert settings.check_environment() == []
    assert main(["formulas", "--formulas", "kl.k1"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("name, hint", [("PGSPEC_JOB", "did you mean 'PGSPEC_JOBS'"), ("PGSPEC_CACHES", "'PGSPEC_CACHE'"),
                                        ("PGSPEC_NEMORL_SOURCE", "'PGSPEC_NEMO_RL_SOURCE'"), ("PGSPEC_ZZZ", "")])
def test_an_unknown_pgspec_variable_is_named_not_ignored(capsys, monkeypatch, name, hint):
    monkeypatch.setenv(name, "4")
    assert main(["formulas", "--formulas", "kl.k1"]) == 0
    err = capsys.readouterr().err
    assert err.startswith(f"pgspec: warning: environment variable {name} is not one pgspec reads; it is ignored")
    assert hint in err


def test_every_pgspec_variable_the_package_reads_has_a_range():
    """The class, not the cases: a PGSPEC_* name read anywhere in the package and not in
    settings.VARIABLES would be read unchecked."""
    read = set()
    for folder in ("conformance", "adapters", "reference"):
        for path in (ROOT / folder).rglob("*.py"):
            read |= set(re.findall(r"\"(PGSPEC_[A-Z0-9_]+)\"", path.read_text()))
    read -= {"PGSPEC_"}
    assert read <= set(settings.VARIABLES), sorted(read - set(settings.VARIABLES))
    assert {f"PGSPEC_{a.upper()}_SOURCE" for a in settings.CHECKOUT_ADAPTERS} <= set(settings.VARIABLES)


def test_the_plugin_refuses_a_value_out_of_range(pytester, monkeypatch):
    monkeypatch.setenv("PGSPEC_MEGATRON_LAYOUT", "thd")
    pytester.makepyfile(test_nothing="")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "--pgspec-adapter", "torch")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any(line.startswith("ERROR: PGSPEC_MEGATRON_LAYOUT must be one of 'unpacked', 'packed', got 'thd'")
               for line in result.errlines), result.errlines


pytest_plugins = ["pytester"]


def test_the_documented_limits_are_the_codes():
    """docs/bad-input.md states each range the code enforces: a changed bound changes the page too."""
    from pgspec.conformance.check import memory as check_memory
    from pgspec.conformance.base import files
    from pgspec.reference import _evaluate

    page = (ROOT / "docs" / "bad-input.md").read_text()
    for name, kind in settings.VARIABLES.items():
        if isinstance(kind, settings.Any):
            continue        # read by the CI scripts and tests
        generic = re.sub(r"PGSPEC_(%s)_" % "|".join(a.upper() for a in settings.CHECKOUT_ADAPTERS), "PGSPEC_<NAME>_", name)
        assert f"`{generic}`" in page or f"`{name}`" in page, name
        if isinstance(kind, settings.Int):
            assert f"from {kind.low} to {kind.high}" in page, name
        if isinstance(kind, settings.Choice):
            assert all(f"`{c}`" in page for c in kind.choices if c), name
    assert f"at most {_evaluate.MAX_ELEMENTS:,}" in page and f"from 15 to {_evaluate.MAX_DPS}" in page
    assert f"largest input has at least {_evaluate._progress.PROGRESS_ELEMENTS:,} elements" in page
    assert f"{check_memory.BYTES_PER_TOKEN} bytes per token" in page
    assert f"{check_memory.BYTES_PER_LOGIT} bytes per element" in page
    assert f"at most {files.MAX_GOLDEN_BYTES >> 20} MiB" in page and f"at most {files.MAX_CONFIG_BYTES >> 20} MiB" in page
    from pgspec.conformance.run import untrusted

    assert f"at most {untrusted.MAX_SECONDS} (7 days)" in page
    assert "`pytest --pgspec-case-timeout SECONDS`, ini `pgspec_case_timeout`" in page     # the plugin's limit
    assert "bad-input" in (ROOT / "docs" / "index.md").read_text()
