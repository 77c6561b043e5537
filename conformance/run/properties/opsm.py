"""prop.opsm: OPSM = advantage-gated, negated geometric sequence masking; decided per sequence"""

from __future__ import annotations

from mpmath import mp, mpf

from pgspec.reference import REGISTRY, evaluate

from ...corpus import strategies as pst
from ...judge import tolerance
from ._common import Falsified, Property, REF_DIGITS, _fmt, _need, _pylist, _s, call, ref


OPSM_DELTAS = (0.5, 0.125, 0.25, 0.0)


def _opsm_build(src, fid):
    tok = src.boolean(2)
    data = pst.padded_batch(src, ("logprobs", "sampler_logprobs", "advantages"), max_B=5, max_T=6,
                            per_token_advantages=tok, mismatch=64, empty=True)
    return {"inputs": {k: data[k] for k in ("logprobs", "sampler_logprobs", "advantages", "mask")},
            "params": {"delta": src.choice(OPSM_DELTAS)}}


def _opsm_extra(fid):
    """Hand-made: per-token advantages of both signs in sequences the sampler over-predicts by 0.5
    per token (delta 0.25): the sequence's mean advantage decides for every token."""
    return [{"inputs": {
        "logprobs": [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, "nan"]],
        "sampler_logprobs": [[-0.5, -0.5, -0.5], [-0.5, -0.5, -0.5], [-1.0, -1.0, "inf"]],
        "advantages": [[1.0, -1.0, -1.0], [-1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]],
        "mask": [[True, True, True], [True, True, True], [True, True, False]]},
        "params": {"delta": 0.25}}]


def _geo_params(delta):
    with mp.workdps(60):
        return {"numerator": "logprobs", "lower": mp.nstr(mp.exp(-mpf(delta)), 50), "upper": None}


def _geo_inputs(inputs):
    return {k: inputs[k] for k in ("logprobs", "sampler_logprobs", "mask")}


def _opsm_reference(fid, ex):
    inputs, delta = ex["inputs"], ex["params"]["delta"]
    o = ref(fid, inputs, ex["params"])
    g = evaluate("mask.geometric_sequence", _geo_inputs(inputs), _geo_params(delta))
    for i, row in enumerate(inputs["mask"]):
        if abs(o["seq_stat"][i] - mpf(delta)) <= mpf(10) ** -REF_DIGITS:
            continue   # a tie: exp(-delta) is rounded, the statistic is exact
        gate = o["seq_advantage"][i] >= 0 or g["seq_keep"][i]
        if o["seq_keep"][i] != gate:
            raise Falsified(f"mask.opsm row {i}: seq_keep {o['seq_keep'][i]} but advantage-gated geometric mask gives "
                            f"{gate} (kappa {_fmt(o['seq_stat'][i])}, delta {delta}, A {_fmt(o['seq_advantage'][i])})")
        for t, m in enumerate(row):
            if m and o["keep"][i][t] != o["seq_keep"][i]:
                raise Falsified(f"mask.opsm keep[{i}][{t}] = {o['keep'][i][t]} differs from its sequence's decision")


def _opsm_adapter(ctx, fid, ex):
    _need(ctx, fid)
    inputs, params = ex["inputs"], ex["params"]
    r = ref(fid, inputs, params)
    out, _, tensors = call(ctx, fid, inputs, params)
    seq_keep = _pylist(out["seq_keep"])
    keep = _pylist(out["keep"])
    has_geo = "mask.geometric_sequence" in ctx.adapter.capabilities()
    geo = _pylist(call(ctx, "mask.geometric_sequence", _geo_inputs(inputs), {**_geo_params(params["delta"]),
                                                                              "lower": float(_geo_params(params["delta"])["lower"])})[0]["seq_keep"]) if has_geo else None
    for i, row in enumerate(inputs["mask"]):
        scale = _s(r, "seq_stat", i)
        near = abs(r["seq_stat"][i] - mpf(params["delta"])) <= tolerance.bound("mask", ctx.dtype, scale) * 2
        if not near and bool(seq_keep[i]) != r["seq_keep"][i]:
            raise Falsified(f"mask.opsm row {i}: seq_keep {bool(seq_keep[i])}, reference {r['seq_keep'][i]} (kappa "
                            f"{_fmt(r['seq_stat'][i])}, delta {params['delta']}, sequence advantage "
                            f"{_fmt(r['seq_advantage'][i])})")
        for t, m in enumerate(row):
            if m and bool(keep[i][t]) != bool(seq_keep[i]):
                raise Falsified(f"mask.opsm keep[{i}][{t}] = {bool(keep[i][t])} but the sequence's decision is "
                                f"{bool(seq_keep[i])}: OPSM must be decided per sequence (by the sequence's mean "
                                f"advantage), not per token")
            if m and not near and bool(keep[i][t]) != r["seq_keep"][i]:
                raise Falsified(f"mask.opsm keep[{i}][{t}] = {bool(keep[i][t])}, reference {r['seq_keep'][i]}")
        if has_geo and not near:
            gate = r["seq_advantage"][i] >= 0 or bool(geo[i])
            if bool(seq_keep[i]) != gate:
                raise Falsified(f"mask.opsm row {i}: seq_keep {bool(seq_keep[i])} but the adapter's "
                                f"mask.geometric_sequence gated by the advantage's sign gives {gate}")
    return ctx.worst



PROPERTY = Property("prop.opsm", "OPSM = advantage-gated negated geometric sequence masking, decided per sequence",
                   lambda: ("mask.opsm",) if "mask.opsm" in REGISTRY else (), _opsm_build, _opsm_reference,
                   _opsm_adapter, _opsm_extra)
