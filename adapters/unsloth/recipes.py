"""loss.* recipes: one Unsloth ``loss_type`` (plus options) per recipe.

``loss`` is the scalar unsloth-zoo returns (one process, ``current_gradient_accumulation_steps = 1``, no
``steps_per_generation``; for the ``dapo``/``cispo`` normalizer ``num_items_in_batch`` is the batch's own token
count, the spec's "whole scope").  The ``unsloth`` adapter calls ``grpo_compute_loss`` eagerly and lets autograd
differentiate it; ``unsloth-compiled`` calls ``UnslothEfficientGRPO.apply`` (the compiled trainer path) and
its gradient is Unsloth's own (formed in the forward by ``torch.func.grad_and_value``).  ``terms`` (eager
only) is read back from ``grpo_compute_loss`` with autograd (see impls.py).
"""

from __future__ import annotations

from ._engine import UnsupportedParameter, eager, fused, options
from .impls import _data, _p, _require, policy_terms, token_terms

IS_MODES = {("token", "truncate"): "token_truncate", ("token", "mask"): "token_mask",
            ("sequence", "truncate"): "sequence_truncate", ("sequence", "mask"): "sequence_mask",
            ("geometric", "truncate"): "geometric_truncate", ("geometric", "mask"): "geometric_mask"}


def _config(fid, params, inputs):
    """(beta, grpo_compute_loss keyword arguments) for this recipe and these parameters."""
    P = lambda n: _p(params, fid, n)  # noqa: E731
    recipe = fid.split(".", 1)[1]
    if P("opsm_delta") is not None:
        raise UnsupportedParameter(f"{fid}: off_policy_mask_threshold runs TRL's get_off_policy_mask, not Unsloth's code")
    if P("entropy_quantile") is not None:
        raise UnsupportedParameter(f"{fid}: top_entropy_quantile runs TRL's get_high_entropy_mask, not Unsloth's code")
    for n, v in (("kl_log_ratio_min", -20.0), ("kl_log_ratio_max", 20.0), ("kl_output_min", -10.0),
                 ("kl_output_max", 10.0)):
        _require(params, fid, n, (None, v), "Unsloth always clamps the KL log-ratio to [-20, 20] and the KL to [-10, 10]")
    est = P("kl_estimator")
    if est not in ("k3", "k3_unbiased"):
        raise UnsupportedParameter(f"{fid}: kl_estimator={est!r}: Unsloth has k3 and k3 times the ratio only")
    kw = dict(bias_correction_kl=est == "k3_unbiased")
    if P("is_level") != "none":
        _require(params, fid, "is_log_ratio_clamp", None, "the vLLM IS log-ratio is not clamped")
        kw.update(is_mode=IS_MODES[(P("is_level"), P("is_mode"))], is_c_min=P("is_c_min"), is_c_max=P("is_c_max"))
    level = "token"
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "luspo", "cispo"):
        kw["eps_high"] = P("eps_high")
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "luspo"):
        kw["eps_low"] = P("eps_low")
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "sapo", "cispo"):
        _require(params, fid, "log_ratio_clamp", None, "Unsloth takes exp of the raw log-ratio")
    loss_type = {"gspo": "grpo"}.get(recipe, recipe)
    if recipe == "gspo":
        _require(params, fid, "log_ratio_max", None, "the sequence log-weight is not capped")
        level = "sequence"
    elif recipe == "luspo":
        level = P("ratio_level")
    elif recipe in ("dapo", "cispo"):
        if P("aggregation") == "prompt_mean":
            g = inputs.get("group_ids")
            if g is not None and len(set(g[inputs["mask"].any(-1)].tolist())) > 1:
                raise UnsupportedParameter(f"{fid}: aggregation='prompt_mean' over several prompt groups: the "
                                           "dapo normalizer pools the batch (token_mean)")
        kw["num_items_in_batch"] = inputs["mask"].sum().to(inputs["logprobs"].dtype)
        if recipe == "cispo":
            _require(params, fid, "cap_form", "absolute", "loss_type='cispo' caps the ratio at epsilon_high itself")
            _require(params, fid, "eps_low", None, "loss_type='cispo' has no lower bound")
    elif recipe == "dr_grpo":
        _require(params, fid, "divide_by", "K*N", "dr_grpo divides by B * max_completion_length")
        kw["max_completion_length"] = P("divisor")
    elif recipe == "sapo":
        kw.update(sapo_tau_pos=P("tau_pos"), sapo_tau_neg=P("tau_neg"))
    return float(P("beta")), options(loss_type=loss_type, level=level, **kw)


def _loss(fid, compiled):
    def run(inputs, params):
        import torch

        beta, kw = _config(fid, params, inputs)
        data = _data(inputs)
        if kw.get("use_vllm") and data["sampler_logprobs"] is None:
            raise ValueError(f"{fid}: is_level needs sampler_logprobs")
        if compiled:
            loss = fused(**dict(data, beta=beta), **kw)[0]
            # UnslothEfficientGRPO.backward returns the gradient it saved in forward and ignores grad_output
            # (unless DeepSpeed's upstream_scale is set): the trainer calls it through loss.backward(), whose
            # grad_output is 1.  The adapter takes that gradient as its own, and pgspec scales it by the
            # case's cotangent (one number for a scalar loss: pgspec.adapters.base.current_cotangent).
            (grad,) = torch.autograd.grad(loss, inputs["logprobs"])
            return {"loss": loss.detach(), "grad": {"logprobs": grad}}
        loss = eager(**dict(data, beta=beta), **kw)[0]
        terms = policy_terms(data, kw)
        if beta != 0:
            if kw["importance_sampling_level"] == "sequence" and kw["use_bias_correction_kl"]:
                # the KL is multiplied by the *sequence* ratio, which depends on the whole row's mask: a
                # column-by-column read-out would not be what Unsloth computes; ``terms`` (optional) is left out
                return {"loss": loss}
            zero = dict(data, advantages=torch.zeros(data["mask"].shape[0], dtype=data["logprobs"].dtype))
            kl_kw = dict(kw, loss_type="cispo", epsilon_high=1.0, importance_sampling_level="token")
            for k in ("use_vllm", "vllm_importance_sampling_correction"):
                kl_kw.pop(k, None)
            terms = terms + token_terms(zero, kl_kw, beta)
        return {"loss": loss, "terms": terms.detach()}

    run.__name__ = fid.replace(".", "_")
    return run


RECIPES = ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "cispo", "sapo", "luspo")
IMPLEMENTATIONS = {f"loss.{r}": _loss(f"loss.{r}", False) for r in RECIPES}
COMPILED_IMPLEMENTATIONS = {f"loss.{r}": _loss(f"loss.{r}", True) for r in RECIPES}
