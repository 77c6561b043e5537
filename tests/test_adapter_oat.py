"""The oat adapter against the golden corpus (skipped unless oat-llm is installed here).

Install: bash ci/install-oat.sh VENV, then VENV/bin/python -m pytest tests/test_adapter_oat.py.
"""

from importlib import metadata

import pytest

pytest.importorskip("torch")
try:
    metadata.version("oat-llm")
except metadata.PackageNotFoundError:
    pytest.skip("oat-llm is not installed (bash ci/install-oat.sh VENV; adapters/oat/README.md)",
                allow_module_level=True)

from pgspec.conformance.corpus import golden  # noqa: E402
from pgspec.conformance.run.runner import BAD_OUTCOMES, load_adapter, load_case, run_case  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("oat")
    ok, why = a.available()
    assert ok, why
    return a


def test_declares_framework(adapter):
    assert adapter.framework.startswith("OAT")
    assert adapter.version == metadata.version("oat-llm") == "0.2.4"
    assert {"loss.grpo", "loss.dr_grpo", "surrogate.ppo_clip", "kl.k3", "agg.constant",
            "adv.group_normalized"} <= adapter.capabilities()


def test_runs_oats_own_learner(adapter):
    import sys

    run_case(adapter, load_case("loss.dr_grpo/worked-example"), "float32", "cpu")
    ppo, ops = sys.modules["oat.algorithms.ppo"], sys.modules["oat.utils.ops"]
    # the executed files are the installed wheel's, not stand-ins
    assert not getattr(ppo, "__pgspec_stand_in__", False) and not getattr(ops, "__pgspec_stand_in__", False)
    assert ppo.__file__.endswith("oat/algorithms/ppo.py")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus(adapter, dtype):
    cases = [c for c in golden.load_all() if c["formula"] in adapter.capabilities()]
    assert cases
    bad = [(r.case_id, r.outcome, r.message.splitlines()[-1] if r.message else "")
           for r in (run_case(adapter, c, dtype, "cpu") for c in cases) if r.outcome in BAD_OUTCOMES]
    assert not bad, bad


@pytest.mark.parametrize("case_id", ["loss.grpo/on-policy-pair", "loss.grpo/worked-example", "loss.dr_grpo/worked-example",
                                     "kl.k3/two-tokens", "loss.grpo/clipped-high"])
def test_cases_pass_in_float32(adapter, case_id):
    # learning_step permutes its rows: the stand-in model must hand back the rows the learner asks for
    r = run_case(adapter, load_case(case_id), "float32", "cpu")
    assert r.outcome == "pass", r.message


def test_declared_bugs_reproduce(adapter):
    r = run_case(adapter, load_case("loss.grpo/masked-nan-inf"), "float32", "cpu")
    assert r.outcome == "bug" and r.declaration["cause"] == "masked-nonfinite", r.message
    r = run_case(adapter, load_case("loss.grpo/log-ratio-200"), "float32", "cpu")
    assert r.outcome == "bug" and r.declaration["cause"] == "exp-overflow", r.message
    # float64 runs get the learner's float32 accuracy: a declared convention, not a pass
    r = run_case(adapter, load_case("loss.grpo/worked-example"), "float64", "cpu")
    assert r.outcome == "convention" and r.declaration["cause"] == "float32-compute", r.message


def test_a_mask_with_a_hole_is_unsupported(adapter):
    import torch

    from pgspec.adapters.base import Unsupported

    inputs = {"logprobs": torch.tensor([[-1.0, -2.0, -3.0]]), "old_logprobs": torch.tensor([[-1.0, -2.0, -3.0]]),
              "mask": torch.tensor([[True, False, True]]), "advantages": torch.tensor([1.0])}
    with pytest.raises(Unsupported, match="contiguous"):
        adapter.call("surrogate.ppo_clip", inputs, {})
    inputs["mask"] = torch.tensor([[False, True, True]])   # a leading masked token is OAT's prompt
    out = adapter.call("surrogate.ppo_clip", inputs, {})["loss"]
    assert out.shape == (1, 3) and torch.allclose(out[0, 1:], torch.tensor([-1.0, -1.0]))


def test_fused_head_passes_the_vocabulary_check(adapter):
    """`pgspec check --formula logprob.token --vocab V` through OAT's FusedLinear (head.py, OAT's default
    use_fused_lm_head): 2 x 300 = 600 tokens span two of its 512-token chunks; a logit scale, which
    FusedLinear does not have, is declined rather than run."""
    from pgspec.conformance import check

    assert adapter.heads["logprob.token"].__module__ == "pgspec.adapters.oat.head"
    results = check.run_checks(adapter, "logprob.token", 2, 300, dtypes=["bfloat16", "float32"], vocab=700,
                               params={"temperature": 0.7})
    assert [(r.dtype, r.path, r.outcome) for r in results] == [("bfloat16", "head", "pass"), ("float32", "head", "pass")]
    for r in results:
        assert all(o.compared > 0 and o.failures == 0 for o in r.outputs), r.outputs
    (r,) = check.run_checks(adapter, "logprob.token", 2, 8, vocab=50, params={"logit_scale": 2})
    assert r.outcome == "unsupported" and "no logit_scale" in r.message
