"""The trl adapter over the golden corpus (skipped when TRL is not installed in this interpreter)."""

import pytest

pytest.importorskip("trl")

from pgspec.conformance.corpus import golden  # noqa: E402
from pgspec.conformance.run.runner import (BAD_OUTCOMES, load_adapter, load_case, property_results, run_case)  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("trl")
    ok, why = a.available()
    assert ok, why
    return a


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus_has_no_unexplained_outcome(adapter, dtype):
    bad = []
    for case in golden.load_all():
        r = run_case(adapter, case, dtype, "cpu")
        if r.outcome in BAD_OUTCOMES:
            bad.append(f"{r.case_id} [{dtype}] {r.outcome}: {r.message.strip().splitlines()[-1] if r.message else ''}")
    assert not bad, "\n".join(bad[:20])


def test_declared_bug_reproduces(adapter):
    # use_bias_correction_kl: the product-rule gradient of exp(l - l_old) * k3 cancels at a log-ratio of 20
    r = run_case(adapter, load_case("kl.k3_unbiased/log-ratio-20"), "float32", "cpu")
    assert r.outcome == "bug", r
    assert r.declaration["kind"] == "bug"


def test_trl_delta_runs(adapter):
    r = run_case(adapter, load_case("surrogate.trl_delta/" + next(
        c["id"].split("/", 1)[1] for c in golden.load_family("surrogate")["cases"]
        if c["formula"] == "surrogate.trl_delta")), "float64", "cpu")
    assert r.outcome in ("pass", "bug", "convention"), r


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_properties_have_no_unexplained_outcome(adapter, dtype):
    pytest.importorskip("hypothesis")
    bad = [f"{r.case_id} [{dtype}] {r.outcome}: {r.message.strip().splitlines()[-1] if r.message else ''}"
           for r in property_results(adapter, dtype, "cpu", "*") if r.outcome in BAD_OUTCOMES]
    assert not bad, "\n".join(bad[:20])


def test_loss_recipe_passes(adapter):
    # TRL's dapo normalizer over the whole batch = the spec's token_mean aggregation
    r = run_case(adapter, load_case("loss.dapo/worked-example-token-mean"), "float64", "cpu")
    assert r.outcome == "pass", r


def test_declared_recipe_bug_reproduces(adapter):
    # trl#6586: at importance_sampling_level="sequence" the KL bias correction uses the sequence ratio
    r = run_case(adapter, load_case("loss.gspo/kl-k3_unbiased"), "float64", "cpu")
    assert r.outcome == "bug", r
    assert r.declaration["kind"] == "bug"


def test_masked_nan_reaches_trl_and_is_a_bug(adapter):
    # masked positions reach TRL as given; its mask product lets NaN/inf there into the gradient
    r = run_case(adapter, load_case("surrogate.ppo_clip/masked-nan-inf"), "float64", "cpu")
    assert r.outcome == "bug", r
    assert "nan" in r.message.lower()


def test_outside_a_capability_is_not_applicable(adapter):
    # several prompt groups under prompt_mean: TRL's dapo normalizer pools the batch
    r = run_case(adapter, load_case("loss.dapo/worked-example-prompt-mean"), "float64", "cpu")
    assert r.outcome == "not-applicable", r


def test_gmpo_trainer_is_called(adapter):
    # the experimental GMPOTrainer._compute_loss: the spec's worked example passes
    r = run_case(adapter, load_case("loss.gmpo/worked-example"), "float64", "cpu")
    assert r.outcome == "pass", r
