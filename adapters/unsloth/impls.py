"""The formula implementations of the unsloth adapters: each calls unsloth-zoo's own loss (see _engine.py).

Read-outs.  ``grpo_compute_loss`` returns a scalar; per-token quantities are read from it with autograd, never
recomputed, in the run's dtype:

* the policy term: ``entropy_mask`` (TRL's top-entropy mask, which Unsloth multiplies into the policy term
  only, before the IS weight and the KL) is given as a ones tensor that requires grad, with ``sample_weight``
  ones (Unsloth's per-completion weights: the loss becomes ``sum(loss_i * mask * w)``, no normalizer), so
  ``d loss / d entropy_mask[i, t]`` is the policy term at every unmasked token (the sequence loss at every
  token of its row at ``importance_sampling_level='sequence'``);
* the whole per-token loss (KL included): every unmasked token becomes a one-token row of its own and
  ``sample_weight`` ones requiring grad: ``d loss / d w_r`` is that token's ``loss_i`` (token level, no
  sequence-level IS weight: the KL read-out).  Only valid at token
  level (a sequence-level ratio depends on the mask): the KL part is read this way with zero advantages.

A float mask that requires grad cannot be used as TRL's adapter does: ``grpo_compute_loss`` casts the mask to
float32 (``mask = mask.to(torch.float32)``), which would round a float64 read-out.
"""

from __future__ import annotations

from pgspec.adapters.base import current_cotangent, spec_param

from ._engine import UnsupportedParameter, eager, fused, options

# spec parameter -> Unsloth / TRL GRPOConfig name, per formula (README.md has the same table)
PARAM_MAP = {
    "surrogate.ppo_clip": {"eps_low": "epsilon", "eps_high": "epsilon_high", "log_ratio_clamp": "(none: must be null)"},
    "surrogate.trl_delta": {"eps_low": "epsilon", "eps_high": "epsilon_high", "delta": "delta"},
    "surrogate.cispo": {"cap_form": "(absolute only)", "eps_high": "epsilon_high (absolute cap)",
                        "eps_low": "(none: must be null)", "log_ratio_clamp": "(none: must be null)"},
    "surrogate.sapo": {"tau_pos": "sapo_temperature_pos", "tau_neg": "sapo_temperature_neg",
                       "log_ratio_clamp": "(none: must be null)"},
    "surrogate.gspo": {"eps_low": "epsilon", "eps_high": "epsilon_high", "log_ratio_max": "(none: must be null)",
                       "(level)": "importance_sampling_level='sequence'"},
    "kl.k3": {"log_ratio_min/max": "(fixed -20/20)", "output_min/max": "(fixed -10/10)", "(weight)": "beta",
              "(estimator)": "use_bias_correction_kl=False"},
    "kl.k3_unbiased": {"log_ratio_min/max": "(fixed -20/20)", "output_min/max": "(fixed -10/10, after the ratio)",
                       "(weight)": "beta", "(estimator)": "use_bias_correction_kl=True"},
}
COMMON_LOSS_MAP = {
    "eps_low": "epsilon", "eps_high": "epsilon_high", "beta": "beta",
    "kl_estimator": "k3 -> use_bias_correction_kl=False, k3_unbiased -> use_bias_correction_kl=True",
    "kl_log_ratio_min/max, kl_output_min/max": "(fixed -20/20, -10/10)",
    "is_level/is_mode": "vllm_importance_sampling_mode: token_/sequence_/geometric_ + truncate/mask",
    "is_c_min": "vllm_importance_sampling_clip_min", "is_c_max": "vllm_importance_sampling_clip_max",
    "opsm_delta": "(unsupported: off_policy_mask_threshold calls TRL's get_off_policy_mask)",
    "entropy_quantile": "(unsupported: top_entropy_quantile calls TRL's get_high_entropy_mask)",
}
LOSS_MAP = {
    "loss.grpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='grpo'"},
    "loss.bnpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='bnpo'"},
    "loss.dapo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='dapo'", "aggregation": "token_mean (num_items_in_batch)"},
    "loss.dr_grpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='dr_grpo'", "divisor": "max_completion_length",
                     "divide_by": "K*N only"},
    "loss.gspo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='grpo', importance_sampling_level='sequence'"},
    "loss.cispo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='cispo'", "cap_form": "absolute only",
                   "eps_high": "epsilon_high (absolute cap)", "aggregation": "token_mean (dapo normalizer)"},
    "loss.sapo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='sapo'", "tau_pos": "sapo_temperature_pos",
                  "tau_neg": "sapo_temperature_neg"},
    "loss.luspo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='luspo'", "ratio_level": "importance_sampling_level"},
}
PARAM_MAP.update(LOSS_MAP)


def _p(params, fid, name):
    return spec_param(params, fid, name)


def _require(params, fid, name, allowed, why):
    v = _p(params, fid, name)
    ok = allowed if isinstance(allowed, tuple) else (allowed,)
    if v not in ok:
        raise UnsupportedParameter(f"{fid}: {name}={v!r} has no unsloth-zoo 2026.10.9 counterpart ({why})")


def _f32(x):
    """Unsloth's training log-probs come out of selective_log_softmax in float32 whatever the model dtype
    (logits.to(torch.float32)), so half-precision inputs reach the loss as float32."""
    import torch

    if x is None:
        return None
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _canon(inputs, *names):
    return [_f32(inputs.get(n)) for n in names]


def _adv(inputs):
    import torch

    if inputs.get("advantages") is None:   # formulas without advantages (kl.*): set by the caller
        return torch.zeros(inputs["mask"].shape[0], dtype=_f32(inputs["logprobs"]).dtype)
    return _f32(inputs["advantages"])


def _grad(loss, *tensors):
    import torch

    want = [t for t in tensors if t.requires_grad]
    gs = iter(torch.autograd.grad(loss, want, allow_unused=True) if want else ())
    out = []
    for t in tensors:
        g = next(gs) if t.requires_grad else None
        out.append(torch.zeros_like(t) if g is None else g)
    return out


def _data(inputs):
    lp, old, ref, mu = _canon(inputs, "logprobs", "old_logprobs", "ref_logprobs", "sampler_logprobs")
    return dict(logprobs=lp, mask=inputs["mask"], advantages=_adv(inputs), old_logprobs=old, ref_logprobs=ref,
                sampler_logprobs=mu)


def policy_terms(data, kw, vjp_of=None):
    """The policy term per token (times the IS weight), 0 at masked positions: d loss / d entropy_mask.
    With ``vjp_of`` (the input log-probs) also its VJP with the case's cotangent c
    (pgspec.adapters.base.current_cotangent) w.r.t. them: the readout differentiated again (create_graph),
    through Unsloth's own forward."""
    import torch

    lp, m = data["logprobs"], data["mask"]
    em = torch.ones(m.shape, dtype=lp.dtype, device=lp.device, requires_grad=True)
    sw = torch.ones(m.shape[0], dtype=lp.dtype, device=lp.device)
    if vjp_of is None:
        out = eager(**dict(data, logprobs=lp.detach(), beta=0.0), **dict(kw, sample_weight=sw, entropy_mask=em))
        (g,) = _grad(out[0], em)
        return g
    out = eager(**dict(data, beta=0.0), **dict(kw, sample_weight=sw, entropy_mask=em))
    return _vjp(out[0], em, m, vjp_of)


def _vjp(loss, weight, m, target, keep_rows=None):
    """(r = d loss / d weight, the VJP sum c r of the readout r with the case's cotangent w.r.t. ``target``)."""
    import torch

    c = current_cotangent(like=weight)      # read first: with no path the VJP is zero for any cotangent
    (r,) = torch.autograd.grad(loss, [weight], create_graph=True, allow_unused=True)
    if r is None:
        return torch.zeros_like(weight), torch.zeros_like(target)
    obj = torch.where(m, r * c, torch.zeros((), dtype=r.dtype)).sum()
    g = torch.autograd.grad(obj, [target], allow_unused=True)[0] if obj.requires_grad else None
    return r.detach(), (torch.zeros_like(target) if g is None else g)


def token_terms(data, kw, beta, vjp_of=None):
    """The whole per-token loss (policy + beta * KL) at token level, in one call: every unmasked token (i, t)
    becomes a one-token row of its own (at token level with no sequence-level IS weight, Unsloth's per-token loss
    depends on that position's values only), and d loss / d sample_weight of that row is loss_i[i, t].  With
    ``vjp_of`` (the input log-probs): (that, its VJP with the case's cotangent w.r.t. them), the readout
    differentiated again through Unsloth's forward."""
    import torch

    lp, m = data["logprobs"], data["mask"]
    out = torch.zeros(m.shape, dtype=lp.dtype, device=lp.device)
    rows, cols = m.nonzero(as_tuple=True)
    if rows.numel() == 0:
        if vjp_of is None:
            return out
        current_cotangent(like=out)     # read: no unmasked token, so the VJP is zero for any cotangent
        return out, torch.zeros_like(vjp_of)
    per = {k: (None if v is None else (v[rows] if v.dim() == 1 else v[rows, cols].unsqueeze(-1)))
           for k, v in data.items() if k != "mask"}
    per["logprobs"] = (lp.detach() if vjp_of is None else lp)[rows, cols].unsqueeze(-1)
    sw = torch.ones(rows.numel(), dtype=lp.dtype, device=lp.device, requires_grad=True)
    ones = torch.ones((rows.numel(), 1), dtype=torch.bool, device=m.device)
    res = eager(**dict(per, mask=ones, beta=beta), **dict(kw, sample_weight=sw))
    if vjp_of is None:
        (g,) = _grad(res[0], sw)
        out[rows, cols] = g.to(out.dtype)
        return out
    (r,) = torch.autograd.grad(res[0], [sw], create_graph=True)
    c = current_cotangent(like=out)[rows, cols]
    obj = (r * c.to(r.dtype)).sum()
    g = torch.autograd.grad(obj, [vjp_of], allow_unused=True)[0] if obj.requires_grad else None
    out[rows, cols] = r.detach().to(out.dtype)
    return out, (torch.zeros_like(vjp_of) if g is None else g)


def sum_grad(data, kw, beta=0.0):
    """d/d logprobs of sum(per-token loss * mask): sample_weight ones, no normalizer."""
    import torch

    lp, m = data["logprobs"], data["mask"]
    sw = torch.ones(m.shape[0], dtype=lp.dtype, device=lp.device)
    out = eager(**dict(data, beta=beta), **dict(kw, sample_weight=sw))
    return out[0]


# ---------------------------------------------------------------------------------------------- surrogate


def _surrogate(inputs, kw):
    """(per-token loss, its VJP with the case's cotangent w.r.t. the log-probs)."""
    return policy_terms(_data(inputs), kw, vjp_of=inputs["logprobs"])


def ppo_clip(inputs, params):
    fid = "surrogate.ppo_clip"
    _require(params, fid, "log_ratio_clamp", None, "Unsloth takes exp of the raw log-ratio")
    loss, g = _surrogate(inputs, options(loss_type="grpo", eps_low=_p(params, fid, "eps_low"),
                                         eps_high=_p(params, fid, "eps_high")))
    return {"loss": loss, "grad": {"logprobs": g}}


def trl_delta(inputs, params):
    fid = "surrogate.trl_delta"
    loss, g = _surrogate(inputs, options(loss_type="grpo", eps_low=_p(params, fid, "eps_low"),
                                         eps_high=_p(params, fid, "eps_high"), delta=_p(params, fid, "delta")))
    return {"loss": loss, "grad": {"logprobs": g}}


def cispo(inputs, params):
    import torch

    fid = "surrogate.cispo"
    _require(params, fid, "cap_form", "absolute", "loss_type='cispo' caps the ratio at epsilon_high itself")
    _require(params, fid, "eps_low", None, "loss_type='cispo' has no lower bound")
    _require(params, fid, "log_ratio_clamp", None, "Unsloth takes exp of the raw log-ratio")
    kw = options(loss_type="cispo", eps_high=_p(params, fid, "eps_high"))
    loss, g = _surrogate(inputs, kw)
    # the stopped weight: with A = -1 the per-token loss is w * l, so d sum / d l = w exactly
    data = dict(_data(inputs), advantages=-torch.ones(inputs["mask"].shape[0], dtype=inputs["logprobs"].dtype))
    (w,) = _grad(sum_grad(data, kw), inputs["logprobs"])
    return {"loss": loss, "weight": w, "grad": {"logprobs": g}}


def sapo(inputs, params):
    fid = "surrogate.sapo"
    _require(params, fid, "log_ratio_clamp", None, "Unsloth takes exp of the raw log-ratio")
    loss, g = _surrogate(inputs, options(loss_type="sapo", sapo_tau_pos=_p(params, fid, "tau_pos"),
                                         sapo_tau_neg=_p(params, fid, "tau_neg")))
    return {"loss": loss, "grad": {"logprobs": g}}


def gspo(inputs, params):
    import torch

    fid = "surrogate.gspo"
    _require(params, fid, "log_ratio_max", None, "importance_sampling_level='sequence' does not cap the log-weight")
    kw = options(loss_type="grpo", level="sequence", eps_low=_p(params, fid, "eps_low"),
                 eps_high=_p(params, fid, "eps_high"))
    data = _data(inputs)
    m = data["mask"]
    per_token = policy_terms(data, kw)          # the sequence loss at each unmasked token of its row
    first = m.long().argmax(-1, keepdim=True)
    seq = torch.where(m.any(-1), per_token.gather(-1, first).squeeze(-1), torch.zeros((), dtype=per_token.dtype))
    # the VJP with the cotangent c (one per sequence): sample_weight c_i / L_i turns sum(loss_i * mask * w) into
    # sum_i c_i loss_i
    L = m.sum(-1).clamp(min=1).to(data["logprobs"].dtype)
    c = current_cotangent(like=L)
    out = eager(**data, **dict(kw, sample_weight=c / L))
    (g,) = _grad(out[0], inputs["logprobs"])
    return {"loss": seq, "grad": {"logprobs": g}}


# ---------------------------------------------------------------------------------------------- kl


def _kl(fid, bias_correction):
    def run(inputs, params):
        import torch

        for n, v in (("log_ratio_min", -20.0), ("log_ratio_max", 20.0), ("output_min", -10.0), ("output_max", 10.0)):
            _require(params, fid, n, (None, v), "Unsloth always clamps the KL log-ratio to [-20, 20] and its "
                                                "value to [-10, 10]")
        data = _data(inputs)
        if not bias_correction:
            data["old_logprobs"] = None
        # cispo with A = 0: the policy term is exactly 0 for any ratio; beta = 1: the per-token loss is the KL
        data["advantages"] = torch.zeros(inputs["mask"].shape[0], dtype=data["logprobs"].dtype)
        kw = options(loss_type="cispo", eps_high=1.0, bias_correction_kl=bias_correction)
        kl, g = token_terms(data, kw, beta=1.0, vjp_of=inputs["logprobs"])
        return {"kl": kl, "grad": {"logprobs": g}}

    run.__name__ = fid.replace(".", "_")
    return run


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": ppo_clip,
    "surrogate.trl_delta": trl_delta,
    "surrogate.cispo": cispo,
    "surrogate.sapo": sapo,
    "surrogate.gspo": gspo,
    "kl.k3": _kl("kl.k3", False),
    "kl.k3_unbiased": _kl("kl.k3_unbiased", True),
}
