"""The composites at production vocabulary size: log-probs from hidden states and an LM head
(``run_logprob_checks``, logprob.py) and a token loss from them (``run_head_loss_checks``,
head_loss.py), judged chunk by chunk."""

from __future__ import annotations

import time

from pgspec.reference import REGISTRY

from . import branches as cb
from ..judge import compare
from .common import CheckError, CheckResult
from .draws import seeded_inputs
from .scales import oracle_params
from .judging import ChunkJudge, classify_result, conclude, timed_adapter_call


def _seeded_head(B, T, V, H, device, seed):
    """(H, check_logprob.seeded_head's arrays) for a check through a linear head (H None: the default
    width), or CheckError for a bad size or a CUDA device that is not there."""
    import torch

    from . import logprob as lp

    H = lp.DEFAULT_HIDDEN if H is None else H
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckError("--device cuda: no CUDA device is available")
    try:
        return H, lp.seeded_head(B, T, V, H, seed)
    except ValueError as e:
        raise CheckError(str(e)) from None


def run_logprob_checks(adapter, B, T, V, H, dtypes, device, seed, params) -> list[CheckResult]:
    """``logprob.token`` at [B, T] positions over a vocabulary of V through a linear head of width H,
    one CheckResult per dtype: the adapter's results in every dtype are kept (on their device), then
    judged together in one pass of the oracle over the positions."""
    import torch

    from . import logprob as lp

    p = lp.check_params(params)
    H, arrays = _seeded_head(B, T, V, H, device, seed)
    head = getattr(adapter, "heads", {}).get(lp.FORMULA)
    y = torch.as_tensor(arrays["targets"], device=device)
    m = torch.as_tensor(arrays["mask"], device=device)
    results, judged = [], []
    for dtype in dtypes:
        res = CheckResult(adapter.name, lp.FORMULA, dtype, device, [B, T], seed, "pass", vocab=V, hidden=H)
        results.append(res)
        if dtype not in adapter.dtypes or (head is None and lp.FORMULA not in adapter.capabilities()):
            res.outcome, res.message = "unsupported", f"{adapter.name} does not implement {lp.FORMULA} in {dtype}"
            continue
        res.path = "head" if head is not None else "logits"
        got = timed_adapter_call(res, device, _logprob_work(adapter, head, arrays, y, m, p, dtype, device))
        if got is None:
            continue
        got_lp, got_gx = got
        if tuple(got_lp.shape) != (B, T) or tuple(got_gx.shape) != (B, T, H):
            res.outcome = "error"
            res.message = f"shapes: logprobs {tuple(got_lp.shape)} (expected {(B, T)}), grad.hidden " \
                          f"{tuple(got_gx.shape)} (expected {(B, T, H)})"
            continue
        judged.append((res, got_lp.detach().reshape(-1), got_gx.detach().reshape(B * T, H),
                       ChunkJudge("logprobs", "logprob", dtype, (B, T)), ChunkJudge("grad.hidden", "logprob", dtype, (B, T))))
        del got, got_lp, got_gx
    if not judged:
        return results
    mflat = m.reshape(-1)
    t = time.perf_counter()
    for sl, ref_lp, El, ref_gx, SX in lp.oracle_chunks(arrays, p, device):
        for _, got_lp, got_gx, j_lp, j_gx in judged:
            j_lp.add(sl.start, got_lp[sl], ref_lp, El, mflat[sl])
            # the gradient is compared at every position: 0 (exactly) where the mask is false
            j_gx.add(sl.start, got_gx[sl], ref_gx, SX, torch.ones_like(mflat[sl]))
    seconds = time.perf_counter() - t
    for res, _, _, j_lp, j_gx in judged:
        res.oracle_seconds = seconds
        res.outputs = [j_lp.out, j_gx.out]
        conclude(res)
        classify_result(adapter, res, lp.FORMULA, params, arrays, seed)
    return results


def run_head_loss_checks(adapter, formula, B, T, V, H, dtypes, device, seed, params, chunk=8,
                         sampler: bool = False) -> list[CheckResult]:
    """A token loss (check_head_loss.FORMULAS) from hidden states [B, T, H] and an LM head [V, H]
    (check_head_loss.py), one CheckResult per dtype: the float64 oracle first (the old log-probs are
    drawn around its log-probs), then the adapter's head (``adapter.heads[formula]``) in each dtype,
    judged on the loss and on every element of the gradient with respect to the hidden states."""
    import torch

    from . import head_loss as hl

    p = oracle_params(formula, params, head=True)
    H, arrays = _seeded_head(B, T, V, H, device, seed)
    head = getattr(adapter, "heads", {}).get(formula)
    kl = bool(float(p["beta"]))
    results = []
    for dtype in dtypes:
        res = CheckResult(adapter.name, formula, dtype, device, [B, T], seed, "pass", vocab=V, hidden=H, path="head")
        results.append(res)
        lacks = [k for k, wanted in (("ref_logprobs", kl), ("sampler_logprobs", sampler))
                 if wanted and head is not None and not hl.takes_keyword(head, k)]
        if head is None or dtype not in adapter.dtypes or lacks:
            res.outcome = "unsupported"
            res.message = (f"{adapter.name} has no fused head for {formula} (adapter.heads[{formula!r}], "
                           f"conformance/check/head_loss.py HEAD_PROTOCOL)" if head is None else
                           f"{adapter.name} does not run in {dtype}" if dtype not in adapter.dtypes else
                           f"{adapter.name}'s fused head for {formula} takes no ref_logprobs: it has no KL term "
                           f"(beta={p['beta']}; conformance/check/head_loss.py HEAD_PROTOCOL)" if lacks[0] == "ref_logprobs"
                           else f"{adapter.name}'s fused head for {formula} takes no sampler_logprobs: it folds none "
                           f"into phi (--sampler; conformance/check/head_loss.py HEAD_PROTOCOL)")
    if not any(r.outcome == "pass" for r in results):
        return results
    adv = seeded_inputs(formula, B, T, seed)["advantages"]
    t = time.perf_counter()
    ref = hl.oracle(arrays, adv, p, device, seed, chunk=chunk, formula=formula, sampler=True if sampler else None)
    seconds = time.perf_counter() - t
    y = torch.as_tensor(arrays["targets"], device=device)
    m = torch.as_tensor(arrays["mask"], device=device)
    N = B * T
    family = REGISTRY[formula].family
    found = cb.branches(formula, {"mask": arrays["mask"], **{k: ref[k].cpu().numpy() for k in (
        "logprobs", "old_logprobs", "advantages", "ref_logprobs", "sampler_logprobs") if k in ref}}, p)
    for res in results:
        if res.outcome != "pass":
            continue
        res.oracle_seconds = seconds
        res.branches, res.unreached = [b.to_json() for b in found], cb.unreached(found)
        tdtype = getattr(torch, compare.TORCH_DTYPES[res.dtype])
        X = torch.as_tensor(arrays["hidden"], device=device).to(tdtype)
        W = torch.as_tensor(arrays["weight"], device=device).to(tdtype)
        side = getattr(torch, compare.TORCH_DTYPES[hl.side_dtype(res.dtype)])
        old, adv_t = ref["old_logprobs"].to(side), ref["advantages"].to(side)        # exact (float32 values)
        extra = {k: ref[k].to(side) for k in ("ref_logprobs", "sampler_logprobs") if k in ref}  # exact (bfloat16 values)

        def work():     # what the head returns is checked before it is read (run/untrusted.py, issue 39)
            from ..run.untrusted import check_tensor, require_dict

            out = require_dict(head(X, W, y, m, old, adv_t, dict(p), **extra), ("loss", "grad"))
            grad = require_dict(out.get("grad"), ("hidden",), "the head's 'grad'")
            loss = out.get("loss")
            scalar = tuple(loss.shape) if torch.is_tensor(loss) and loss.numel() == 1 else ()
            check_tensor("loss", loss, scalar, res.dtype, device)
            check_tensor("grad.hidden", grad.get("hidden"), (B, T, H), res.dtype, device, "gradient")
            return loss, grad["hidden"]

        got = timed_adapter_call(res, device, work)
        if got is None:
            continue
        loss, gx = got
        if loss.numel() != 1 or tuple(gx.shape) != (B, T, H):
            res.outcome = "error"
            res.message = f"shapes: loss {tuple(loss.shape)} (expected a scalar), grad.hidden {tuple(gx.shape)} " \
                          f"(expected {(B, T, H)})"
            continue
        j_loss, j_gx = ChunkJudge("loss", family, res.dtype, (B, T)), ChunkJudge("grad.hidden", family, res.dtype, (B, T))
        one = torch.ones(1, dtype=torch.bool, device=device)
        j_loss.add(0, loss.detach().reshape(1), ref["loss"].reshape(1), ref["E(loss)"].reshape(1), one)
        gx = gx.detach().reshape(N, H)
        rows = max(1, (1 << 24) // H)            # the judge's float64 temporaries: a slice of rows at a time
        for start in range(0, N, rows):
            sl = slice(start, min(N, start + rows))
            # the gradient is compared at every position: 0 (exactly) where the mask is false
            j_gx.add(start, gx[sl], ref["grad.hidden"][sl], ref["S(grad.hidden)"][sl],
                     torch.ones(sl.stop - sl.start, dtype=torch.bool, device=device))
        res.outputs = [j_loss.out, j_gx.out]
        conclude(res)
        classify_result(adapter, res, formula, params, arrays, seed)
    return results


def _logprob_work(adapter, head, arrays, y, m, p, dtype, device):
    """The adapter's call in ``dtype``: (log-probs [B, T], gradient wrt the hidden states [B, T, H])."""
    import torch

    from . import logprob as lp

    tdtype = getattr(torch, compare.TORCH_DTYPES[dtype])
    X = torch.as_tensor(arrays["hidden"], device=device).to(tdtype)
    W = torch.as_tensor(arrays["weight"], device=device).to(tdtype)

    from ..run.untrusted import check_tensor, require_dict, require_differentiable

    B, T, H = X.shape

    def work():     # what the adapter returns is checked before it is read (run/untrusted.py, issue 39)
        if head is not None:
            out = require_dict(head(X, W, y, m, dict(p)), ("logprobs", "grad"))
            grad = require_dict(out.get("grad"), ("hidden",), "the head's 'grad'")
            check_tensor("logprobs", out.get("logprobs"), (B, T), dtype, device)
            check_tensor("grad.hidden", grad.get("hidden"), (B, T, H), dtype, device, "gradient")
            return out["logprobs"], grad["hidden"]
        Xg = X.detach().requires_grad_(True)
        with torch.enable_grad():
            o = require_dict(adapter.call(lp.FORMULA, {"logits": Xg @ W.T, "targets": y, "mask": m}, dict(p)),
                             ("logprobs",))
            check_tensor("logprobs", o.get("logprobs"), (B, T), dtype, device)
            require_differentiable("logprobs", o["logprobs"], ["logits"])
            (gx,) = torch.autograd.grad(compare.objective(o["logprobs"], m), [Xg])
        return o["logprobs"], gx

    return work
