"""The unsloth adapters against the golden corpus (skipped unless unsloth-zoo is installed here).

Install: bash ci/install-unsloth.sh VENV, then VENV/bin/python -m pytest tests/test_adapter_unsloth.py.
"""

import os

import pytest

pytest.importorskip("torch")


def _installed():
    from importlib import metadata

    try:
        return metadata.version("unsloth-zoo")
    except metadata.PackageNotFoundError:
        return None


# not importorskip("unsloth_zoo"): unsloth-zoo refuses to import on a machine without an accelerator unless its
# CPU switch is set first, which the adapter does (adapters/unsloth/README.md)
if _installed() is None:
    pytest.skip("unsloth-zoo is not installed (bash ci/install-unsloth.sh VENV)", allow_module_level=True)

from pgspec.conformance.corpus import golden  # noqa: E402
from pgspec.conformance.run.runner import BAD_OUTCOMES, load_adapter, load_case, run_case  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("unsloth")
    ok, why = a.available()
    assert ok, why
    return a


def test_declares_framework_and_loads_the_installed_module(adapter):
    import sys
    from importlib import metadata

    assert adapter.framework.startswith("Unsloth")
    assert metadata.version("unsloth-zoo") == "2026.10.9"
    assert {"surrogate.ppo_clip", "surrogate.gspo", "kl.k3_unbiased", "loss.dapo", "loss.luspo"} <= adapter.capabilities()
    # no stand-in: the loss module is the installed file, imported through unsloth-zoo's own CPU switch
    rl = sys.modules["unsloth_zoo.rl_replacements"]
    assert rl.__file__.endswith(os.path.join("site-packages", "unsloth_zoo", "rl_replacements.py"))
    import torch

    if not torch.cuda.is_available():
        assert os.environ["UNSLOTH_ZOO_DISABLE_GPU_INIT"] == "1"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus(adapter, dtype):
    cases = [c for c in golden.load_all() if c["formula"] in adapter.capabilities()
             and not c["id"].split("/", 1)[1].startswith("scale-")]
    assert cases
    bad = [(r.case_id, r.outcome, r.message.splitlines()[-1] if r.message else "")
           for r in (run_case(adapter, c, dtype, "cpu") for c in cases) if r.outcome in BAD_OUTCOMES]
    assert not bad, bad


def test_declared_bug_reproduces_and_masked_positions_are_selected(adapter):
    # use_bias_correction_kl at sequence level multiplies each token's KL by the sequence ratio
    r = run_case(adapter, load_case("loss.gspo/kl-k3_unbiased"), "float64", "cpu")
    assert r.outcome == "bug" and r.declaration["kind"] == "bug", r.message
    # unlike TRL, grpo_compute_loss selects (torch.where) before any ratio: NaN/inf at masked positions is harmless
    for cid in ("loss.grpo/masked-nan-inf", "surrogate.ppo_clip/masked-nan-inf", "kl.k3/masked-nan-inf"):
        r = run_case(adapter, load_case(cid), "float64", "cpu")
        assert r.outcome == "pass", (cid, r.message)


def test_readout_is_the_framework_value():
    """The per-token read-out (d loss / d entropy_mask) sums to the loss Unsloth returns with sample weights 1,
    and a wrong clip range changes it (the read-out is not blind to the parameters)."""
    import torch

    from pgspec.adapters.unsloth._engine import eager, options
    from pgspec.adapters.unsloth.impls import policy_terms

    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    old = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    m = torch.rand(3, 5, generator=g) > 0.3
    adv = torch.randn(3, generator=g, dtype=torch.float64)
    data = dict(logprobs=lp, mask=m, advantages=adv, old_logprobs=old, ref_logprobs=None, sampler_logprobs=None)
    kw = options(loss_type="grpo", eps_low=0.2, eps_high=0.28)
    terms = policy_terms(data, kw)
    total = eager(**data, **dict(kw, sample_weight=torch.ones(3, dtype=torch.float64)))[0]
    assert torch.equal(terms[~m], torch.zeros_like(terms[~m]))
    assert abs(float(terms.sum() - total)) < 1e-14
    other = policy_terms(data, options(loss_type="grpo", eps_low=0.01, eps_high=0.01))
    assert not torch.allclose(other, terms)


@pytest.mark.skipif(os.environ.get("PGSPEC_SKIP_COMPILE") == "1", reason="torch.compile takes minutes on CPU")
def test_compiled_path_matches_eager_gradient():
    """UnslothEfficientGRPO (the compiled training path) against grpo_compute_loss under autograd, on one
    configuration: the same gradient; the loss comes back accumulated in float32."""
    import torch

    from pgspec.adapters.unsloth._engine import eager, fused, options

    g = torch.Generator().manual_seed(1)
    lp = (-torch.rand(2, 4, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = -torch.rand(2, 4, generator=g, dtype=torch.float64)
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5], dtype=torch.float64)
    kw = options(loss_type="dapo", eps_low=0.2, eps_high=0.28, num_items_in_batch=torch.tensor(7.0))
    ref_loss = eager(logprobs=lp, mask=m, advantages=adv, old_logprobs=old, **kw)[0]
    (ref_g,) = torch.autograd.grad(ref_loss, lp)
    loss = fused(logprobs=lp, mask=m, advantages=adv, old_logprobs=old, **kw)[0]
    (got_g,) = torch.autograd.grad(loss, lp)
    assert loss.dtype == torch.float32
    assert abs(float(loss) - float(ref_loss)) < 1e-7
    assert torch.allclose(got_g, ref_g, rtol=1e-12, atol=1e-15)
