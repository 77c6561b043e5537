"""The liger adapter (Liger-Kernel 0.8.5) over the golden corpus.

Skips unless liger_kernel is importable in this interpreter (e.g. run with /tmp/venv-liger/bin/python
after ci/install-liger.sh /tmp/venv-liger).
"""

from __future__ import annotations

import pytest

from pgspec.conformance import runner


def test_module_imports_without_framework():
    import pgspec.adapters.liger as liger
    from pgspec.adapters.liger import mapping

    assert callable(liger.make_adapter)
    assert "loss.grpo" in mapping.RECIPES


liger_kernel = pytest.importorskip("liger_kernel")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def adapter():
    a = runner.load_adapter("liger")
    ok, why = a.available()
    assert ok, why
    return a


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus_has_no_bad_outcomes(adapter, dtype):
    cases = runner.select_cases("*")
    bad = []
    for case in cases:
        r = runner.run_case(adapter, case, dtype, "cpu")
        if r.outcome in runner.BAD_OUTCOMES:
            bad.append(f"{r.case_id}: {r.outcome}: {r.message[:200]}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("case_id,outcome", [("kl.k3/masked-nan-inf", "bug"),
                                              ("loss.luspo/token-level-padded", "bug"),
                                              ("loss.grpo/empty-sequence", "convention"),
                                              ("loss.dapo/worked-example-prompt-mean", "not-applicable")])
def test_declaration_classifies(adapter, case_id, outcome):
    case = runner.load_case(case_id)
    r = runner.run_case(adapter, case, "float32", "cpu")
    assert r.outcome == outcome, r.message
    assert r.declaration is not None


def test_version_and_capabilities(adapter):
    assert adapter.version == "0.8.5"
    assert {"loss.grpo", "loss.gspo", "loss.luspo", "kl.k3", "logprob.token"} <= adapter.capabilities()
    assert "loss.gmpo" not in adapter.capabilities()


def _case():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 2 - 0.05
    old = lp.detach() + 0.3 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([1.0, -0.5, 0.25], dtype=torch.float64)
    return {"logprobs": lp.requires_grad_(True), "old_logprobs": old, "mask": mask, "advantages": adv}


@pytest.mark.parametrize("fid", ["loss.grpo", "loss.dapo", "loss.gspo", "loss.sapo", "loss.cispo"])
def test_fused_path_agrees_with_chunked(fid):
    """LigerFusedLinearGRPOLoss from constructed hidden states == ppo_loss_fn on the log-probs (fp32)."""
    from pgspec.adapters.liger import chunked, fused

    params = {"beta": 0.0}
    if fid in ("loss.dapo", "loss.cispo"):
        params["aggregation"] = "token_mean"   # Liger's normalizer; prompt_mean needs group_ids (one group)
    x = _case()
    out = chunked.IMPLEMENTATIONS[fid](x, params)
    (g,) = torch.autograd.grad(out["loss"], x["logprobs"])
    x2 = _case()
    f = fused.IMPLEMENTATIONS[fid](x2, params)
    assert abs(f["loss"].item() - out["loss"].item()) <= 1e-5 * (1 + abs(out["loss"].item()))
    m = x["mask"]
    assert torch.allclose(f["grad"]["logprobs"][m].double(), g[m], rtol=1e-4, atol=1e-6)


def test_luspo_token_level_leaks_padding():
    """Liger's luspo sums the unmasked per-token loss times L_i / (B T): padding enters the loss."""
    from pgspec.adapters.liger import chunked

    x = _case()
    params = {"ratio_level": "token", "beta": 0.0, "eps_low": 0.2, "eps_high": 0.2}
    a = chunked.IMPLEMENTATIONS["loss.luspo"](x, params)["loss"].item()
    y = _case()
    y["logprobs"] = torch.where(y["mask"], y["logprobs"], torch.full_like(y["logprobs"], -7.0)).detach()
    b = chunked.IMPLEMENTATIONS["loss.luspo"](y, params)["loss"].item()
    assert a != b   # the spec's loss does not depend on masked positions
