"""The ms_swift adapter against the golden corpus (skipped unless ms-swift is installed here).

Install: bash ci/install-ms_swift.sh VENV, then VENV/bin/python -m pytest tests/test_adapter_ms_swift.py.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("swift.rlhf_trainers.grpo_trainer")

from pgspec.conformance.corpus import golden  # noqa: E402
from pgspec.conformance.run.runner import BAD_OUTCOMES, load_adapter, load_case, run_case  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("ms_swift")
    ok, why = a.available()
    assert ok, why
    return a


def test_declares_framework(adapter):
    from importlib import metadata

    assert adapter.framework.startswith("ms-swift")
    assert adapter.version == f"ms-swift {metadata.version('ms-swift')}" == "ms-swift 4.6.0"
    assert {"surrogate.ppo_clip", "surrogate.gspo", "kl.k3", "is.geometric.truncate", "mask.opsm",
            "mask.entropy_quantile", "loss.grpo", "loss.sapo"} <= adapter.capabilities()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus(adapter, dtype):
    cases = [c for c in golden.load_all() if c["formula"] in adapter.capabilities()]
    assert cases
    bad = [(r.case_id, r.outcome, r.message.splitlines()[-1] if r.message else "")
           for r in (run_case(adapter, c, dtype, "cpu") for c in cases) if r.outcome in BAD_OUTCOMES]
    assert not bad, bad


def test_declared_bug_and_convention_reproduce(adapter):
    # the completion mask is multiplied, not selected: NaN at a masked position reaches the loss
    r = run_case(adapter, load_case("loss.grpo/masked-nan-inf"), "float64", "cpu")
    assert r.outcome == "bug" and r.declaration["kind"] == "bug", r.message
    # sequence_mask weights a kept token by its own ratio, not the sequence's geometric mean
    r = run_case(adapter, load_case("is.geometric.mask/upper-bound-only"), "float64", "cpu")
    assert r.outcome == "convention", r.message


def test_euler_readout_is_the_framework_value():
    """GSPO's per-token loss read as A * d loss / d A equals ms-swift's per-token loss: the dapo sum of the
    read-out is the loss ms-swift returns with num_items_in_batch = 1; another clip range changes it."""
    import torch

    from pgspec.adapters.ms_swift._engine import compute_loss, make_stub
    from pgspec.adapters.ms_swift.impls import euler_readout

    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    old = -torch.rand(3, 5, generator=g, dtype=torch.float64)
    m = torch.rand(3, 5, generator=g) > 0.3
    adv = torch.randn(3, 1, generator=g, dtype=torch.float64).expand(3, 5).clone()
    data = dict(logprobs=lp, mask=m, advantages=adv, old_logprobs=old, ref_logprobs=None, sampler_logprobs=None,
                entropy=None)
    stub = dict(loss_type="dapo", level="sequence", eps_low=0.2, eps_high=0.28)
    terms, _ = euler_readout(dict(data), 1, **stub)
    total, _ = compute_loss(make_stub(**stub), **data, num_items_in_batch=1)
    assert abs(float((terms * m).sum() - total)) < 1e-14
    other, _ = euler_readout(dict(data, advantages=adv.clone()), 1, **dict(stub, eps_low=0.001, eps_high=0.001))
    assert not torch.allclose(other, terms)
