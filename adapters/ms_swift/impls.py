"""The formula implementations of the ms_swift adapter: each calls ms-swift 4.6.0's own code (see _engine.py).

Per-token read-outs.  ``_compute_loss_and_metrics`` returns a scalar.  Per-token quantities are read from it
with autograd, never recomputed:

* with ``loss_type='dapo'`` (or ``'cispo'``, same normalizer) and ``num_items_in_batch = 1`` the loss is
  ``sum(per_token_loss * completion_mask)``; with a float completion mask that requires grad,
  ``d loss / d completion_mask[i, t] = per_token_loss[i, t]`` exactly (the mask enters nothing else
  differentiably at token level);
* at sequence level (GSPO) and for ``sapo`` (whose aggregation is the sample mean) the per-token loss is
  homogeneous of degree 1 in the per-token advantage ``A`` (ms-swift's advantages are [B, T]):
  ``per_token_loss = A * d per_token_loss / d A`` (Euler), read as ``A * d loss / d A`` times the known
  normalizer.
"""

from __future__ import annotations

from pgspec.adapters.base import current_cotangent, spec_param

from ._engine import UnsupportedParameter, compute_loss, make_stub, trainer_class

PARAM_MAP = {
    "surrogate.ppo_clip": {"eps_low": "epsilon", "eps_high": "epsilon_high", "log_ratio_clamp": "(none: must be null)"},
    "surrogate.trl_delta": {"eps_low": "epsilon", "eps_high": "epsilon_high", "delta": "delta"},
    "surrogate.cispo": {"cap_form": "(absolute only)", "eps_high": "epsilon_high (absolute cap)",
                        "eps_low": "(none: must be null)", "log_ratio_clamp": "(none: must be null)"},
    "surrogate.sapo": {"tau_pos": "tau_pos", "tau_neg": "tau_neg", "log_ratio_clamp": "(none: must be null)"},
    "surrogate.gspo": {"eps_low": "epsilon", "eps_high": "epsilon_high", "log_ratio_max": "(none: must be null)",
                       "(level)": "importance_sampling_level='sequence'"},
    "kl.k3": {"log_ratio_min/max": "(fixed -20/20)", "output_min/max": "(fixed -10/10)", "(weight)": "beta"},
    "is.token.truncate": {"c_max": "rollout_importance_sampling_threshold", "c_min": "(none: must be null)",
                          "log_ratio_clamp": "(fixed 20)", "(mode)": "rollout_importance_sampling_mode='token_truncate'"},
    "is.token.mask": {"c_max": "rollout_importance_sampling_threshold", "c_min": "(none: must be null)",
                      "log_ratio_clamp": "(fixed 20)", "(mode)": "rollout_importance_sampling_mode='token_mask'"},
    "is.geometric.truncate": {"c_max": "rollout_importance_sampling_threshold", "c_min": "(none: must be null)",
                              "log_ratio_clamp": "(fixed 20)",
                              "(mode)": "rollout_importance_sampling_mode='sequence_truncate' (a geometric mean)"},
    "is.geometric.mask": {"c_max": "rollout_importance_sampling_threshold", "c_min": "(none: must be null)",
                          "log_ratio_clamp": "(fixed 20)",
                          "(mode)": "rollout_importance_sampling_mode='sequence_mask' (a geometric mean)"},
    "mask.opsm": {"delta": "off_policy_sequence_mask_delta", "advantage_gate": "(sequence_mean only)"},
    "mask.entropy_quantile": {"top_entropy_quantile": "top_entropy_quantile"},
}
COMMON_LOSS_MAP = {
    "eps_low": "epsilon", "eps_high": "epsilon_high", "beta": "beta", "kl_estimator": "(k3 only)",
    "kl_log_ratio_min/max, kl_output_min/max": "(fixed -20/20, -10/10)",
    "is_level/is_mode": "rollout_importance_sampling_mode: token_truncate, token_mask, sequence_truncate / "
                        "sequence_mask (geometric level)",
    "is_c_max": "rollout_importance_sampling_threshold", "is_c_min": "(none)", "is_log_ratio_clamp": "(fixed 20)",
    "opsm_delta": "off_policy_sequence_mask_delta", "entropy_quantile": "top_entropy_quantile",
}
PARAM_MAP.update({
    "loss.grpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='grpo'"},
    "loss.bnpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='bnpo'"},
    "loss.dapo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='dapo'", "aggregation": "token_mean (num_items_in_batch)"},
    "loss.dr_grpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='dr_grpo'", "divisor": "max_completion_length",
                     "divide_by": "K*N only"},
    "loss.gspo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='grpo', importance_sampling_level='sequence'"},
    "loss.cispo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='cispo'", "cap_form": "absolute only",
                   "eps_high": "epsilon_high (absolute cap)", "aggregation": "token_mean (num_items_in_batch)"},
    "loss.sapo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='sapo'", "tau_pos": "tau_pos", "tau_neg": "tau_neg"},
})


def _p(params, fid, name):
    return spec_param(params, fid, name)


def _require(params, fid, name, allowed, why):
    v = _p(params, fid, name)
    ok = allowed if isinstance(allowed, tuple) else (allowed,)
    if v not in ok:
        raise UnsupportedParameter(f"{fid}: {name}={v!r} has no ms-swift 4.6.0 counterpart ({why})")


def _f32(x):
    """ms-swift's training log-probs come from TRL's selective_log_softmax on the model's logits; the loss runs
    in the log-probs' dtype.  Half precision is computed in float32 here as in the other TRL-derived adapters."""
    import torch

    if x is None:
        return None
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _canon(inputs, *names):
    return [_f32(inputs.get(n)) for n in names]


def _grad(loss, *tensors):
    import torch

    want = [t for t in tensors if t.requires_grad]
    gs = iter(torch.autograd.grad(loss, want, allow_unused=True) if want else ())
    out = []
    for t in tensors:
        g = next(gs) if t.requires_grad else None
        out.append(torch.zeros_like(t) if g is None else g)
    return out


def _adv2(inputs, lp):
    """The advantages as ms-swift's loss receives them: [B, T] (a [B] input broadcast, as
    expand_advantage_to_per_token does), as a leaf that may require grad."""
    import torch

    m = inputs["mask"]
    if inputs.get("advantages") is None:   # formulas without advantages (kl.*, mask.*): set by the caller
        return torch.zeros(m.shape, dtype=lp.dtype)
    a = _f32(inputs["advantages"])
    return (a.unsqueeze(1).expand(m.shape) if a.dim() == 1 else a).detach().clone().to(lp.dtype)


def _data(inputs):
    lp, old, ref, mu, ent = _canon(inputs, "logprobs", "old_logprobs", "ref_logprobs", "sampler_logprobs", "entropy")
    return dict(logprobs=lp, mask=inputs["mask"], advantages=_adv2(inputs, lp), old_logprobs=old, ref_logprobs=ref,
                sampler_logprobs=mu, entropy=ent)


def _vjp(r, m, target):
    """The VJP sum_t c_t r_t of a per-token readout r (made with create_graph) with the case's cotangent c
    (pgspec.adapters.base.current_cotangent) w.r.t. ``target``: the readout differentiated again, through
    ms-swift's own forward (its loss is linear in the weight the readout is taken of)."""
    import torch

    c = current_cotangent(like=r)
    obj = torch.where(m, r * c, torch.zeros((), dtype=r.dtype)).sum()
    g = torch.autograd.grad(obj, [target], allow_unused=True)[0] if obj.requires_grad and target.requires_grad \
        else None
    return torch.zeros_like(target) if g is None else g


def mask_readout(data, vjp=True, **stub):
    """(per-token loss = d loss / d completion_mask, its VJP with the case's cotangent w.r.t. the logprobs) of
    one dapo-normalized call, N = 1; with ``vjp=False`` d loss / d logprobs itself (a weight's readout)."""
    import torch

    lp, m = data["logprobs"], data["mask"]
    fm = m.to(lp.dtype).requires_grad_(True)
    loss, _ = compute_loss(make_stub(**stub), **data, num_items_in_batch=1, completion_mask=fm)
    if not vjp:
        return _grad(loss, fm, lp)
    (r,) = torch.autograd.grad(loss, [fm], create_graph=True, allow_unused=True)
    if r is None:
        current_cotangent(like=fm)      # read: with no path the VJP is zero for any cotangent
        return torch.zeros_like(fm), torch.zeros_like(lp)
    return r.detach(), _vjp(r, m, lp)


def euler_readout(data, scale, vjp=True, **stub):
    """The per-token policy loss A * d loss / d A times ``scale`` (the normalizer's inverse), and its VJP with
    the case's cotangent w.r.t. the logprobs (``vjp=False``: d loss / d logprobs, for a read-out only)."""
    import torch

    a = data["advantages"].requires_grad_(True)
    lp = data["logprobs"]
    loss, _ = compute_loss(make_stub(**stub), **dict(data, advantages=a), num_items_in_batch=1)
    if not vjp:
        g_a, g_lp = _grad(loss, a, lp)
        return (a * g_a * scale).detach(), g_lp
    (g_a,) = torch.autograd.grad(loss, [a], create_graph=True)
    r = a * g_a * scale
    return r.detach(), _vjp(r, data["mask"], lp)


def _sample_mean_scale(m, dtype):
    B = m.shape[0]
    return (m.sum(-1, keepdim=True).clamp(min=1).to(dtype) * B).expand(m.shape)


# ---------------------------------------------------------------------------------------------- surrogate


def ppo_clip(inputs, params):
    fid = "surrogate.ppo_clip"
    _require(params, fid, "log_ratio_clamp", None, "ms-swift takes exp of the raw log-ratio")
    loss, g = mask_readout(_data(inputs), loss_type="dapo", eps_low=_p(params, fid, "eps_low"),
                           eps_high=_p(params, fid, "eps_high"))
    return {"loss": loss, "grad": {"logprobs": _back(inputs, g)}}


def _back(inputs, g):
    """A gradient with respect to the (possibly float32-cast) log-probs, in the input's dtype."""
    return g.to(inputs["logprobs"].dtype)


def trl_delta(inputs, params):
    fid = "surrogate.trl_delta"
    loss, g = mask_readout(_data(inputs), loss_type="dapo", eps_low=_p(params, fid, "eps_low"),
                           eps_high=_p(params, fid, "eps_high"), delta=_p(params, fid, "delta"))
    return {"loss": loss, "grad": {"logprobs": _back(inputs, g)}}


def cispo(inputs, params):
    import torch

    fid = "surrogate.cispo"
    _require(params, fid, "cap_form", "absolute", "loss_type='cispo' caps the ratio at epsilon_high itself")
    _require(params, fid, "eps_low", None, "loss_type='cispo' has no lower bound")
    _require(params, fid, "log_ratio_clamp", None, "ms-swift takes exp of the raw log-ratio")
    stub = dict(loss_type="cispo", eps_high=_p(params, fid, "eps_high"))
    loss, g = mask_readout(_data(inputs), **stub)
    data = _data(inputs)
    data["advantages"] = -torch.ones_like(data["advantages"])
    _, w = mask_readout(data, vjp=False, **stub)   # with A = -1 the loss is w * l: d loss / d l = w
    return {"loss": loss, "weight": _back(inputs, w), "grad": {"logprobs": _back(inputs, g)}}


def sapo(inputs, params):
    fid = "surrogate.sapo"
    _require(params, fid, "log_ratio_clamp", None, "ms-swift takes exp of the raw log-ratio")
    data = _data(inputs)
    scale = _sample_mean_scale(data["mask"], data["logprobs"].dtype)
    loss, g = euler_readout(data, scale, loss_type="sapo", tau_pos=_p(params, fid, "tau_pos"),
                            tau_neg=_p(params, fid, "tau_neg"))
    return {"loss": loss, "grad": {"logprobs": _back(inputs, g)}}


def gspo(inputs, params):
    import torch

    fid = "surrogate.gspo"
    _require(params, fid, "log_ratio_max", None, "importance_sampling_level='sequence' does not cap the log-weight")
    eps = dict(eps_low=_p(params, fid, "eps_low"), eps_high=_p(params, fid, "eps_high"))
    data = _data(inputs)
    m = data["mask"]
    # value: loss_type grpo at sequence level on one row at a time: (sum_t loss_i) / L_i, ms-swift's own arithmetic
    rows = []
    for i in range(m.shape[0]):
        if not bool(m[i].any()):
            rows.append(torch.zeros((), dtype=data["logprobs"].dtype))
            continue
        one = {k: (None if v is None else v[i:i + 1].detach()) for k, v in data.items()}
        loss_i, _ = compute_loss(make_stub(loss_type="grpo", level="sequence", **eps), **one)
        rows.append(loss_i.detach())
    seq = torch.stack(rows)
    # gradient: GSPO as ms-swift runs it (loss_type grpo, sequence level), whose loss (1/B) sum_i loss_i treats
    # the rows independently: the VJP with the cotangent c (one per sequence) is sum_i c_i d loss_i, each row's
    # gradient from a call on that row alone (B = 1)
    c = current_cotangent(like=seq)
    g = torch.zeros_like(data["logprobs"])
    for i in range(m.shape[0]):
        if not bool(m[i].any()):
            continue
        one = {k: (None if v is None else v[i:i + 1]) for k, v in data.items()}
        loss_i, _ = compute_loss(make_stub(loss_type="grpo", level="sequence", **eps), **one)
        g_i = torch.autograd.grad(loss_i, [data["logprobs"]], retain_graph=True, allow_unused=True)[0]
        if g_i is not None:
            g = g + g_i * c[i]
    return {"loss": seq, "grad": {"logprobs": _back(inputs, g)}}


# ---------------------------------------------------------------------------------------------- kl


def kl_k3(inputs, params):
    import torch

    fid = "kl.k3"
    for n, v in (("log_ratio_min", -20.0), ("log_ratio_max", 20.0), ("output_min", -10.0), ("output_max", 10.0)):
        _require(params, fid, n, (None, v), "ms-swift always clamps the KL log-ratio to [-20, 20] and its value to "
                                            "[-10, 10]")
    data = _data(inputs)
    data["advantages"] = torch.zeros_like(data["advantages"])   # cispo with A = 0: the policy term is exactly 0
    kl, g = mask_readout(data, loss_type="cispo", eps_high=1.0, beta=1.0)
    return {"kl": kl, "grad": {"logprobs": _back(inputs, g)}}


# ---------------------------------------------------------------------------------------------- is


def _is(fid, mode):
    def run(inputs, params):
        import torch

        _require(params, fid, "c_min", None, "rollout_importance_sampling_threshold is an upper bound only")
        _require(params, fid, "log_ratio_clamp", (None, 20.0), "_apply_rollout_importance_sampling always clamps "
                                                               "the log-ratio to [-20, 20] (SAFETY_BOUND)")
        old, mu = _canon(inputs, "old_logprobs", "sampler_logprobs")
        m = inputs["mask"]
        stub = make_stub(loss_type="dapo", is_mode=mode, is_threshold=_p(params, fid, "c_max"))
        seen = []
        original = stub._compute_sequence_level_ratios

        def record(*a, **k):   # ms-swift's own helper, called as it is; its result is recorded
            r = original(*a, **k)
            seen.append(r)
            return r

        stub._compute_sequence_level_ratios = record
        w = stub._apply_rollout_importance_sampling(old - mu, m)
        zero = torch.zeros((), dtype=w.dtype)
        out = {"weight": torch.where(m, w, zero)}
        if seen:
            out["seq_ratio"] = seen[0]
            if mode == "sequence_truncate":   # the clipped sequence ratio, expanded over the row
                out["seq_weight"] = w[:, 0]
        return out

    run.__name__ = fid.replace(".", "_")
    return run


# ---------------------------------------------------------------------------------------------- masks


class _Probe:
    """Records what ms-swift computes inside one of its methods (a TorchFunctionMode; changes no result)."""

    def __init__(self, want):
        self.want = want
        self.seen = []

    def __enter__(self):
        from torch.overrides import TorchFunctionMode

        probe = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if probe.want(func, args):
                    probe.seen.append((func, args, out))
                return out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


def opsm(inputs, params):
    import torch

    fid = "mask.opsm"
    _require(params, fid, "advantage_gate", "sequence_mean", "ms-swift gates by the sequence's mean advantage")
    m = inputs["mask"]
    lp, mu = _canon(inputs, "logprobs", "sampler_logprobs")
    adv = _f32(inputs["advantages"])
    if adv.dim() == 2:
        raise UnsupportedParameter(f"{fid}: [B, T] advantages: ms-swift reduces them to the sequence mean inline in "
                                   "_compute_loss_and_metrics; the method takes per-sequence advantages")
    stub = make_stub(loss_type="dapo", opsm_delta=_p(params, fid, "delta"))
    with _Probe(lambda f, a: getattr(f, "__name__", "") in ("__gt__", "gt") and len(a) == 2
                and not isinstance(a[1], torch.Tensor)) as probe:
        keep = stub._compute_off_policy_sequence_mask(lp, mu, m, adv)
    if len(probe.seen) != 1:
        raise RuntimeError(f"could not read ms-swift's sequence statistic ({len(probe.seen)} comparisons seen)")
    stat = probe.seen[0][1][0]
    return {"seq_keep": keep, "keep": keep.unsqueeze(-1).expand(m.shape) & m, "seq_stat": stat, "seq_advantage": adv}


def entropy_quantile(inputs, params):
    import torch

    fid = "mask.entropy_quantile"
    ent = _f32(inputs["entropy"])
    data = _data(dict(inputs, logprobs=torch.zeros_like(ent)))
    data["old_logprobs"] = None   # ratio 1
    data["advantages"] = -torch.ones_like(data["advantages"])   # the per-token loss is then the entropy mask
    rho = _p(params, fid, "top_entropy_quantile")
    lp, m = data["logprobs"], data["mask"]
    fm = m.to(lp.dtype).requires_grad_(True)
    loss, metrics = compute_loss(make_stub(loss_type="dapo", top_entropy_quantile=rho), **dict(data, logprobs=lp.detach()),
                                 num_items_in_batch=1, completion_mask=fm)
    (keep,) = _grad(loss, fm)
    out = {"keep": keep > 0}
    if "entropy_threshold" in metrics["entropy"]:   # ms-swift computes it only for top_entropy_quantile < 1
        out["threshold"] = torch.tensor(metrics["entropy"]["entropy_threshold"], dtype=lp.dtype)
    return out


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": ppo_clip,
    "surrogate.trl_delta": trl_delta,
    "surrogate.cispo": cispo,
    "surrogate.sapo": sapo,
    "surrogate.gspo": gspo,
    "kl.k3": kl_k3,
    "is.token.truncate": _is("is.token.truncate", "token_truncate"),
    "is.token.mask": _is("is.token.mask", "token_mask"),
    "is.geometric.truncate": _is("is.geometric.truncate", "sequence_truncate"),
    "is.geometric.mask": _is("is.geometric.mask", "sequence_mask"),
    "mask.opsm": opsm,
    "mask.entropy_quantile": entropy_quantile,
}
