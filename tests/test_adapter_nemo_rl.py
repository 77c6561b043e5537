"""The NeMo-RL adapter, loaded from a checkout (PGSPEC_NEMO_RL_SOURCE); skips cleanly without one.

Recipe: adapters/nemo_rl/README.md.  Every case runs in the adapter's own worker process (the
isolated mode), as `pgspec run --adapter nemo_rl --source PATH` does, so NeMo-RL's stand-ins never
reach this test process."""

from __future__ import annotations

import os
import sys

import pytest

from pgspec.conformance.run import runner

SOURCE = os.environ.get("PGSPEC_NEMO_RL_SOURCE")


def test_unavailable_without_a_checkout_names_the_clone_command(monkeypatch):
    monkeypatch.delenv("PGSPEC_NEMO_RL_SOURCE", raising=False)
    a = runner.load_adapter("nemo_rl")
    ok, why = a.available()
    assert not ok
    assert "git clone https://github.com/NVIDIA-NeMo/RL" in why
    assert "7ea279abfbeb698b092856d0dab61e7cf39bc909" in why
    assert "nemo_rl" not in {m.split(".")[0] for m in sys.modules if m.startswith("nemo_rl")}


def test_a_directory_that_is_no_checkout_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PGSPEC_NEMO_RL_SOURCE", str(tmp_path))
    ok, why = runner.load_adapter("nemo_rl").available()
    assert not ok and "not a NeMo-RL checkout" in why


needs_source = pytest.mark.skipif(not SOURCE, reason="no NeMo-RL checkout: set PGSPEC_NEMO_RL_SOURCE (adapters/nemo_rl/README.md)")


@pytest.fixture(scope="module")
def adapter():
    from pgspec.conformance.run.isolated import IsolatedAdapter

    a = IsolatedAdapter(sys.executable, "nemo_rl")
    ok, why = a.available()
    if not ok:
        pytest.skip(why)
    yield a
    a.close()


def _run(adapter, case_id, dtype):
    return adapter.run_case(runner.load_case(case_id), dtype, "cpu")


@needs_source
def test_version_names_the_commit(adapter):
    assert adapter.version.startswith("git:")


@needs_source
@pytest.mark.parametrize("case_id", ["surrogate.ppo_clip/padded-batch", "surrogate.dual_clip/bound-binds",
                                     "kl.k3/two-tokens", "loss.bnpo/worked-example", "is.token.truncate/two-sided"])
def test_cases_pass_in_float32(adapter, case_id):
    r = _run(adapter, case_id, "float32")
    assert r.outcome == "pass", r.message


@needs_source
def test_float64_mean_carries_the_declared_epsilon(adapter):
    # masked_mean divides by D + 1e-8: a float64 mismatch of relative 1e-8, declared as a convention
    r = _run(adapter, "surrogate.ppo_clip/padded-batch", "float64")
    assert r.outcome == "convention", r.message
    assert abs(float(r.first_failure["got"]) + 1.2) < 1e-7


@needs_source
def test_masked_nan_is_a_declared_bug(adapter):
    r = _run(adapter, "loss.bnpo/masked-nan-inf", "float32")
    assert r.outcome == "bug", r.message
    assert "nan" in r.first_failure["got"].lower()


@needs_source
def test_empty_sequence_counted_in_the_sample_mean_is_a_declared_bug(adapter):
    r = _run(adapter, "loss.grpo/empty-sequence", "float32")
    assert r.outcome == "bug", r.message


def test_recorded_reports_name_the_current_corpus():
    from pathlib import Path

    from pgspec.conformance.verdicts import matrix

    docs = Path(__file__).resolve().parent.parent / "docs" / "conformance"
    for name in ("nemo_rl.md", "nemo_rl-pr2269.md"):
        committed = matrix.committed_digest(docs / name)
        assert committed is not None, f"docs/conformance/{name} is missing or names no corpus digest"
        assert committed == matrix.corpus_digest(), (
            f"docs/conformance/{name} was recorded against another golden corpus: rerun the recorded run "
            "(adapters/nemo_rl/README.md) and commit the report")
