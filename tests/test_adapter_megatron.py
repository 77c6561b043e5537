"""The Megatron-LM RL adapter, loaded from a checkout (PGSPEC_MEGATRON_SOURCE); skips cleanly without one."""

from __future__ import annotations

import os
import sys

import pytest

from pgspec.conformance.run import runner

SOURCE = os.environ.get("PGSPEC_MEGATRON_SOURCE")


def test_unavailable_without_a_checkout_names_the_clone_command(monkeypatch):
    monkeypatch.delenv("PGSPEC_MEGATRON_SOURCE", raising=False)
    ok, why = runner.load_adapter("megatron").available()
    assert not ok
    assert "git clone https://github.com/NVIDIA/Megatron-LM" in why
    assert "d98e8a64ddf34856e74b24714e3bedb2f5a39553" in why


needs_source = pytest.mark.skipif(not SOURCE, reason="no Megatron-LM checkout: set PGSPEC_MEGATRON_SOURCE (adapters/megatron/README.md)")


def _isolated(env):
    from pgspec.conformance.run.isolated import IsolatedAdapter

    old = dict(os.environ)
    os.environ.update(env)
    try:
        return IsolatedAdapter(sys.executable, "megatron")
    finally:
        os.environ.clear()
        os.environ.update(old)


@needs_source
@pytest.mark.parametrize("layout", ["unpacked", "packed"])
@pytest.mark.parametrize("case_id", ["surrogate.ppo_clip/sequence-advantages", "kl.k3/two-tokens", "is.token.truncate/spec-example"])
def test_cases_pass(layout, case_id):
    a = _isolated({"PGSPEC_MEGATRON_LAYOUT": layout})
    try:
        for dtype in ("float64", "float32"):
            r = a.run_case(runner.load_case(case_id), dtype, "cpu")
            assert r.outcome == "pass", r.message
    finally:
        a.close()


@needs_source
def test_aggregation_is_declared_unsupported():
    a = _isolated({})
    try:
        r = a.run_case(runner.load_case("loss.grpo/worked-example"), "float32", "cpu")
        assert r.outcome == "unsupported"
        assert "train_rl.py" in r.message or "CUDA" in r.message
    finally:
        a.close()


def test_recorded_reports_name_the_current_corpus():
    from pathlib import Path

    from pgspec.conformance.verdicts import matrix

    docs = Path(__file__).resolve().parent.parent / "docs" / "conformance"
    for name in ("megatron.md", "megatron-packed.md"):
        committed = matrix.committed_digest(docs / name)
        assert committed is not None, f"docs/conformance/{name} is missing or names no corpus digest"
        assert committed == matrix.corpus_digest(), (
            f"docs/conformance/{name} was recorded against another golden corpus: rerun the recorded run "
            "(adapters/megatron/README.md) and commit the report")
