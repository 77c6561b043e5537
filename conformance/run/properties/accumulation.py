"""prop.accumulation: micro-batches with global denominators add up; per-micro-batch means do not"""

from __future__ import annotations

from mpmath import mp

from pgspec.reference import REGISTRY, evaluate
from pgspec.reference import agg as ref_agg

from ...corpus import strategies as pst
from ._common import BASE_PARAMS, Property, _assert_same, _need, _s, _seq_inputs, call, compare, compare_to_ref, ref
from .cp_rank_sum import AGGREGATORS, full_denominator_params


MEGATRON_7452 = {"inputs": {"values": [[6.0, 0.0, 0.0], [2.0, 4.0, 4.0]],
                            "mask": [[True, False, False], [True, True, True]]},
                 "params": {}, "micro_batch_sizes": [1, 1]}


def _acc_build(src, fid):
    fields = ("values", "mask") + (("group_ids",) if fid == "agg.prompt_mean" else ()) + \
             (("document_ids",) if fid == "agg.document_mean" else ())
    data = pst.padded_batch(src, fields, max_B=5, max_T=6)
    B = len(data["mask"])
    return {"inputs": {k: data[k] for k in fields}, "params": dict(BASE_PARAMS.get(fid, {})),
            "micro_batch_sizes": pst.micro_batch_sizes(src, B)}


def _acc_params(fid, ex):
    return {"micro_batch_sizes": ex["micro_batch_sizes"], "aggregator": fid, "agg_params": ex["params"] or None}


def _rows(fid, inputs, start, stop):
    return {n: (x[start:stop] if n in _seq_inputs(fid, inputs) else x) for n, x in inputs.items()}


def _micro_params(fid, fparams, start, stop):
    out = dict(fparams)
    for name in ref_agg.DENOMINATOR_PARAMS[fid]:
        v = out.get(name)
        if isinstance(v, list):
            out[name] = v[start:stop]
    return out


def _acc_reference(fid, ex):
    inputs, params = ex["inputs"], ex["params"]
    whole = ref(fid, inputs, params)
    acc = evaluate("dist.accumulate", inputs, _acc_params(fid, ex))
    label = f"{fid} micro_batch_sizes={ex['micro_batch_sizes']}"
    _assert_same(f"{label}: accumulated total vs whole-batch value", acc["total"], whole["value"], _s(whole, "value"))
    _assert_same(f"{label}: accumulated gradient", acc["grad"]["values"], whole["grad"]["values"])
    fparams = full_denominator_params(fid, inputs, params)
    start, parts = 0, []
    for s in ex["micro_batch_sizes"]:
        parts.append(evaluate(fid, _rows(fid, inputs, start, start + s), _micro_params(fid, fparams, start, start + s))["value"])
        start += s
    _assert_same(f"{label}: micro-batch values (whole-batch denominators) vs contributions", parts, acc["contributions"])


def _acc_adapter(ctx, fid, ex):
    _need(ctx, fid)
    inputs, params = ex["inputs"], ex["params"]
    label = f"{fid} micro_batch_sizes={ex['micro_batch_sizes']}"
    r = ref(fid, inputs, params)
    family = REGISTRY[fid].family
    fparams = full_denominator_params(fid, inputs, params)
    start, total, grads_rows = 0, 0.0, []
    for k, s in enumerate(ex["micro_batch_sizes"]):
        sub, p = _rows(fid, inputs, start, start + s), _micro_params(fid, fparams, start, start + s)
        out, grads, _ = call(ctx, fid, sub, p)
        rr = ref(fid, sub, p)
        compare(ctx, f"{label}: micro-batch {k} ({fid} with the whole batch's denominators)", out["value"], rr["value"],
                _s(rr, "value"), family)
        total += float(out["value"].detach().double())
        grads_rows += grads["values"].detach().double().tolist()
        start += s
    compare(ctx, f"{label}: sum over micro-batches vs whole-batch value", total, r["value"], _s(r, "value"), family)
    compare(ctx, f"{label}: accumulated gradient vs whole-batch gradient", grads_rows, r["grad"]["values"],
            _s(r, "grad.values"), family)
    if "dist.accumulate" in ctx.adapter.capabilities():
        dp = _acc_params(fid, ex)
        out, grads, _ = call(ctx, "dist.accumulate", inputs, dp)
        ra = ref("dist.accumulate", inputs, dp)
        compare_to_ref(ctx, "dist.accumulate", f"{label}: dist.accumulate", out, grads, ra)
    return ctx.worst


def naive_difference(fid, ex) -> tuple:
    """(global total, naive per-micro-batch mean, relative difference) from the reference: the
    documented non-invariance of per-micro-batch normalization (Megatron-LM#7452)."""
    acc = ref("dist.accumulate", ex["inputs"], _acc_params(fid, ex))
    total, naive = acc["total"], acc["naive"]
    with mp.workdps(60):
        rel = abs(naive - total) / abs(total) if total else abs(naive)
    return total, naive, rel



PROPERTY = Property("prop.accumulation", "Micro-batch accumulation invariance with global denominators",
                   lambda: AGGREGATORS, _acc_build, _acc_reference, _acc_adapter,
                   lambda fid: [MEGATRON_7452] if fid == "agg.token_mean" else [])
