"""loss.* recipes: one ms-swift ``loss_type`` (plus options) per recipe, run through ``_compute_loss_and_metrics``.

``loss`` is the scalar ms-swift returns (one process, one accumulation step; for the ``dapo``/``cispo``
normalizer ``num_items_in_batch`` is the batch's own token count).  ``terms`` is ms-swift's ``per_token_loss``
read back with autograd (see impls.py).
"""

from __future__ import annotations

from ._engine import UnsupportedParameter, compute_loss, make_stub
from .impls import _data, _p, _require, _sample_mean_scale, euler_readout, mask_readout

IS_MODES = {("token", "truncate"): "token_truncate", ("token", "mask"): "token_mask",
            ("geometric", "truncate"): "sequence_truncate", ("geometric", "mask"): "sequence_mask"}


def _config(fid, params, inputs):
    P = lambda n: _p(params, fid, n)  # noqa: E731
    recipe = fid.split(".", 1)[1]
    for n, v in (("kl_log_ratio_min", -20.0), ("kl_log_ratio_max", 20.0), ("kl_output_min", -10.0),
                 ("kl_output_max", 10.0)):
        _require(params, fid, n, (None, v), "ms-swift always clamps the KL log-ratio to [-20, 20] and the KL to [-10, 10]")
    _require(params, fid, "kl_estimator", "k3", "ms-swift's KL is k3 only")
    kw = dict(beta=float(P("beta")))
    if P("is_level") != "none":
        key = (P("is_level"), P("is_mode"))
        if key not in IS_MODES:
            raise UnsupportedParameter(f"{fid}: is_level={key[0]!r}: rollout_importance_sampling_mode has token and "
                                       "geometric (sequence_*) levels only")
        _require(params, fid, "is_c_min", None, "rollout_importance_sampling_threshold is an upper bound only")
        _require(params, fid, "is_log_ratio_clamp", (None, 20.0), "the IS log-ratio is always clamped to [-20, 20]")
        kw.update(is_mode=IS_MODES[key], is_threshold=P("is_c_max"))
    if P("opsm_delta") is not None:
        _require(params, fid, "opsm_advantage_gate", "sequence_mean", "ms-swift gates by the mean advantage")
        kw["opsm_delta"] = P("opsm_delta")
    if P("entropy_quantile") is not None:
        kw["top_entropy_quantile"] = P("entropy_quantile")
    level = "token"
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "cispo"):
        kw["eps_high"] = P("eps_high")
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "gspo"):
        kw["eps_low"] = P("eps_low")
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "sapo", "cispo"):
        _require(params, fid, "log_ratio_clamp", None, "ms-swift takes exp of the raw log-ratio")
    loss_type = {"gspo": "grpo"}.get(recipe, recipe)
    if recipe == "gspo":
        _require(params, fid, "log_ratio_max", None, "the sequence log-weight is not capped")
        level = "sequence"
    elif recipe in ("dapo", "cispo"):
        if P("aggregation") == "prompt_mean":
            g = inputs.get("group_ids")
            if g is not None and len(set(g[inputs["mask"].any(-1)].tolist())) > 1:
                raise UnsupportedParameter(f"{fid}: aggregation='prompt_mean' over several prompt groups: the "
                                           "dapo normalizer pools the batch (token_mean)")
        if recipe == "cispo":
            _require(params, fid, "cap_form", "absolute", "loss_type='cispo' caps the ratio at epsilon_high itself")
            _require(params, fid, "eps_low", None, "loss_type='cispo' has no lower bound")
    elif recipe == "dr_grpo":
        _require(params, fid, "divide_by", "K*N", "dr_grpo divides by B * max_completion_length")
        kw["max_completion_length"] = P("divisor")
    elif recipe == "sapo":
        kw.update(tau_pos=P("tau_pos"), tau_neg=P("tau_neg"))
    return dict(kw, loss_type=loss_type, level=level)


def _loss(fid):
    def run(inputs, params):
        import torch

        kw = _config(fid, params, inputs)
        data = _data(inputs)
        if "is_mode" in kw and data["sampler_logprobs"] is None:
            raise ValueError(f"{fid}: is_level needs sampler_logprobs")
        loss, _ = compute_loss(make_stub(**kw), **data)
        if "opsm_delta" in kw:
            # the off-policy mask is and-ed into the completion mask (a bool operation): no float-mask read-out
            return {"loss": loss}
        d = dict(data, logprobs=data["logprobs"].detach())
        if kw["level"] == "token" and kw["loss_type"] != "sapo":
            rt = "cispo" if kw["loss_type"] == "cispo" else "dapo"
            terms, _ = mask_readout(d, vjp=False, **dict(kw, loss_type=rt))
            return {"loss": loss, "terms": terms.detach()}
        # the policy part by Euler's identity (linear in A), then the KL part with A = 0
        scale = _sample_mean_scale(d["mask"], d["logprobs"].dtype) if kw["loss_type"] == "sapo" else 1
        rt = "sapo" if kw["loss_type"] == "sapo" else "dapo"
        terms, _ = euler_readout(dict(d), scale, vjp=False, **dict(kw, loss_type=rt, beta=0.0))
        if kw["beta"] != 0:
            zero = dict(d, advantages=torch.zeros_like(d["advantages"]))
            kl, _ = mask_readout(zero, vjp=False, **dict(kw, loss_type="cispo", level="token", eps_high=1.0))
            terms = terms + kl
        return {"loss": loss, "terms": terms.detach()}

    run.__name__ = fid.replace(".", "_")
    return run


RECIPES = ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "cispo", "sapo")
IMPLEMENTATIONS = {f"loss.{r}": _loss(f"loss.{r}") for r in RECIPES}
