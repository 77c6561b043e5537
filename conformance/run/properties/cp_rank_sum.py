"""prop.cp_rank_sum: CP ranks' contributions (full-mask denominators) add up to the cp = 1 value"""

from __future__ import annotations

from functools import lru_cache

from mpmath import mp

from pgspec.reference import REGISTRY, evaluate
from pgspec.reference import agg as ref_agg
from pgspec.reference import dist as ref_dist

from ...corpus import strategies as pst
from ._common import (BASE_PARAMS, Property, Unsupported, _assert_same, _close, _need, _s, _tensors, _torch, admit,
                      call, compare, formula_example, note_drawn, ref, refused_options)


AGGREGATORS = tuple(ref_agg.AGGREGATORS)

# recipe -> (aggregator, the recipe's params that are aggregator params); unknown recipes are inferred
RECIPE_AGGREGATORS = {
    "loss.grpo": "agg.sample_mean", "loss.gspo": "agg.sample_mean", "loss.sapo": "agg.sample_mean",
    "loss.gmpo": "agg.sample_mean", "loss.luspo": "agg.seq_mean_token_sum", "loss.minirl": "agg.seq_mean_token_sum",
    "loss.vespo": "agg.token_mean", "loss.bnpo": "agg.token_mean", "loss.dr_grpo": "agg.constant",
}


def recipe_aggregator(fid: str, params: dict) -> tuple[str, dict]:
    """(agg.* ID, its parameters) that recipe ``fid`` reduces its ``terms`` with."""
    f = REGISTRY[fid]
    defaults = {p.name: p.default for p in f.params}
    p = {**defaults, **params}
    if "aggregation" in defaults:
        return ("agg.prompt_mean" if p["aggregation"] == "prompt_mean" else "agg.token_mean"), {}
    if fid == "loss.dr_grpo":
        return "agg.constant", {"divisor": p["divisor"], "divide_by": p["divide_by"]}
    if fid in RECIPE_AGGREGATORS:
        return RECIPE_AGGREGATORS[fid], {}
    return _infer_aggregator(fid)


@lru_cache(maxsize=None)
def _infer_aggregator(fid):
    """For a recipe not in the table: the one aggregator (default parameters) that reproduces its
    loss from its terms on a ragged example (distinct lengths separate every candidate)."""
    ex = formula_example(pst.SeededSource(7), fid, B=4, T=6, empty=False)
    ex["inputs"]["mask"] = [[t < n for t in range(6)] for n in (1, 2, 4, 6)]
    if "group_ids" in ex["inputs"]:
        ex["inputs"]["group_ids"] = [0, 0, 0, 1]
    r = evaluate(fid, ex["inputs"], ex["params"])
    found = []
    for a in ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.prompt_mean"):
        inputs = {"values": [[v if v is not None else 0 for v in row] for row in r["terms"]], "mask": ex["inputs"]["mask"]}
        if a == "agg.prompt_mean":
            inputs["group_ids"] = ex["inputs"].get("group_ids", [0, 0, 0, 1])
        if _close(evaluate(a, inputs)["value"], r["loss"]):
            found.append(a)
    if len(found) != 1:
        raise Unsupported(f"{fid}: cannot tell which aggregator reduces its terms (candidates: {found or 'none'})")
    return found[0], {}


def _cp_formulas():
    return AGGREGATORS + tuple(fid for fid in sorted(REGISTRY) if fid.startswith("loss."))


def _cp_build(src, fid):
    cp = pst.cp_partition(src)
    min_prompt = 1 if cp["ownership"] == "logit" else 0
    short = src.boolean(3)   # sequences shorter than 2 cp
    max_T = 2 * cp["cp_size"] - 1 if short and 2 * cp["cp_size"] > 2 else 9
    if fid in AGGREGATORS:
        fields = ("values", "mask") + (("group_ids",) if fid == "agg.prompt_mean" else ()) + \
                 (("document_ids",) if fid == "agg.document_mean" else ())
        data = pst.padded_batch(src, fields, max_T=max(max_T, min_prompt + 1), min_prompt=min_prompt)
        ex = {"inputs": {k: data[k] for k in fields}, "params": dict(BASE_PARAMS.get(fid, {}))}
    else:
        ex = formula_example(src, fid, max_T=max(max_T, min_prompt + 1), min_prompt=min_prompt)
    if cp["layout"] == "bshd" and "max_seq_len" not in refused_options(src) and src.boolean():
        # slime's max_seq_len: every row cut by S >= T instead of the padded width T (drawn after the
        # batch, so the batch is the one drawn without it); S = T + 2C always changes the chunk size
        cp["max_seq_len"] = len(ex["inputs"]["mask"][0]) + 2 * cp["cp_size"]
        note_drawn(src, "max_seq_len")
    ex["cp"] = cp
    return ex


def _owner(ex):
    cp = ex["cp"]
    ranks, _, _ = ref_dist.cp_owner_map(ex["inputs"]["mask"], cp["cp_size"], cp["layout"], cp["ownership"], None,
                                        max_seq_len=cp.get("max_seq_len"))
    return ranks


def _rank_masks(ex):
    ranks = _owner(ex)
    mask = ex["inputs"]["mask"]
    return [[[bool(m) and ranks[i][t] == r for t, m in enumerate(row)] for i, row in enumerate(mask)]
            for r in range(ex["cp"]["cp_size"])]


def full_denominator_params(aggregator, inputs, params):
    """``params`` plus every null denominator of ``aggregator`` counted over the whole batch (plain
    ints and lists): what each shard is given."""
    from pgspec.reference._evaluate import check_params

    checked = check_params(REGISTRY[aggregator], params)
    full = ref_agg.full_denominators(aggregator, inputs["mask"], inputs.get("group_ids"), inputs.get("document_ids"),
                                     checked)
    out = dict(params)
    for name in ref_agg.DENOMINATOR_PARAMS[aggregator]:
        out[name] = full[name]
    return out


def _agg_inputs(aggregator, values, inputs, mask=None):
    out = {"values": values, "mask": inputs["mask"] if mask is None else mask}
    if aggregator == "agg.prompt_mean":
        out["group_ids"] = inputs["group_ids"]
    if aggregator == "agg.document_mean":
        out["document_ids"] = inputs["document_ids"]
    return out


def _loss_rank_parts(fid, ex, masks):
    """Reference per-rank (value, gradient) of a recipe: its terms (as differentiable nodes, whole
    sequences seen by every rank) reduced over each rank's tokens with the full-mask denominators."""
    from pgspec.reference import _ad
    from pgspec.reference._evaluate import _collect, check_params, convert_inputs

    f = REGISTRY[fid]
    aggregator, agg_params = recipe_aggregator(fid, ex["params"])
    inputs = ex["inputs"]
    parts = []
    with mp.workdps(60):
        checked = check_params(REGISTRY[aggregator], agg_params)
        full = ref_agg.full_denominators(aggregator, inputs["mask"], inputs.get("group_ids"), None, checked)
        for mask_r in masks:
            converted, leaves = convert_inputs(f, inputs)
            raw = f.func(**converted, **check_params(f, ex["params"]))
            value = ref_agg.apply(aggregator, raw["terms"], mask_r, inputs.get("group_ids"), None, full)
            d = _ad.backward(value)
            parts.append((_ad.value_of(value), _collect(leaves["logprobs"], d)))
    return parts


def _sum_nested(items):
    with mp.workdps(60):
        first = items[0]
        if isinstance(first, list):
            return [_sum_nested([x[k] for x in items]) for k in range(len(first))]
        return mp.fsum(items)


def _cp_reference(fid, ex):
    masks = _rank_masks(ex)
    inputs, params, cp = ex["inputs"], ex["params"], ex["cp"]
    label = (f"{fid} cp_size={cp['cp_size']} {cp['layout']} ownership={cp['ownership']}"
             + (f" max_seq_len={cp['max_seq_len']}" if cp.get("max_seq_len") is not None else ""))
    if fid in AGGREGATORS:
        whole = ref(fid, inputs, params)
        fparams = full_denominator_params(fid, inputs, params)
        parts = [evaluate(fid, _agg_inputs(fid, inputs["values"], inputs, m), fparams) for m in masks]
        _assert_same(f"{label}: sum of rank values vs cp=1 value", _sum_nested([p["value"] for p in parts]),
                     whole["value"], _s(whole, "value"))
        _assert_same(f"{label}: sum of rank gradients vs cp=1 gradient",
                     _sum_nested([p["grad"]["values"] for p in parts]), whole["grad"]["values"])
        cpr = evaluate("dist.cp_reduce", inputs, {**cp, "aggregator": fid, "agg_params": params or None})
        _assert_same(f"{label}: dist.cp_reduce partials vs rank values", cpr["partials"], [p["value"] for p in parts])
        _assert_same(f"{label}: dist.cp_reduce gradient", cpr["grad"]["values"], whole["grad"]["values"])
        return
    whole = ref(fid, inputs, params)
    parts = _loss_rank_parts(fid, ex, masks)
    _assert_same(f"{label}: sum of rank losses vs cp=1 loss", _sum_nested([p[0] for p in parts]), whole["loss"],
                 _s(whole, "loss"))
    _assert_same(f"{label}: sum of rank gradients vs cp=1 gradient", _sum_nested([p[1] for p in parts]),
                 whole["grad"]["logprobs"])


def _cp_adapter(ctx, fid, ex):
    torch = _torch()
    inputs, params, cp = ex["inputs"], ex["params"], ex["cp"]
    label = (f"{fid} cp_size={cp['cp_size']} {cp['layout']} ownership={cp['ownership']}"
             + (f" max_seq_len={cp['max_seq_len']}" if cp.get("max_seq_len") is not None else ""))
    r = ref(fid, inputs, params)
    family = REGISTRY[fid].family
    if fid in AGGREGATORS:
        _need(ctx, fid)
        fparams = full_denominator_params(fid, inputs, params)
        total, grad_total = 0.0, None
        for k, m in enumerate(_rank_masks(ex)):
            out, grads, _ = call(ctx, fid, _agg_inputs(fid, inputs["values"], inputs, m), fparams)
            rr = ref(fid, _agg_inputs(fid, inputs["values"], inputs, m), fparams)
            compare(ctx, f"{label}: rank {k} value ({fid} on the rank's tokens, whole-batch denominators)",
                    out["value"], rr["value"], _s(rr, "value"), family)
            total += float(out["value"].detach().double())
            g = grads["values"].detach().double()
            grad_total = g if grad_total is None else grad_total + g
        compare(ctx, f"{label}: sum over ranks vs cp=1 value", total, r["value"], _s(r, "value"), family)
        compare(ctx, f"{label}: sum of rank gradients vs cp=1 gradient", grad_total, r["grad"]["values"],
                _s(r, "grad.values"), family)
        if "dist.cp_reduce" in ctx.adapter.capabilities():
            dparams = {**cp, "aggregator": fid, "agg_params": params or None}
            out, grads, _ = call(ctx, "dist.cp_reduce", inputs, dparams)
            cr = ref("dist.cp_reduce", inputs, dparams)
            s = float(out["partials"].detach().double().sum())
            compare(ctx, f"{label}: dist.cp_reduce partials sum vs cp=1 value", s, r["value"], _s(r, "value"),
                    "dist")
            compare(ctx, f"{label}: dist.cp_reduce partials", out["partials"], cr["partials"], _s(cr, "partials"),
                    "dist")
            compare(ctx, f"{label}: dist.cp_reduce gradient", grads["values"], r["grad"]["values"],
                    _s(r, "grad.values"), "dist")
        return ctx.worst
    # a loss recipe: its terms reduced by the adapter's dist.cp_reduce with the recipe's aggregator
    _need(ctx, fid, "dist.cp_reduce")
    aggregator, agg_params = recipe_aggregator(fid, params)
    cp_params = {**cp, "aggregator": aggregator, "agg_params": agg_params or None}
    admit(ctx, fid, inputs, params)
    admit(ctx, "dist.cp_reduce", {k: v for k, v in (("values", r.get("terms")), ("mask", inputs["mask"]),
                                                   ("group_ids", inputs.get("group_ids"))) if v is not None}, cp_params)
    tensors = _tensors(ctx, fid, inputs)
    with torch.enable_grad():
        out = ctx.adapter.call(fid, tensors, dict(params))
        if "terms" not in out:
            raise Unsupported(f"{ctx.adapter.name}'s {fid} returns no per-token 'terms'")
        cp_in = {"values": out["terms"], "mask": tensors["mask"]}
        if aggregator == "agg.prompt_mean":
            cp_in["group_ids"] = tensors["group_ids"]
        cpo = ctx.adapter.call("dist.cp_reduce", cp_in, cp_params)
        partials = cpo["partials"]
        (g,) = torch.autograd.grad(partials.sum(), [tensors["logprobs"]])
    compare(ctx, f"{label}: {fid} loss", out["loss"], r["loss"], _s(r, "loss"), family)
    compare(ctx, f"{label}: sum over ranks of {aggregator}(terms) vs cp=1 loss",
            float(partials.detach().double().sum()), r["loss"], _s(r, "loss"), family)
    compare(ctx, f"{label}: sum of rank gradients vs cp=1 gradient", g, r["grad"]["logprobs"],
            _s(r, "grad.logprobs"), family)
    return ctx.worst



PROPERTY = Property("prop.cp_rank_sum", "CP rank-sum invariance (zig-zag split, thd and bshd, full-mask denominators)",
                   _cp_formulas, _cp_build, _cp_reference, _cp_adapter)
