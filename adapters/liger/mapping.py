"""Spec parameters -> Liger-Kernel 0.8.5 GRPO configuration (shared by the chunked, fused and
Triton paths).  Nothing here imports torch or liger_kernel.

``liger_config(formula_id, params, inputs)`` returns the keyword arguments of Liger's loss
(``LigerFusedLinearGRPOFunction.ppo_loss_fn`` / ``LigerFusedLinearGRPOLoss`` /
``triton_grpo_loss``, which share the names) for one spec recipe, or raises ``Unsupported`` naming
the parameter value Liger has no counterpart for.
"""

from __future__ import annotations

from pgspec.adapters.base import Unsupported as _PropertyUnsupported
from pgspec.reference import REGISTRY


class Unsupported(_PropertyUnsupported, ValueError):
    """A spec parameter value (or input) that Liger 0.8.5 has no counterpart for.  The declared
    capabilities (deviations.toml) keep golden cases outside them from reaching the adapter; a property
    example outside them raises this, which the property runner reports as ``unsupported``."""


# formula ID -> (Liger loss_type, Liger importance_sampling_level); None: taken from a parameter
RECIPES = {
    "loss.grpo": ("grpo", "token"),
    "loss.dapo": ("dapo", "token"),
    "loss.bnpo": ("bnpo", "token"),
    "loss.dr_grpo": ("dr_grpo", "token"),
    "loss.gspo": ("grpo", "sequence"),
    "loss.cispo": ("cispo", "token"),
    "loss.sapo": ("sapo", "token"),
    "loss.luspo": ("luspo", None),
    "loss.vespo": ("vespo", "token"),
}

# spec parameter -> Liger name, per formula (documentation, reports and README table)
COMMON = {
    "beta": "beta",
    "kl_estimator": "use_bias_correction_kl (k3: False, k3_unbiased: True)",
    "is_level": "(none only: Liger takes a precomputed vllm_is_ratio tensor, no IS-weight formula)",
    "opsm_delta": "(null only: no OPSM)",
    "entropy_quantile": "(null only: no entropy mask)",
    "kl_log_ratio_min": "(null only: no KL clamps)",
    "kl_log_ratio_max": "(null only)",
    "kl_output_min": "(null only)",
    "kl_output_max": "(null only)",
}
CLIP = {"eps_low": "epsilon_low", "eps_high": "epsilon_high", "log_ratio_clamp": "(null only: no ratio clamp)"}
PARAM_MAP = {
    "loss.grpo": {**CLIP, **COMMON, "(recipe)": "loss_type='grpo', importance_sampling_level='token'"},
    "loss.dapo": {**CLIP, **COMMON, "aggregation": "(token_mean -> loss_type='dapo': local token mean, num_items_in_batch=None; prompt_mean only with at most one non-empty group)",
                  "(recipe)": "loss_type='dapo'"},
    "loss.bnpo": {**CLIP, **COMMON, "(recipe)": "loss_type='bnpo'"},
    "loss.dr_grpo": {**CLIP, **COMMON, "divisor": "max_completion_length", "divide_by": "('K*N' only)",
                     "(recipe)": "loss_type='dr_grpo'"},
    "loss.gspo": {"eps_low": "epsilon_low", "eps_high": "epsilon_high", "log_ratio_max": "(null only)", **COMMON,
                  "(recipe)": "loss_type='grpo', importance_sampling_level='sequence'"},
    "loss.cispo": {"cap_form": "(absolute: epsilon_high = eps_high; relative with eps_low null: epsilon_high = 1 + eps_high)",
                   "eps_low": "(null only)", "eps_high": "epsilon_high", "log_ratio_clamp": "(null only)",
                   "aggregation": "(token_mean -> the dapo normalizer; prompt_mean only with at most one non-empty group)", **COMMON, "(recipe)": "loss_type='cispo'"},
    "loss.sapo": {"tau_pos": "sapo_temperature_pos", "tau_neg": "sapo_temperature_neg",
                  "log_ratio_clamp": "(null only)", **COMMON, "(recipe)": "loss_type='sapo'"},
    "loss.luspo": {"ratio_level": "importance_sampling_level", **CLIP, **COMMON, "(recipe)": "loss_type='luspo'"},
    "loss.vespo": {"k_pos": "vespo_k_pos", "lambda_pos": "vespo_lambda_pos", "k_neg": "vespo_k_neg",
                   "lambda_neg": "vespo_lambda_neg", "lambda_min": "(1e-4 only, hard-coded)",
                   "log_ratio_clamp": "(20 only, hard-coded)", "min_weight": "(1e-8 only, hard-coded)",
                   "max_log_weight": "(20 only, hard-coded)",
                   "sampler_logprobs": "vllm_is_ratio = exp(l_old - l_sampler) (masked: 1), folded into phi",
                   **COMMON, "(recipe)": "loss_type='vespo'"},
    "kl.k3": {"(function)": "liger_kernel.chunked_loss.grpo_loss.k3_loss_fn(ref, logprobs)",
              "log_ratio_min": "(null only)", "log_ratio_max": "(null only)", "output_min": "(null only)",
              "output_max": "(null only)"},
    "logprob.token": {"(function)": "fused_linear_ppo._ChunkedSelectiveLogProbFunction (hidden = logits, weight = I)",
                      "temperature": "temperature", "logit_scale": "(1 only)", "softcap": "(null only)"},
}


def param(formula_id, params, name):
    """A parameter by its spec name, else the reference registry's default; numbers as float."""
    if name in params:
        value = params[name]
    else:
        value = next(p.default for p in REGISTRY[formula_id].params if p.name == name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) or (isinstance(value, str) and _is_number(value)):
        return float(value)
    return value


def _is_number(s):
    try:
        float(s)
    except ValueError:
        return False
    return True


def _has(formula_id, name):
    return any(p.name == name for p in REGISTRY[formula_id].params)


def _require(cond, what):
    if not cond:
        raise Unsupported(f"Liger-Kernel 0.8.5 has no counterpart for {what}")


def liger_config(formula_id, params, inputs):
    """Liger keyword arguments for one spec recipe (raises Unsupported)."""
    loss_type, level = RECIPES[formula_id]
    p = lambda name: param(formula_id, params, name)  # noqa: E731
    if level is None:
        level = p("ratio_level")
    cfg = {"loss_type": loss_type, "importance_sampling_level": level}
    # options Liger does not have
    _require(p("is_level") == "none", f"is_level={p('is_level')!r} (Liger takes a precomputed vllm_is_ratio tensor)")
    _require(p("opsm_delta") is None, "opsm_delta (off-policy sequence masking)")
    _require(p("entropy_quantile") is None, "entropy_quantile (entropy masking)")
    for name in ("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max"):
        _require(p(name) is None, f"{name}={p(name)} (KL clamps)")
    for name in ("log_ratio_clamp", "log_ratio_max"):
        if _has(formula_id, name) and formula_id != "loss.vespo":
            _require(p(name) is None, f"{name}={p(name)} (a log-ratio clamp)")
    adv = inputs["advantages"]
    _require(adv.dim() == 1, "per-token advantages [B,T] (Liger takes advantages of shape (B,))")
    beta = p("beta")
    cfg["beta"] = beta
    if beta != 0:
        est = p("kl_estimator")
        _require(est in ("k3", "k3_unbiased"), f"kl_estimator={est!r} (Liger has k3 and its bias-corrected form)")
        cfg["use_bias_correction_kl"] = est == "k3_unbiased"
    # recipe parameters
    if formula_id in ("loss.grpo", "loss.dapo", "loss.bnpo", "loss.dr_grpo", "loss.gspo", "loss.luspo"):
        cfg["epsilon_low"] = p("eps_low")
        cfg["epsilon_high"] = p("eps_high")
    if _has(formula_id, "aggregation") and p("aggregation") == "prompt_mean":
        # Liger's dapo/cispo normalizer is the batch token count (no per-prompt normalizer); it equals
        # the spec's prompt mean exactly when at most one group has an unmasked token
        gids = inputs.get("group_ids")
        _require(gids is not None and len({int(g) for g, n in zip(gids.tolist(), inputs["mask"].sum(-1).tolist())
                                           if n > 0}) <= 1,
                 "aggregation='prompt_mean' over several prompt groups (Liger normalizes by the batch token count)")
    if formula_id == "loss.dr_grpo":
        _require(p("divide_by") == "K*N", f"divide_by={p('divide_by')!r} (Liger divides by B * max_completion_length)")
        cfg["max_completion_length"] = p("divisor")
    elif formula_id == "loss.cispo":
        form = p("cap_form")
        if form == "absolute":
            cfg["epsilon_high"] = p("eps_high")
        else:
            _require(p("eps_low") is None, f"cap_form='relative' with eps_low={p('eps_low')} (Liger caps from above only)")
            cfg["epsilon_high"] = 1.0 + p("eps_high")
    elif formula_id == "loss.sapo":
        cfg["sapo_temperature_pos"] = p("tau_pos")
        cfg["sapo_temperature_neg"] = p("tau_neg")
    elif formula_id == "loss.vespo":
        for name, fixed in (("lambda_min", 1e-4), ("log_ratio_clamp", 20.0), ("min_weight", 1e-8), ("max_log_weight", 20.0)):
            _require(p(name) == fixed, f"{name}={p(name)} (hard-coded to {fixed} in get_gamma_weights)")
        cfg.update(vespo_k_pos=p("k_pos"), vespo_lambda_pos=p("lambda_pos"), vespo_k_neg=p("k_neg"),
                   vespo_lambda_neg=p("lambda_neg"))
    return cfg
