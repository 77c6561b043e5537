"""The fused float64 log-prob oracle (conformance/check/logprob_fused.py) against the torch oracle
(check_logprob.oracle_chunks with fused=False), under Triton's interpreter on the CPU.

Triton's interpreter must be chosen (TRITON_INTERPRET=1) before triton is imported, so the kernels run in
child processes, as tests/test_adapter_liger.py runs triton_grpo_loss.  triton is not in the [dev] extra
(its wheel is about 1 GB with its CUDA toolchain); where it is not installed these tests are skipped, and CI
runs them in Liger's environment (ci/install-liger.sh VENV --triton; ci/conformance.sh).

Agreement, per output (both oracles on the same float64 inputs):

- log-probs and the gradient dl/dX: |fused - torch| <= 2 K u64 S, with S the torch oracle's scale (E(l),
  S(dl/dX)) and K = tolerance.K["logprob"].  The judge (check.judging.ChunkJudge) grants the oracle K u64 S: each float64
  evaluation is within that of the exact value, so two are within twice that of each other.
- the scales E(l), S(dl/dX) and the path sum P: relative difference <= 2 (V + 16) u64.  Every scale is a sum
  of nonnegative terms (no cancellation: E of each node, path sums of |derivatives|) and both oracles form each
  term by the same operations, so they differ by the summation order (a sum of m nonnegative terms is within
  (m - 1) u of its exact value: m <= V for the sums over the vocabulary) and the last bits of exp and of the
  few roundings per term (16 u covers them).
- masked positions: exactly 0 in both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (ci/install-liger.sh VENV --triton)")


def _child(code: str, *args: str, timeout=600, **env):
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, "TRITON_INTERPRET": "1", **env})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# name: (B, T, V, H, seed, ragged, params, blocks (BLOCK_M, BLOCK_V)): the configurations of the log-prob and
# head-loss checks' tests (tests/test_check.py, tests/test_check_head_loss.py), and the edge cases below
CONFIGS = {
    # test_head_scales_equal_reference_ad_on_the_composite (its targets[0, 0] = the argmax)
    "composite-t1-s1": (2, 3, 9, 5, 4, False, {"temperature": 1, "logit_scale": 1}, (16, 16)),
    "composite-t0.7-s1.5": (2, 3, 9, 5, 4, False, {"temperature": 0.7, "logit_scale": 1.5}, (16, 16)),
    "composite-t2-s1": (2, 3, 9, 5, 4, False, {"temperature": 2, "logit_scale": 1}, (16, 16)),
    # test_logprob_check_passes_the_torch_backend_and_catches_a_perturbed_one (5 tiles of 64)
    "check-3x64-V300-t0.8": (3, 64, 300, 16, 0, True, {"temperature": 0.8}, (32, 64)),
    "check-3x64-V300": (3, 64, 300, 16, 0, True, {}, (32, 64)),
    # test_a_head_that_declines...: 2 x 8, V = 10, H = 4
    "check-2x8-V10-H4": (2, 8, 10, 4, 0, True, {}, (16, 16)),
    # the head-loss checks: 3 x 40, V = 700, H = 16 (11 tiles of 64, the last of 60); 2 x 8, V = 50
    "head-loss-3x40-V700": (3, 40, 700, 16, 0, True, {}, (32, 64)),
    "head-loss-2x8-V50": (2, 8, 50, 16, 0, True, {}, (16, 16)),
    # the smallest vocabulary; one row block and several, H not a power of two
    "V2": (2, 5, 2, 3, 1, True, {}, (16, 16)),
    # edge cases (``_extremes``): the maximum in a later tile, a tie across tiles (the first index is *), a tie in
    # a tile with y = *, every other e underflowing (S = 0), a tie with the rest below e^-138 (S = 1, the sum node
    # exact at 60 digits: depth of V - 1 = 16 terms, a power of two)
    "extremes-t1-s1": (1, 6, 17, 4, 0, False, {"temperature": 1, "logit_scale": 1}, (16, 16)),
    "extremes-t0.7-s1.5": (1, 6, 17, 4, 0, False, {"temperature": 0.7, "logit_scale": 1.5}, (16, 16)),
}

def _corpus_cases():
    """logprob.token's corpus cases that test_logit_scales_equal_the_references_on_the_corpus uses (no softcap,
    some unmasked position), fed as a head: X = the logits [B, T, V], W = the identity [V, V], so that X W^T is
    the logits exactly (products with 0 and 1, sums with zeros)."""
    from pgspec.conformance.corpus import golden

    return [c["id"] for c in golden.load_all() if c["formula"] == "logprob.token" and "error" not in c["category"]
            and c["params"].get("softcap") is None and any(any(r) for r in golden.case_inputs(c)["mask"])]


CORPUS = _corpus_cases()

EQUAL = r"""
import json, sys
import numpy as np, torch
from pgspec.conformance import check
from pgspec.conformance.check import logprob as lp, logprob_fused as fused
from pgspec.conformance.judge import tolerance

def extremes(T, V, H):
    rng = np.random.default_rng(0)
    W = rng.integers(-1, 2, size=(V, H)).astype(np.float32) / 2
    W[16, 0] = 900.0                                  # row 0: the maximum in the second tile, every other e = 0
    W[3, 1] = W[16, 1] = 200.0                        # row 1: a tie across tiles (* = 3), the rest below e^-138
    W[10, 2] = W[12, 2] = 3.0                         # row 2: a tie within a tile, y = * = 10
    X = np.zeros((1, T, H), np.float32)
    X[0, 0, 0] = X[0, 1, 1] = X[0, 2, 2] = X[0, 3, 3] = 1
    X[0, 4, :2] = 1
    X[0, 5] = [0.5, -0.5, 0.25, 0]
    y = np.array([[16, 16, 10, 5, 3, 7]])
    return {"hidden": X, "weight": W, "targets": y, "mask": np.ones((1, T), bool)}

def measure(arrays, params, blocks, stop=None, low=None, split=False):
    p = {"temperature": 1, "logit_scale": 1, "softcap": None, **params}
    (_, l0, E0, g0, S0, P0), = lp.oracle_chunks(arrays, p, paths=True, fused=False)
    (_, l1, E1, g1, S1, P1), = fused.oracle_chunks(arrays, p, paths=True, block_m=blocks[0], block_v=blocks[1],
                                                   low=low, split=split, _vocab_stop=stop)
    K, u = tolerance.K["logprob"], check.U64
    def ratio(a, b, s):   # |a - b| / (2 K u64 s); where s = 0, exact equality (inf otherwise)
        d = (a - b).abs()
        return float(torch.where(s > 0, d / (2 * K * u * s), torch.where(d == 0, 0.0, float("inf"))).max())
    def rel(a, b):
        d = (a - b).abs()
        return float(torch.where(a != 0, d / a.abs(), torch.where(d == 0, 0.0, float("inf"))).max())
    m = torch.as_tensor(arrays["mask"]).reshape(-1)
    masked_zero = all(bool((t[~m] == 0).all()) for t in (l1, E1, g1, S1, P1))
    exact = fused.exact_logits(torch.as_tensor(arrays["hidden"]).double(), torch.as_tensor(arrays["weight"]).double())
    return {"logprobs": ratio(l0, l1, E0), "grad": ratio(g0, g1, S0), "E(l)": rel(E0, E1), "S(grad)": rel(S0, S1),
            "P": rel(P0, P1), "masked_zero": masked_zero, "rows": int(m.sum()), "exact_logits": exact}

from pgspec.conformance.corpus import golden

out = {}
cases = {c["id"]: c for c in golden.load_all()}
for cid in json.loads(sys.argv[2]):
    c = cases[cid]
    i = golden.case_inputs(c)
    L = np.asarray(i["logits"], dtype=np.float64)
    mask = np.asarray(i["mask"], dtype=bool)
    arrays = {"hidden": np.where(mask[..., None], L, 0.0), "weight": np.eye(L.shape[-1]),
              "targets": np.where(mask, np.asarray(i["targets"]), 0).astype(np.int64), "mask": mask}
    params = {k: float(v) for k, v in c["params"].items() if k in ("temperature", "logit_scale")}
    out["corpus:" + cid] = measure(arrays, params, (16, 16))
for name, (B, T, V, H, seed, ragged, params, blocks) in json.loads(sys.argv[1]).items():
    if name.startswith("extremes"):
        arrays = extremes(T, V, H)
    else:
        arrays = lp.seeded_head(B, T, V, H, seed=seed, ragged=ragged)
        if name.startswith("composite"):
            arrays["targets"][0, 0] = int(np.argmax(arrays["hidden"][0, 0] @ arrays["weight"].T))
    out[name] = measure(arrays, params, blocks)
    # the logits' products in float64 where the float16 ones would be exact (and are taken by default)
    out[name + "/float64-products"] = measure(arrays, params, blocks, low=False)
    out[name + "/split"] = measure(arrays, params, blocks, split=True)     # the gradient and its scales apart
    if name == "head-loss-3x40-V700":
        out["drop-last-tile"] = measure(arrays, params, blocks, stop=V - 60)     # 640: the last tile left out
        out["drop-all-but-one-tile"] = measure(arrays, params, blocks, stop=64)
        # bench/logprob_oracle_cost.py --compare (the check the GPU runs on its compiled kernels)
        out["agreement"] = [lp.agreement(arrays, params, block_m=32, block_v=64)["ok"],
                            lp.agreement(arrays, params, block_m=32, block_v=64, _vocab_stop=V - 60)["ok"]]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def measured():
    return _child(EQUAL, json.dumps(CONFIGS), json.dumps(CORPUS))


@needs_triton
@pytest.mark.parametrize("name", [n + p for n in CONFIGS for p in ("", "/float64-products", "/split")])
def test_fused_oracle_equals_the_torch_oracle(measured, name):
    r = measured[name]
    V = CONFIGS[name.split("/")[0]][2]
    # the seeded heads take the float16 products of the logits (exact), the extremes (W = 900) the float64 ones
    assert r["exact_logits"] == (not name.startswith("extremes")), r
    assert r["rows"] > 0 and r["masked_zero"]
    assert r["logprobs"] <= 1 and r["grad"] <= 1, r
    tol = 2 * (V + 16) * 2.0 ** -53
    assert r["E(l)"] <= tol and r["S(grad)"] <= tol and r["P"] <= tol, r


@needs_triton
@pytest.mark.parametrize("cid", CORPUS)
def test_fused_oracle_equals_the_torch_oracle_on_the_corpus(measured, cid):
    """The corpus's logprob.token cases (ties at the maximum, gaps of 20 and 200, extreme logits, a vocabulary of
    one and of 1024, temperatures from 1e-3 to 1000, a logit scale) through the identity head."""
    r = measured["corpus:" + cid]
    from pgspec.conformance.corpus import golden

    c = next(c for c in golden.load_all() if c["id"] == cid)
    V = len(golden.case_inputs(c)["logits"][0][0])
    assert r["rows"] > 0 and r["masked_zero"]
    assert r["logprobs"] <= 1 and r["grad"] <= 1, r
    tol = 2 * (V + 16) * 2.0 ** -53
    assert r["E(l)"] <= tol and r["S(grad)"] <= tol and r["P"] <= tol, r


@needs_triton
@pytest.mark.parametrize("name", ["drop-last-tile", "drop-all-but-one-tile"])
def test_a_fused_oracle_that_drops_vocabulary_tiles_is_caught(measured, name):
    """The same comparison on a wrong fused oracle (its sweeps end before the last tile, or after the first):
    the log-probs, the gradient and the scales are all out of agreement."""
    r = measured[name]
    assert r["logprobs"] > 1 and r["grad"] > 1, r
    assert r["E(l)"] > 1e-6 and r["S(grad)"] > 1e-6, r


@needs_triton
def test_agreement_of_the_bench_script_passes_the_fused_oracle_and_fails_a_wrong_one(measured):
    assert measured["agreement"] == [True, False]


# the losses from hidden states (check_head_loss.oracle): the composite oracle with the fused log-prob step against
# the one with the torch step, on the head-loss checks' configuration (3 x 40, V = 700, H = 16) and their parameters
COMPOSITES = {"grpo": ("loss.grpo", {"beta": 0}, False), "kl-grpo": ("loss.grpo", {"beta": 0.04}, False),
              "bnpo": ("loss.bnpo", {}, False), "dr_grpo": ("loss.dr_grpo", {"divisor": 512}, False),
              "dapo": ("loss.dapo", {"aggregation": "token_mean"}, False),
              "cispo": ("loss.cispo", {"aggregation": "token_mean"}, False), "gspo": ("loss.gspo", {}, False),
              "luspo": ("loss.luspo", {}, False), "sapo": ("loss.sapo", {"beta": 0.1}, False),
              "vespo-sampler": ("loss.vespo", {}, True)}

COMPOSITE = r"""
import functools, json, os, sys
import torch
from pgspec.conformance import check
from pgspec.conformance.check import head_loss as hl, logprob as lp
from pgspec.conformance.judge import tolerance
from pgspec.conformance.check import logprob_fused as fused
from pgspec.reference import REGISTRY

B, T, V, H = 3, 40, 700, 16
arrays = lp.seeded_head(B, T, V, H, seed=0)

def run(formula, params, sampler):
    p = check.oracle_params(formula, params, head=True)
    adv = check.seeded_inputs(formula, B, T, 0)["advantages"]
    os.environ["PGSPEC_LOGPROB_ORACLE"] = "torch"
    a = hl.oracle(arrays, adv, p, formula=formula, sampler=True if sampler else None)
    os.environ["PGSPEC_LOGPROB_ORACLE"] = "fused"
    # the same old, reference and sampler log-probs (drawn around the torch step's log-probs): a last-bit difference
    # of the log-probs must not move a float32 draw
    b = hl.oracle(arrays, adv, p, formula=formula, old=a["old_logprobs"].numpy(),
                  ref=a["ref_logprobs"].numpy() if "ref_logprobs" in a else None,
                  sampler=a["sampler_logprobs"].numpy() if sampler else None)
    K, u = tolerance.K[REGISTRY[formula].family], check.U64
    def ratio(x, y, s):
        d = (x - y).abs()
        return float(torch.where(s > 0, d / (2 * K * u * s), torch.where(d == 0, 0.0, float("inf"))).max())
    def rel(x, y):
        d = (x - y).abs()
        return float(torch.where(x != 0, d / x.abs(), torch.where(d == 0, 0.0, float("inf"))).max())
    return {"loss": ratio(a["loss"].reshape(1), b["loss"].reshape(1), a["E(loss)"].reshape(1)),
            "grad": ratio(a["grad.hidden"], b["grad.hidden"], a["S(grad.hidden)"]),
            "E(loss)": rel(a["E(loss)"].reshape(1), b["E(loss)"].reshape(1)),
            "S(grad)": rel(a["S(grad.hidden)"], b["S(grad.hidden)"])}

out = {name: run(*row) for name, row in json.loads(sys.argv[1]).items()}
fused.oracle_rows = functools.partial(fused.oracle_rows, _vocab_stop=V - 60)    # a wrong fused step: no last tile
out["drop-last-tile"] = run("loss.grpo", {"beta": 0.04}, False)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def composites():
    return _child(COMPOSITE, json.dumps(COMPOSITES))


@needs_triton
@pytest.mark.parametrize("name", list(COMPOSITES))
def test_the_losses_from_hidden_states_agree_on_either_log_prob_step(composites, name):
    """The loss and dloss/dX within 2 K u64 S of the loss's family (as for the log-probs); the composite's scales,
    S1 A_l + P1 C_l (check_head_loss.py), within twice the log-prob step's relative bound: S1 and P1 are within
    2 (V + 16) u64, and the loss's A_l, C_l and E(loss) are the torch backend's on log-probs and E(l) that differ
    by rounding."""
    r = composites[name]
    assert r["loss"] <= 1 and r["grad"] <= 1, r
    tol = 4 * (700 + 16) * 2.0 ** -53
    assert r["E(loss)"] <= tol and r["S(grad)"] <= tol, r


@needs_triton
def test_a_loss_from_hidden_states_on_a_wrong_fused_step_disagrees(composites):
    r = composites["drop-last-tile"]
    assert r["loss"] > 1 and r["grad"] > 1 and r["S(grad)"] > 1e-6, r


COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pgspec.conformance.check import logprob_fused_kernels as k

out = []
for low in (True, False):
    w = "*fp16" if low else "*fp64"
    for fn, types, extra in (
            (k.stats_kernel, ["*fp64", w, "*fp64", "*fp64", "*fp64", "*i64", "i32", "i32", "i32"], {}),
            (k.sums_kernel, ["*fp64", w, "*fp64", "*fp64", "*fp64", "*i64", "*fp64", "*fp64", "i32", "i32", "i32"], {}),
            (k.grad_kernel, ["*fp64", w, "*fp64", "*fp64", "*fp64", "*i64", "*i64", "*fp64", "*fp64", "*fp64", "i32", "i32",
                             "i32"], {"GRAD": True, "SCALES": True})):
        const = {"H": 64, "HP": 64, "BM": 32, "BV": 64, "LOW": low, **extra}
        sig = dict(zip([a for a in fn.arg_names if a not in const], types))
        sig.update({c: "constexpr" for c in const})
        c = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const), target=GPUTarget("cuda", 90, 32))
        ptx = c.asm["ptx"]
        out.append([fn.__name__, low, ptx.count("mma.sync.aligned.m8n8k4.row.col.f64"), ptx.count(".f16.f16")])
print(json.dumps(out))
"""


@needs_triton
def test_the_kernels_compile_for_an_h200():
    """The interpreter runs the kernels as Python and misses what only the compiler rejects (a loop-carried
    variable whose type changes, an unsupported float64 dot): compiled here for sm_90 (Triton's bundled ptxas, no
    GPU needed), both product paths; the float64 products are float64 MMAs, the logits' float16 ones float16 MMAs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", COMPILE], capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {(name, low): (f64, f16) for name, low, f64, f16 in json.loads(out.stdout.strip().splitlines()[-1])}
    assert len(rows) == 6
    assert rows[("grad_kernel", True)][0] > 0 and rows[("grad_kernel", True)][1] > 0      # G W etc., and the logits
    assert rows[("stats_kernel", True)][0] == 0 and rows[("stats_kernel", True)][1] > 0   # the logits only
    assert all(rows[(n, False)][0] > 0 and rows[(n, False)][1] == 0
               for n in ("stats_kernel", "sums_kernel", "grad_kernel"))


CHECKS = r"""
import json
import torch
from pgspec.adapters.base import Adapter
from pgspec.conformance import check
from pgspec.conformance.check import logprob_fused as check_logprob_fused
from pgspec.conformance.run import runner

calls = []
rows = check_logprob_fused.oracle_rows
check_logprob_fused.oracle_rows = lambda *a, **k: calls.append(1) or rows(*a, **k)
torch_adapter = runner.load_adapter("torch")
DROP = 64

def log_probs(x, weight, targets, mask, drop):
    # a kernel's log-probs; drop: its log-sum-exp leaves the last DROP columns of the vocabulary out
    z = x @ weight.T
    lse = torch.logsumexp(z[..., : z.shape[-1] - DROP] if drop else z, -1)
    l = z.gather(-1, targets[..., None])[..., 0] - lse
    return torch.where(mask, l, torch.zeros_like(l))

def logprob_head(drop):
    def head(hidden, weight, targets, mask, params):
        x = hidden.detach().requires_grad_(True)
        with torch.enable_grad():
            l = log_probs(x, weight, targets, mask, drop)
            (g,) = torch.autograd.grad(l.sum(), [x])
        return {"logprobs": l.detach(), "grad": {"hidden": g}}
    a = Adapter(f"logprob-head-drop-{drop}", "test", "0", implementations={})
    a.heads = {"logprob.token": head}
    return a

def loss_head(drop):
    def head(hidden, weight, targets, mask, old_logprobs, advantages, params):
        x = hidden.detach().requires_grad_(True)
        with torch.enable_grad():
            l = log_probs(x, weight, targets, mask, drop)
            loss = torch_adapter.call("loss.grpo", {"logprobs": l, "old_logprobs": old_logprobs,
                                                    "advantages": advantages, "mask": mask}, params)["loss"]
            (g,) = torch.autograd.grad(loss, [x])
        return {"loss": loss.detach(), "grad": {"hidden": g}}
    a = Adapter(f"loss-head-drop-{drop}", "test", "0", implementations={})
    a.heads = {"loss.grpo": head}
    return a

def summary(results):
    return [[r.dtype, r.path, r.outcome, [[o.output, o.compared, o.failures] for o in r.outputs]] for r in results]

out = {}
out["backend"] = summary(check.run_checks(torch_adapter, "logprob.token", 3, 64, ["float32", "bfloat16"], vocab=300,
                                          hidden=16, params={"temperature": 0.8}))
for drop in (False, True):
    out[f"logprob-head-drop-{drop}"] = summary(check.run_checks(logprob_head(drop), "logprob.token", 3, 64, ["float32"],
                                                                vocab=300, hidden=16))
    out[f"loss-head-drop-{drop}"] = summary(check.run_checks(loss_head(drop), "loss.grpo", 3, 40, ["float32"],
                                                             vocab=700, hidden=16, params={"beta": 0.0}))
out["fused_calls"] = len(calls)
print(json.dumps(out))
"""


@needs_triton
def test_checks_on_the_fused_oracle_pass_a_correct_kernel_and_fail_one_that_drops_a_tile():
    """`pgspec check` with PGSPEC_LOGPROB_ORACLE=fused (the oracle CUDA gets): the built-in backend and a
    correct fused head pass, in logprob.token and in loss.grpo from hidden states; a head whose log-sum-exp
    leaves the last 64 columns of the vocabulary out fails both."""
    r = _child(CHECKS, PGSPEC_LOGPROB_ORACLE="fused")
    assert r["fused_calls"] >= 5
    assert [row[:3] for row in r["backend"]] == [["float32", "logits", "pass"], ["bfloat16", "logits", "pass"]]
    assert [row[:3] for row in r["logprob-head-drop-False"]] == [["float32", "head", "pass"]]
    assert [row[:3] for row in r["loss-head-drop-False"]] == [["float32", "head", "pass"]]
    (_, _, outcome, outputs), = r["logprob-head-drop-True"]
    assert outcome == "fail" and outputs[0][0] == "logprobs" and outputs[0][2] > 0 and outputs[1][2] > 0
    (_, _, outcome, outputs), = r["loss-head-drop-True"]
    assert outcome == "fail" and outputs[1][0] == "grad.hidden" and outputs[1][2] > 0


def test_oracle_choice(monkeypatch):
    from pgspec.conformance.check import logprob_fused as fused
    from pgspec.conformance.check.common import CheckError

    monkeypatch.delenv(fused.ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not fused.use_fused("cpu")
    assert fused.use_fused("cuda") == (importlib.util.find_spec("triton") is not None)
    monkeypatch.setenv(fused.ENV, "torch")
    assert not fused.use_fused("cuda")
    monkeypatch.setenv(fused.ENV, "fused")
    with pytest.raises(CheckError, match="TRITON_INTERPRET=1|triton is not installed"):
        fused.use_fused("cpu")
    monkeypatch.setenv(fused.ENV, "fast")
    with pytest.raises(CheckError, match="'fused' or 'torch'"):
        fused.use_fused("cpu")


def test_an_oracle_that_cannot_run_is_a_usage_error_of_pgspec_check(tmp_path):
    """`pgspec check` with PGSPEC_LOGPROB_ORACLE=fused where it cannot run (a CPU without TRITON_INTERPRET=1):
    exit status 2 and the reason, not an internal error."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "check", "--formula", "logprob.token",
                        "--vocab", "50", "--shape", "2x8", "--adapter", "torch"], capture_output=True, text=True,
                       env={**env, "PGSPEC_LOGPROB_ORACLE": "fused"}, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "PGSPEC_LOGPROB_ORACLE=fused" in r.stderr and "internal error" not in r.stderr


def test_exact_logits_admits_the_seeded_head_only_where_float16_products_are_exact():
    import torch

    from pgspec.conformance.check import logprob as check_logprob, logprob_fused as fused

    a = check_logprob.seeded_head(2, 8, 50, 64)
    X, W = torch.as_tensor(a["hidden"]).double(), torch.as_tensor(a["weight"]).double()
    assert fused.exact_logits(X, W)
    assert not fused.exact_logits(X, W * 0.3)                     # not j / 2
    assert not fused.exact_logits(X / 3, W)                       # not i / 16
    assert not fused.exact_logits(X * 32, W)                      # |i| = 512 > 256: not exact in float16
    wide = torch.full((1, 2 ** 15), 1.0, dtype=torch.float64)     # H max|i| max|j| = 2^15 * 16 * 1 = 2^19: exact
    assert fused.exact_logits(wide, torch.full((3, 2 ** 15), 0.5, dtype=torch.float64))
    assert not fused.exact_logits(wide * 16, torch.full((3, 2 ** 15), 0.5, dtype=torch.float64))   # 2^23 >= 2^22
