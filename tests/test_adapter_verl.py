"""The verl adapter over the golden corpus (runs only where verl 0.9.1 is installed: ci/install-verl.sh)."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402

from pgspec.conformance.run.runner import BAD_OUTCOMES, load_adapter, load_case, run_case, select_cases  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("verl")
    ok, why = a.available()
    if not ok:
        pytest.skip(why)
    return a


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus_has_no_fail_error_or_stale_deviation(adapter, dtype):
    bad = []
    for case in select_cases("*"):
        r = run_case(adapter, case, dtype, "cpu")
        if r.outcome in BAD_OUTCOMES:
            bad.append(f"{r.case_id} [{dtype}] {r.outcome}: {r.message.strip().splitlines()[-1][:200]}")
    assert not bad, "\n".join(bad)


def test_declared_bug_reproduces(adapter):
    # GSPO: a -inf old log-prob at a masked position makes verl's loss NaN (deviations.toml, kind "bug")
    r = run_case(adapter, load_case("surrogate.gspo/masked-nan-inf"), "float64", "cpu")
    assert r.outcome == "bug", r.message
    assert r.declaration["kind"] == "bug"


def test_icepop_all_rejected_crash_reproduces(adapter):
    r = run_case(adapter, load_case("is.sequence.mask/log-ratio-20"), "float64", "cpu")
    assert r.outcome == "bug"  # a rule with expect = "error"
    assert "ZeroDivisionError" in r.message


def test_vanilla_always_dual_clips():
    """Why surrogate.ppo_clip maps to clip_ratio_c = +inf: verl's default config dual-clips at 3."""
    from pgspec.adapters.verl.impl import actor_config
    from verl.trainer.ppo import core_algos

    old = torch.zeros(1, 1, dtype=torch.float64)
    logp = torch.full((1, 1), math.log(5.0), dtype=torch.float64)
    adv = -torch.ones(1, 1, dtype=torch.float64)
    mask = torch.ones(1, 1, dtype=torch.bool)
    fn = core_algos.get_policy_loss_fn("vanilla")
    default, _ = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, config=actor_config())
    plain, _ = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                  config=actor_config(clip_ratio_c=float("inf")))
    assert default.item() == pytest.approx(3.0)
    assert plain.item() == pytest.approx(5.0)


def test_param_map_covers_every_capability(adapter):
    assert set(adapter.param_map) >= adapter.capabilities()
    assert adapter.version == "0.9.1"


def test_loss_recipe_goes_through_ppo_loss(adapter):
    """loss.* is one call of verl's actor loss (workers/utils/losses.ppo_loss) and matches the reference."""
    from verl.workers.utils import losses

    calls = []
    original = losses.ppo_loss
    losses.ppo_loss = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        r = run_case(adapter, load_case("loss.grpo/worked-example"), "float64", "cpu")
    finally:
        losses.ppo_loss = original
    assert calls and r.outcome == "pass", r.message


def test_loss_empty_row_convention_reproduces(adapter):
    # verl's trainer passes global_batch_size = every row (empty ones too) to agg_loss (kind "convention")
    r = run_case(adapter, load_case("loss.grpo/empty-sequence"), "float64", "cpu")
    assert r.outcome == "convention", r.message
    assert r.declaration["kind"] == "convention"
