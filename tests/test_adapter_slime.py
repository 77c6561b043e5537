"""The slime adapter, loaded from a checkout (PGSPEC_SLIME_SOURCE); skips cleanly without one.

Recipe: adapters/slime/README.md.  Cases run in the adapter's own worker process (the isolated
mode); the context-parallel check spawns its own gloo processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pgspec.conformance.run import runner

SOURCE = os.environ.get("PGSPEC_SLIME_SOURCE")


def test_unavailable_without_a_checkout_names_the_clone_command(monkeypatch):
    monkeypatch.delenv("PGSPEC_SLIME_SOURCE", raising=False)
    ok, why = runner.load_adapter("slime").available()
    assert not ok
    assert "git clone https://github.com/THUDM/slime" in why
    assert "624b824a898ab0ec1fcb4d373004c7f3852bf515" in why


needs_source = pytest.mark.skipif(not SOURCE, reason="no slime checkout: set PGSPEC_SLIME_SOURCE (adapters/slime/README.md)")


def _isolated(env=None):
    from pgspec.conformance.run.isolated import IsolatedAdapter

    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        return IsolatedAdapter(sys.executable, "slime")
    finally:
        os.environ.clear()
        os.environ.update(old)


@pytest.fixture(scope="module")
def adapter():
    a = _isolated()
    ok, why = a.available()
    if not ok:
        pytest.skip(why)
    yield a
    a.close()


def _run(adapter, case_id, dtype):
    return adapter.run_case(runner.load_case(case_id), dtype, "cpu")


@needs_source
@pytest.mark.parametrize("case_id", ["surrogate.ppo_clip/padded-batch", "surrogate.ppo_clip/dapo-clip-higher",
                                     "surrogate.dual_clip/bound-binds", "loss.gspo/worked-example",
                                     "agg.sample_mean/worked", "dist.cp_reduce/sample_mean-thd-c2"])
def test_cases_pass_or_are_declared_in_float32(adapter, case_id):
    r = _run(adapter, case_id, "float32")
    assert r.outcome in ("pass", "bug", "convention"), r.message
    if case_id.startswith("surrogate."):
        assert r.outcome == "pass", r.message
    if r.outcome == "convention":   # the empty sample counted in step_global_batch_size, a row count
        assert r.declaration["cause"] == "empty-rows-in-row-count", r.declaration


@needs_source
@pytest.mark.parametrize("case_id", ["mask.opsm/token-gate-slime-1917", "mask.opsm/token-gate-token-advantages"])
def test_opsm_token_gate_passes(adapter, case_id):
    # compute_opsm_mask gates each token by its own advantage: opsm advantage_gate = token, a capability
    assert _run(adapter, case_id, "float32").outcome == "pass"


@needs_source
def test_opsm_divergence_from_the_trainers_old_logprobs_is_a_convention(adapter):
    # slime-1917's failure was never the per-token gate: loss_function measures the OPSM divergence
    # from the PPO ratio's old log-probs (here equal to the current ones), so nothing is masked
    r = _run(adapter, "loss.grpo/slime-1917-token-gate", "float32")
    assert r.outcome == "convention", r.message
    assert r.declaration["cause"] == "formula-variant"


@needs_source
def test_eager_default_never_returns_a_stale_float(adapter):
    # eps_high 0.2 first, then 0.28: eager slime gives each its own result
    assert _run(adapter, "surrogate.ppo_clip/padded-batch", "float64").outcome == "pass"
    r = _run(adapter, "surrogate.ppo_clip/dapo-clip-higher", "float64")
    assert r.outcome == "pass", r.message


@needs_source
def test_compiled_specialized_path_is_not_stale():
    a = _isolated({"PGSPEC_SLIME_COMPILE": "specialize"})
    try:
        assert "specialize" in a.version
        assert _run(a, "surrogate.ppo_clip/padded-batch", "float64").outcome == "pass"
        r = _run(a, "surrogate.ppo_clip/dapo-clip-higher", "float64")
        assert r.outcome == "pass", r.message
    finally:
        a.close()


@needs_source
def test_gspo_and_opsm_under_cp2_over_gloo_add_up_to_cp1():
    code = r'''
import sys, torch
from pgspec.adapters.slime import cp_gloo
if __name__ == "__main__":
    g = torch.Generator().manual_seed(0)
    mask = [[1,1,1,0,0,0,0],[1,1,1,1,1,1,1],[1,1,0,0,0,0,0]]
    lp = -torch.rand(3, 7, generator=g, dtype=torch.float64) * 2
    old = lp + 0.3 * torch.randn(3, 7, generator=g, dtype=torch.float64)
    data = dict(lp=lp.tolist(), old=old.tolist(), adv=[1.0, -0.5, 2.0], mask=mask)
    for cfg in [dict(estimator="gspo", eps_low=0.2, eps_high=0.28, opsm_delta=None),
                dict(estimator="grpo", eps_low=0.2, eps_high=0.28, opsm_delta=0.01)]:
        ranks, whole = cp_gloo.run(sys.argv[1], data, cfg, cp_size=2, timeout=300)
        assert len(ranks) == 2 and all(abs(v) > 1e-6 for v in ranks.values()), ranks
        assert abs(sum(ranks.values()) - whole) <= 1e-12 * max(1.0, abs(whole)), (cfg, ranks, whole)
    print("ok")
'''
    out = subprocess.run([sys.executable, "-c", code, SOURCE], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_recorded_reports_name_the_current_corpus():
    from pathlib import Path

    from pgspec.conformance.verdicts import matrix

    docs = Path(__file__).resolve().parent.parent / "docs" / "conformance"
    for name in ("slime.md", "slime-pr2060.md", "slime-pr2090.md"):
        committed = matrix.committed_digest(docs / name)
        assert committed is not None, f"docs/conformance/{name} is missing or names no corpus digest"
        assert committed == matrix.corpus_digest(), (
            f"docs/conformance/{name} was recorded against another golden corpus: rerun the recorded run "
            "(adapters/slime/README.md) and commit the report")
