"""The liger adapter (Liger-Kernel 0.8.5) over the golden corpus.

Skips unless liger_kernel is importable in this interpreter (e.g. run with /tmp/venv-liger/bin/python
after ci/install-liger.sh /tmp/venv-liger).
"""

from __future__ import annotations

import pytest

from pgspec.conformance.run import runner


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


@pytest.mark.parametrize("spec", ["liger", "pgspec.adapters.liger:make_fused_adapter"])
def test_lm_head_logprob_step_passes_the_vocabulary_check(spec):
    """`pgspec check --formula logprob.token --vocab V` through Liger's own LM-head step
    (LigerFusedLinearPPOBase.chunk_forward, head.py): V = 9,000 spans three of its 4,096-wide vocabulary
    chunks (the online log-sum-exp rescales twice), both dtypes pass against the float64 oracle, and a
    logit scale, which Liger does not have, is declined rather than run."""
    from pgspec.conformance import check

    a = runner.load_adapter(spec)
    assert a.heads["logprob.token"].__module__ == "pgspec.adapters.liger.head"
    results = check.run_checks(a, "logprob.token", 2, 48, dtypes=["bfloat16", "float32"], vocab=9000,
                               params={"temperature": 0.7})
    assert [(r.dtype, r.path, r.outcome) for r in results] == [("bfloat16", "head", "pass"), ("float32", "head", "pass")]
    for r in results:
        assert [o.output for o in r.outputs] == ["logprobs", "grad.hidden"]
        assert all(o.compared > 0 and o.failures == 0 for o in r.outputs), r.outputs
    (r,) = check.run_checks(a, "logprob.token", 2, 48, vocab=9000, params={"logit_scale": 2})
    assert r.outcome == "unsupported" and "no logit_scale" in r.message


def test_fused_linear_grpo_loss_passes_the_vocabulary_check():
    """`pgspec check --formula loss.grpo --vocab V` through LigerFusedLinearGRPOLoss whole (head.py, the fused
    adapter only): hidden states and LM head in, at V = 9,000 (three vocabulary chunks), bfloat16 and float32
    pass against the composite float64 oracle; the chunked adapter (log-probs in) has no such head."""
    from pgspec.conformance import check

    a = runner.load_adapter("pgspec.adapters.liger:make_fused_adapter")
    results = check.run_checks(a, "loss.grpo", 3, 96, dtypes=["bfloat16", "float32"], vocab=9000,
                               params={"beta": 0.0, "eps_high": 0.28})
    assert [(r.dtype, r.path, r.outcome) for r in results] == [("bfloat16", "head", "pass"), ("float32", "head", "pass")]
    for r in results:
        assert [(o.output, o.failures) for o in r.outputs] == [("loss", 0), ("grad.hidden", 0)]
        assert r.outputs[1].compared == 3 * 96 * 64 and r.outputs[1].worst_ratio > 0
    (r,) = check.run_checks(runner.load_adapter("liger"), "loss.grpo", 2, 8, vocab=50, params={"beta": 0.0})
    assert r.outcome == "unsupported"


@pytest.mark.parametrize("formula, params", [("loss.bnpo", {}), ("loss.dr_grpo", {"divisor": 96}),
                                             ("loss.dapo", {"aggregation": "token_mean"}),
                                             ("loss.cispo", {"aggregation": "token_mean"}),
                                             ("loss.gspo", {}), ("loss.gspo", {"beta": 0.04}), ("loss.luspo", {}),
                                             ("loss.sapo", {}), ("loss.sapo", {"beta": 0.04}), ("loss.vespo", {})])
def test_fused_linear_loss_passes_the_vocabulary_check_for_every_token_loss(formula, params):
    """The other losses through LigerFusedLinearGRPOLoss whole (its loss_type and importance_sampling_level
    from the formula, head.head_loss): hidden states and LM head in at V = 9,000, bfloat16 and float32 pass
    against the composite float64 oracle (check_head_loss.py), the sequence-level GSPO and LUSPO and SAPO
    with their KL term too, and VESPO (no sampler log-probs: vllm_is_ratio None)."""
    from pgspec.conformance import check

    a = runner.load_adapter("pgspec.adapters.liger:make_fused_adapter")
    results = check.run_checks(a, formula, 2, 64, dtypes=["bfloat16", "float32"], vocab=9000, params=params)
    assert [(r.dtype, r.path, r.outcome) for r in results] == [("bfloat16", "head", "pass"), ("float32", "head", "pass")]
    for r in results:
        assert [(o.output, o.failures) for o in r.outputs] == [("loss", 0), ("grad.hidden", 0)]
        assert r.outputs[1].worst_ratio > 0


@pytest.mark.parametrize("formula, params", [("loss.grpo", {"beta": 0.04}),
                                             ("loss.dapo", {"beta": 0.1, "kl_estimator": "k3_unbiased",
                                                            "aggregation": "token_mean"})])
def test_fused_linear_loss_passes_the_vocabulary_check_with_the_kl_term(formula, params):
    """beta > 0 (Liger's k3, and k3_unbiased: use_bias_correction_kl): LigerFusedLinearGRPOLoss whole gets the
    reference log-probs as ref_per_token_logps (head.head_loss) at V = 9,000, and passes in bfloat16 and float32;
    with k2, which Liger does not compute, the check reports it unsupported."""
    from pgspec.conformance import check

    a = runner.load_adapter("pgspec.adapters.liger:make_fused_adapter")
    results = check.run_checks(a, formula, 2, 64, dtypes=["bfloat16", "float32"], vocab=9000, params=params)
    assert [(r.dtype, r.path, r.outcome) for r in results] == [("bfloat16", "head", "pass"), ("float32", "head", "pass")], \
        [r.message for r in results]
    for r in results:
        assert [(o.output, o.failures) for o in r.outputs] == [("loss", 0), ("grad.hidden", 0)]
        assert r.outputs[1].worst_ratio > 0
    (r,) = check.run_checks(a, formula, 2, 8, vocab=50, params={**params, "kl_estimator": "k2"})
    assert r.outcome == "unsupported", r.message


@pytest.mark.parametrize("spec", ["liger", "pgspec.adapters.liger:make_fused_adapter"])
def test_vespo_with_the_sampler_folded_passes_the_check(spec):
    """VESPO with the sampler's log-probs (pgspec check --sampler): the adapter passes Liger
    vllm_is_ratio = exp(l_old - l_sampler), which Liger folds into phi as the spec does; in float32,
    where the check's bound on phi is tight, at 8 rows of 1,024 tokens."""
    from pgspec.conformance import check

    (r,) = check.run_checks(runner.load_adapter(spec), "loss.vespo", 8, 1024, dtypes=["float32"], sampler=True)
    assert r.outcome == "pass", r.message
    assert [(o.output, o.failures) for o in r.outputs] == [("loss", 0), ("grad.logprobs", 0)]


def test_fused_linear_vespo_with_the_sampler_folded_passes_from_hidden_states():
    """`pgspec check --formula loss.vespo --vocab V --sampler`: LigerFusedLinearGRPOLoss gets the sampler's
    log-probs as vllm_is_ratio and passes in bfloat16 and float32."""
    from pgspec.conformance import check

    a = runner.load_adapter("pgspec.adapters.liger:make_fused_adapter")
    results = check.run_checks(a, "loss.vespo", 2, 64, dtypes=["bfloat16", "float32"], vocab=9000, sampler=True)
    assert [(r.dtype, r.outcome) for r in results] == [("bfloat16", "pass"), ("float32", "pass")], \
        [r.message for r in results]


def test_fused_linear_luspo_at_token_level_is_the_declared_bug_from_hidden_states():
    """LUSPO at token level from hidden states fails as Liger's declared bug (deviations.toml: padding enters
    the loss), and the check reports it so: a known bug, not an unexpected failure."""
    from pgspec.conformance import check

    a = runner.load_adapter("pgspec.adapters.liger:make_fused_adapter")
    results = check.run_checks(a, "loss.luspo", 3, 64, dtypes=["float32"], vocab=9000, params={"ratio_level": "token"})
    assert [(r.dtype, r.outcome) for r in results] == [("float32", "bug")]
    assert results[0].outputs[0].failures == 1


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


# ------------------------------------------------------------------------------------------ Triton kernel
# triton_grpo_loss runs on CPU only in Triton's interpreter, which TRITON_INTERPRET=1 must enable before triton
# is imported: these tests run it in a child process (this process may have imported triton already).

import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (ci/install-liger.sh VENV --triton)")


def _child(code: str, *args: str, timeout=600, **env):
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


LUSPO_PROBE = r"""
import json, torch
from liger_kernel.transformers.grpo_loss import triton_grpo_loss
torch.manual_seed(0)
B, T, V = 2, 2, 3
mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.int32)          # lengths L = (2, 1)
ids = torch.randint(0, V, (B, T))
base = torch.randn(B, T + 1, V)
logp = torch.log_softmax(base[:, :T], -1).gather(-1, ids[..., None])[..., 0]
old = (logp + 0.05 * torch.randn(B, T)).contiguous()
adv = torch.tensor([1.0, -0.5])
out = {}
for level in ("token", "sequence"):
    kw = dict(temperature=1.0, beta=0.0, eps_low=0.2, eps_high=0.2, inplace=False, loss_type="luspo",
              importance_sampling_level=level)
    x = base.clone().requires_grad_(True)
    loss, _ = triton_grpo_loss(x, old, None, ids, adv, mask, reduce=True, **kw)
    (g_reduced,) = torch.autograd.grad(loss, x)
    # the same reduction (ops/grpo_loss.py L597) done by torch over the kernel's unreduced per-token loss,
    # whose backward takes a (B, T) upstream gradient: the derivative of Liger's own luspo loss
    y = base.clone().requires_grad_(True)
    per_token, _, _ = triton_grpo_loss(y, old, None, ids, adv, mask, reduce=False, **kw)
    ref = (per_token * mask.sum(-1, keepdim=True)).mean()
    (g_ref,) = torch.autograd.grad(ref, y)
    out[level] = {"loss": [loss.item(), ref.item()], "reduced": g_reduced[:, :T].tolist(), "ref": g_ref[:, :T].tolist()}
print(json.dumps(out))
"""


@needs_triton
def test_triton_luspo_token_backward_reads_b1_buffer_as_bt():
    """ops/grpo_loss.py L928 + L997: token-level luspo's dloss is (B, 1) = L_i / (B T), passed with strides
    (1, 1) to a kernel that reads DLOSS[b*s0 + t*s1]; token t of row b gets row b+t's value.  Here every read
    is in bounds: token (0, 1) reads L_1 / (B T) = 1/4 instead of L_0 / (B T) = 2/4, so its gradient is half of
    the derivative of Liger's own forward; every other token is right.  Sequence level (dloss multiplied by the
    (B, T) mask first) is right everywhere."""
    r = _child(LUSPO_PROBE, TRITON_INTERPRET="1")
    tok, seq = torch.tensor(r["token"]["reduced"]), torch.tensor(r["token"]["ref"])
    assert r["token"]["loss"][0] == pytest.approx(r["token"]["loss"][1], rel=1e-6)
    assert torch.allclose(tok[0, 1], 0.5 * seq[0, 1], rtol=1e-5) and seq[0, 1].abs().sum() > 1e-3
    assert torch.allclose(tok[0, 0], seq[0, 0], rtol=1e-5, atol=1e-7)
    assert torch.allclose(tok[1], seq[1], rtol=1e-5, atol=1e-7)
    s_red, s_ref = torch.tensor(r["sequence"]["reduced"]), torch.tensor(r["sequence"]["ref"])
    assert torch.allclose(s_red, s_ref, rtol=1e-5, atol=1e-7)


TRITON_CASES = r"""
import json
from pgspec.conformance.run import runner
a = runner.load_adapter("pgspec.adapters.liger:make_triton_adapter")
runner.check_declarations(a)
out = {}
for cid in ("loss.luspo/token-level-padded", "loss.luspo/worked-example", "loss.grpo/worked-example",
            "loss.grpo/empty-sequence", "loss.gspo/masked-nan-inf", "loss.grpo/log-ratio-20"):
    r = runner.run_case(a, runner.load_case(cid), "float32", "cpu")
    out[cid] = [r.outcome, (r.declaration or {}).get("reason", ""), (r.declaration or {}).get("source", "")]
print(json.dumps(out))
"""


@needs_triton
def test_triton_adapter_declarations_under_interpreter():
    r = _child(TRITON_CASES, TRITON_INTERPRET="1")
    outcome, reason, source = r["loss.luspo/token-level-padded"]
    assert outcome == "bug" and "(B, 1)" in reason and source.endswith("deviations-triton.toml")
    assert r["loss.luspo/worked-example"][0] == "bug" and "L_i^2 / T" in r["loss.luspo/worked-example"][1]
    assert r["loss.grpo/worked-example"][0] == "pass"
    assert r["loss.grpo/empty-sequence"][0] == "convention"
    assert r["loss.gspo/masked-nan-inf"][0] == "bug"
    assert r["loss.grpo/log-ratio-20"][0] == "not-applicable"   # a log-prob of 0: no gradient through logits


TRITON_VOCAB = r"""
import json, sys
from pgspec.conformance import check
from pgspec.conformance.run import runner
a = runner.load_adapter("pgspec.adapters.liger:make_triton_adapter")
res = check.run_checks(a, sys.argv[1], 2, 32, dtypes=["bfloat16", "float32"], vocab=9000,
                       params=json.loads(sys.argv[2]))
print(json.dumps([[r.dtype, r.path, r.outcome, [[o.output, o.compared, o.failures, o.worst_ratio] for o in r.outputs]]
                  for r in res]))
"""


@needs_triton
@pytest.mark.parametrize("formula, params", [("loss.grpo", '{"beta": 0}'), ("loss.grpo", '{"beta": 0.04}'),
                                             ("loss.gspo", '{"beta": 0.04}'), ("loss.sapo", '{"beta": 0.04}'),
                                             ("loss.vespo", '{}')])
def test_triton_kernel_passes_the_vocabulary_check_under_interpreter(formula, params):
    """`pgspec check --formula loss.grpo --vocab 9000` through triton_grpo_loss on the logits of the linear head
    (triton_path.head_loss): the kernel's loop over the vocabulary in blocks of 4,096 (three blocks here),
    forward and backward, in bfloat16 and float32 logits, against the composite float64 oracle; without the KL
    term and with it (the reference log-probs as the kernel's ref_logp), GSPO (sequence level), SAPO and VESPO."""
    r = _child(TRITON_VOCAB, formula, params, TRITON_INTERPRET="1")
    assert [row[:3] for row in r] == [["bfloat16", "head", "pass"], ["float32", "head", "pass"]]
    for row in r:
        (lo, ln, lf, lw), (go, gn, gf, gw) = row[3]
        assert (lo, ln, lf, go, gn, gf) == ("loss", 1, 0, "grad.hidden", 2 * 32 * 64, 0) and gw > 0


def test_triton_adapter_refuses_cpu_without_interpreter():
    from pgspec.adapters.liger import triton_path

    if triton_path.interpreted():
        pytest.skip("TRITON_INTERPRET=1 is set in this process")
    ok, why = triton_path.device_available("cpu")
    assert not ok and "TRITON_INTERPRET=1" in why
    assert triton_path.device_available("cuda") == (True, "")


# ------------------------------------------------------------------------------------------ torch.compile

def test_default_adapter_never_compiles(adapter):
    """The default path calls _compute_loss_from_logps directly: no torch.compile, so no stale floats."""
    from torch._dynamo.utils import counters

    before = dict(counters["stats"])
    for cid in ("loss.grpo/worked-example", "loss.grpo/eps-zero", "loss.gspo/worked-example",
                "loss.sapo/preset-liger-ligerfusedlineargrpoloss-loss-type-sapo-batch"):
        r = runner.run_case(adapter, runner.load_case(cid), "float32", "cpu")
        assert r.outcome == "pass", (cid, r.message)
    assert dict(counters["stats"]) == before, "the default liger adapter ran something through torch.compile"


COMPILED_PROBE = r"""
import json, torch
from pgspec.adapters.liger import fused
torch.manual_seed(0)
B, T = 2, 4
lp = (-torch.rand(B, T) * 2 - 0.05)
x = {"logprobs": lp, "old_logprobs": lp + 0.4 * torch.randn(B, T), "mask": torch.ones(B, T, dtype=torch.bool),
     "advantages": torch.tensor([1.0, -1.0])}
out = []
for eps_low, eps_high in ((0.2, 0.2), (0.1, 0.28), (0.05, 0.05)):
    p = {"beta": 0.0, "eps_low": eps_low, "eps_high": eps_high}
    c = fused.COMPILED_IMPLEMENTATIONS["loss.grpo"](dict(x), p)["loss"].item()
    e = fused.IMPLEMENTATIONS["loss.grpo"](dict(x), p)["loss"].item()
    out.append([eps_low, eps_high, c, e])
print(json.dumps({"torch": torch.__version__, "calls": out}))
"""


def test_compiled_default_path_returns_stale_epsilon():
    """Liger's default LigerFusedLinearGRPOLoss(compiled=True), three calls that change only epsilon, in a fresh
    process (docs/findings.md, Liger section): in torch 2.13.0 on CPU the third call returns the second call's
    loss (eps 0.1/0.28) instead of its own (eps 0.05/0.05).  The first two agree with compiled=False.  If torch
    stops doing this, this test fails: then update adapters/liger/README.md and deviations-compiled.toml."""
    r = _child(COMPILED_PROBE, timeout=900)
    if not r["torch"].startswith("2.13.0"):
        pytest.skip(f"the finding is for torch 2.13.0, this is {r['torch']}")
    (e1l, e1h, c1, g1), (e2l, e2h, c2, g2), (e3l, e3h, c3, g3) = r["calls"]
    assert c1 == pytest.approx(g1, rel=1e-6) and c2 == pytest.approx(g2, rel=1e-6)
    assert abs(g3 - g2) > 1e-3                       # epsilon matters for these inputs
    assert c3 == pytest.approx(c2, rel=1e-6)         # ... but the compiled path returns the previous result
