"""The formula implementations of the trl adapter: each calls TRL 1.16.0's own code (see _engine.py)."""

from __future__ import annotations

from pgspec.reference import REGISTRY

from pgspec.adapters.base import current_cotangent

from ._engine import UnsupportedParameter, compute_loss, make_stub

# spec parameter -> TRL configuration name, per formula ID (README.md has the same table)
PARAM_MAP = {
    "surrogate.ppo_clip": {"eps_low": "epsilon", "eps_high": "epsilon_high", "log_ratio_clamp": "(none: must be null)"},
    "surrogate.trl_delta": {"eps_low": "epsilon", "eps_high": "epsilon_high", "delta": "delta"},
    "surrogate.cispo": {"cap_form": "(absolute only)", "eps_high": "epsilon_high (absolute cap)",
                        "eps_low": "(none: must be null)", "log_ratio_clamp": "(none: must be null)"},
    "surrogate.sapo": {"tau_pos": "sapo_temperature_pos", "tau_neg": "sapo_temperature_neg",
                       "log_ratio_clamp": "(none: must be null)"},
    "surrogate.gspo": {"eps_low": "epsilon", "eps_high": "epsilon_high", "log_ratio_max": "(none: must be null)",
                       "(level)": "importance_sampling_level='sequence'"},
    "surrogate.vespo": {"k_pos": "vespo_k_pos", "lambda_pos": "vespo_lambda_pos", "k_neg": "vespo_k_neg",
                        "lambda_neg": "vespo_lambda_neg", "lambda_min": "(fixed 1e-4)", "log_ratio_clamp": "(fixed 20)",
                        "min_weight": "(fixed 1e-8)", "max_log_weight": "(fixed 20)"},
    "kl.k3": {"log_ratio_min/max, output_min/max": "(none: must be null)", "(weight)": "beta",
              "(estimator)": "use_bias_correction_kl=False"},
    "kl.k3_unbiased": {"log_ratio_min/max, output_min/max": "(none: must be null)", "(weight)": "beta",
                       "(estimator)": "use_bias_correction_kl=True"},
    "mask.opsm": {"delta": "off_policy_mask_threshold"},
    "mask.entropy_quantile": {"top_entropy_quantile": "top_entropy_quantile"},
    "logprob.token": {"temperature": "temperature", "logit_scale": "logit_scale (model)",
                      "softcap": "final_logit_softcapping (model)"},
    "logprob.entropy": {"temperature": "temperature", "logit_scale": "logit_scale (model)",
                        "softcap": "final_logit_softcapping (model)"},
}

COMMON_LOSS_MAP = {
    "eps_low": "epsilon", "eps_high": "epsilon_high", "beta": "beta",
    "kl_estimator": "k3 -> use_bias_correction_kl=False, k3_unbiased -> use_bias_correction_kl=True",
    "opsm_delta": "off_policy_mask_threshold", "entropy_quantile": "top_entropy_quantile",
    "is_level/is_mode/is_c_min/is_c_max": "(unsupported: TRL computes the IS ratio inside generation)",
}
LOSS_MAP = {
    "loss.grpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='grpo'"},
    "loss.bnpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='bnpo'"},
    "loss.dapo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='dapo'", "aggregation": "token_mean (num_items_in_batch = "
                  "the batch's token count); prompt_mean only with one prompt group"},
    "loss.dr_grpo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='dr_grpo'", "divisor": "max_completion_length",
                     "divide_by": "K*N only"},
    "loss.gspo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='grpo', importance_sampling_level='sequence'"},
    "loss.cispo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='cispo'", "cap_form": "absolute only",
                   "eps_high": "epsilon_high (absolute cap)", "aggregation": "token_mean (dapo normalizer)"},
    "loss.sapo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='sapo'", "tau_pos": "sapo_temperature_pos",
                  "tau_neg": "sapo_temperature_neg"},
    "loss.luspo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='luspo'", "ratio_level": "importance_sampling_level"},
    "loss.vespo": {**COMMON_LOSS_MAP, "(recipe)": "loss_type='vespo'", "k_pos": "vespo_k_pos",
                   "lambda_pos": "vespo_lambda_pos", "k_neg": "vespo_k_neg", "lambda_neg": "vespo_lambda_neg"},
}
PARAM_MAP.update(LOSS_MAP)


def _p(params, fid, name):
    """A parameter by spec name (default from the registry); decimal strings become floats."""
    if name in params:
        v = params[name]
    else:
        v = next(p.default for p in REGISTRY[fid].params if p.name == name)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def _require(params, fid, name, allowed, why):
    v = _p(params, fid, name)
    if v != allowed and not (allowed is None and v is None):
        raise UnsupportedParameter(f"{fid}: {name}={v!r} has no TRL 1.16.0 counterpart ({why})")


def _compute_dtype(x):
    """TRL's training log-probs come out of its fused LM head (ChunkedLogProbFunction) in float32 whatever
    the model dtype, so half-precision inputs reach the loss as float32."""
    import torch

    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _canon(inputs, *names):
    """The inputs as TRL's loss receives them: as given at every position (masked ones included: TRL
    multiplies by the completion mask, so what lies there is part of what is tested), half precision
    computed in float32."""
    return [None if inputs.get(n) is None else _compute_dtype(inputs[n]) for n in names]


def _adv(inputs):
    return _compute_dtype(inputs["advantages"])


def _grad(loss, *tensors):
    import torch

    gs = torch.autograd.grad(loss, list(tensors), allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(gs, tensors)]


# ---------------------------------------------------------------------------------------------- surrogate


def _vjp_readout(loss, weight, m, target, scale=None):
    """(per-token readout r = d loss / d weight, the VJP sum_t c_t r_t of r with the call's cotangent
    (pgspec.adapters.base.current_cotangent) with respect to ``target``).  TRL's loss is linear in the
    per-token ``weight`` (its completion mask, or its IS ratio), so r is the per-token loss TRL sums;
    its VJP is formed by differentiating the readout again (create_graph), through TRL's own forward.
    ``scale``: per-token factors that turn r into the output (TRL's sample-mean weight undone)."""
    import torch

    c = current_cotangent(like=weight)      # read first: with no path the VJP is zero for any cotangent
    (r,) = torch.autograd.grad(loss, [weight], create_graph=True, allow_unused=True)
    if r is None:
        r = torch.zeros_like(weight)
    out = r if scale is None else r * scale
    obj = torch.where(m, out * c, torch.zeros((), dtype=out.dtype)).sum()
    g = torch.autograd.grad(obj, [target], allow_unused=True)[0] if obj.requires_grad else None
    return out.detach(), (torch.zeros_like(target) if g is None else g)


def _dapo_readout(inputs, stub, vjp=True, **extra):
    """One _compute_loss call with a dapo-normalized loss type and num_items_in_batch = 1: returns
    (per-token loss = d loss / d mask, its VJP with the case's cotangent w.r.t. the logprobs); with
    ``vjp=False``, d loss / d logprobs itself (a readout of a weight, not a gradient pgspec judges)."""
    import torch

    m = inputs["mask"]
    lp, old = _canon(inputs, "logprobs", "old_logprobs")
    adv = _adv(inputs)
    fm = m.to(lp.dtype).requires_grad_(True)
    loss = compute_loss(stub, logprobs=lp, mask=m, advantages=adv, old_logprobs=old, num_items_in_batch=1,
                        float_mask=fm, **extra)
    if vjp:
        return _vjp_readout(loss, fm, m, inputs["logprobs"])
    g_lp, g_m = _grad(loss, inputs["logprobs"], fm)
    return g_m, g_lp


def ppo_clip(inputs, params):
    fid = "surrogate.ppo_clip"
    _require(params, fid, "log_ratio_clamp", None, "TRL does not clamp the log-ratio")
    stub = make_stub(loss_type="dapo", eps_low=_p(params, fid, "eps_low"), eps_high=_p(params, fid, "eps_high"))
    loss, g = _dapo_readout(inputs, stub)
    return {"loss": loss, "grad": {"logprobs": g}}


def trl_delta(inputs, params):
    fid = "surrogate.trl_delta"
    stub = make_stub(loss_type="dapo", eps_low=_p(params, fid, "eps_low"), eps_high=_p(params, fid, "eps_high"),
                     delta=_p(params, fid, "delta"))
    loss, g = _dapo_readout(inputs, stub)
    return {"loss": loss, "grad": {"logprobs": g}}


def cispo(inputs, params):
    import torch

    fid = "surrogate.cispo"
    _require(params, fid, "cap_form", "absolute", "TRL's epsilon_high is an absolute cap min(r, eps_high)")
    _require(params, fid, "eps_low", None, "TRL's cispo has no lower bound")
    _require(params, fid, "log_ratio_clamp", None, "TRL does not clamp the log-ratio")
    stub = make_stub(loss_type="cispo", eps_high=_p(params, fid, "eps_high"))
    loss, g = _dapo_readout(inputs, stub)
    # the stopped weight: with A = -1 the loss is w * l, so d loss / d l = w exactly
    minus_one = dict(inputs, advantages=-torch.ones_like(inputs["logprobs"]).detach())
    _, w = _dapo_readout(minus_one, make_stub(loss_type="cispo", eps_high=_p(params, fid, "eps_high")), vjp=False)
    return {"loss": loss, "weight": w, "grad": {"logprobs": g}}


def _sample_mean_scale(mask, dtype):
    """B * L_i at every position: undoes TRL's sample-mean weight 1/(B L_i)."""
    B = mask.shape[0]
    L = mask.sum(-1, keepdim=True).clamp(min=1).to(dtype)
    return (L * B).expand(mask.shape)


def sapo(inputs, params):
    import torch

    fid = "surrogate.sapo"
    _require(params, fid, "log_ratio_clamp", None, "TRL does not clamp the log-ratio")
    m = inputs["mask"]
    stub = make_stub(loss_type="sapo", sapo_tau_pos=_p(params, fid, "tau_pos"), sapo_tau_neg=_p(params, fid, "tau_neg"),
                     use_is=True)
    lp, old = _canon(inputs, "logprobs", "old_logprobs")
    adv = _adv(inputs)
    isr = torch.ones_like(lp).requires_grad_(True)
    loss = compute_loss(stub, logprobs=lp, mask=m, advantages=adv, old_logprobs=old, is_ratio=isr)
    # the per-token loss is d loss / d IS-ratio undone of TRL's sample-mean weight; its VJP with the cotangent
    value, g = _vjp_readout(loss, isr, m, inputs["logprobs"], _sample_mean_scale(m, lp.dtype))
    return {"loss": value, "grad": {"logprobs": g}}


def gspo(inputs, params):
    import torch

    fid = "surrogate.gspo"
    _require(params, fid, "log_ratio_max", None, "TRL does not cap the sequence log-ratio")
    m = inputs["mask"]
    lp, old = _canon(inputs, "logprobs", "old_logprobs")
    adv = _adv(inputs)
    eps = dict(eps_low=_p(params, fid, "eps_low"), eps_high=_p(params, fid, "eps_high"))
    # value: dapo + sequence level, N = 1: d loss / d IS-ratio[i, t] = the sequence loss at each unmasked token
    isr = torch.ones_like(lp).requires_grad_(True)
    stub = make_stub(loss_type="dapo", level="sequence", use_is=True, **eps)
    loss = compute_loss(stub, logprobs=lp.detach(), mask=m, advantages=adv, old_logprobs=old, is_ratio=isr,
                        num_items_in_batch=1)
    (g_is,) = _grad(loss, isr)
    first = m.long().argmax(-1, keepdim=True)
    seq = torch.where(m.any(-1), g_is.gather(-1, first).squeeze(-1), torch.zeros((), dtype=lp.dtype))
    # gradient: GSPO as TRL runs it (grpo, sequence level), whose loss (1/B) sum_i loss_i treats the rows
    # independently: the VJP with the cotangent c (one value per sequence) is sum_i c_i d loss_i, each
    # row's gradient taken from a call on that row alone (B = 1: TRL's mean is that row's loss)
    stub = make_stub(loss_type="grpo", level="sequence", **eps)
    c = current_cotangent(like=seq)
    g_lp = torch.zeros_like(inputs["logprobs"])
    for i in range(m.shape[0]):
        row = slice(i, i + 1)
        if not bool(m[i].any()):
            continue
        loss = compute_loss(stub, logprobs=lp[row], mask=m[row], advantages=adv[row], old_logprobs=old[row])
        g = torch.autograd.grad(loss, inputs["logprobs"], retain_graph=True, allow_unused=True)[0]
        if g is not None:
            g_lp = g_lp + g * c[i]      # one row: B = 1, TRL's mean is that row's loss
    return {"loss": seq, "grad": {"logprobs": g_lp}}


VESPO_FIXED = {"lambda_min": 1e-4, "log_ratio_clamp": 20.0, "min_weight": 1e-8, "max_log_weight": 20.0}


def vespo(inputs, params):
    from trl import GRPOTrainer

    fid = "surrogate.vespo"
    for name, value in VESPO_FIXED.items():
        _require(params, fid, name, value, "TRL hard-codes it in get_gamma_weights")
    if inputs.get("sampler_logprobs") is not None:
        raise UnsupportedParameter(f"{fid}: TRL computes the vLLM IS ratio it folds into phi inside generation "
                                   "(_generate_and_score_completions); no callable takes sampler log-probs")
    k = tuple(_p(params, fid, n) for n in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"))
    stub = make_stub(loss_type="vespo", vespo=k)
    loss, g = _dapo_readout(inputs, stub)
    m = inputs["mask"]
    lp, old = _canon(inputs, "logprobs", "old_logprobs")
    adv = _adv(inputs)
    phi = GRPOTrainer.get_gamma_weights(adv.unsqueeze(1) if adv.dim() == 1 else adv, (lp - old).detach(), m.long(),
                                        None, *k)
    return {"loss": loss, "phi": phi.squeeze(-1), "grad": {"logprobs": g}}


# ---------------------------------------------------------------------------------------------- kl


def _kl(fid, bias_correction):
    def run(inputs, params):
        import torch

        for n in ("log_ratio_min", "log_ratio_max", "output_min", "output_max"):
            _require(params, fid, n, None, "TRL 1.16.0 clamps neither the KL input nor its output (trl#3015)")
        m = inputs["mask"]
        lp, ref = _canon(inputs, "logprobs", "ref_logprobs")
        old = _canon(inputs, "old_logprobs")[0] if bias_correction else None
        # cispo with A = 0: the policy term is exactly 0 for any ratio; beta = 1: the per-token loss is the KL
        stub = make_stub(loss_type="cispo", eps_high=1.0, beta=1.0, bias_correction_kl=bias_correction)
        fm = m.to(lp.dtype).requires_grad_(True)
        adv = torch.zeros(m.shape[0], dtype=lp.dtype)  # noqa: the policy term vanishes
        loss = compute_loss(stub, logprobs=lp, mask=m, advantages=adv, old_logprobs=old, ref_logprobs=ref,
                            num_items_in_batch=1, float_mask=fm)
        g_m, g_lp = _vjp_readout(loss, fm, m, inputs["logprobs"])
        return {"kl": g_m, "grad": {"logprobs": g_lp}}

    run.__name__ = fid.replace(".", "_")
    return run


# ---------------------------------------------------------------------------------------------- masks


class _Probe:
    """Records what TRL computes inside one of its functions (a TorchFunctionMode; changes no result)."""

    def __init__(self, want):
        self.want = want
        self.seen = []

    def __enter__(self):
        import torch
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
    from trl import GRPOTrainer

    fid = "mask.opsm"
    m = inputs["mask"]
    adv = _adv(inputs)
    if adv.dim() == 2:
        raise UnsupportedParameter(f"{fid}: TRL's get_off_policy_mask gates each token by its own advantage "
                                   "(advantages >= 0 elementwise); it has no sequence advantage for [B,T] advantages")
    lp, mu = _canon(inputs, "logprobs", "sampler_logprobs")
    delta = _p(params, fid, "delta")
    with _Probe(lambda f, a: getattr(f, "__name__", "") in ("__le__", "le") and len(a) == 2
                and not isinstance(a[1], torch.Tensor)) as probe:
        keep = GRPOTrainer.get_off_policy_mask(advantages=adv.unsqueeze(1), per_token_logps=lp,
                                               sampling_per_token_logps=mu, mask=m.long(), off_policy_threshold=delta)
    if len(probe.seen) != 1:
        raise RuntimeError(f"could not read TRL's sequence statistic ({len(probe.seen)} comparisons seen)")
    stat = probe.seen[0][1][0].squeeze(-1)
    seq_keep = keep.squeeze(-1).bool()
    return {"seq_keep": seq_keep, "keep": seq_keep.unsqueeze(-1).expand(m.shape), "seq_stat": stat,
            "seq_advantage": adv}


def entropy_quantile(inputs, params):
    import torch

    fid = "mask.entropy_quantile"
    m = inputs["mask"]
    (ent,) = _canon(inputs, "entropy")
    rho = _p(params, fid, "top_entropy_quantile")
    stub = make_stub(loss_type="dapo")
    with _Probe(lambda f, a: f is torch.quantile) as probe:
        keep = stub.get_high_entropy_mask(ent, m.long(), 1 - rho)
    threshold = probe.seen[0][2] if probe.seen else torch.tensor(float("nan"))
    return {"keep": keep, "threshold": threshold}


# ---------------------------------------------------------------------------------------------- logprob


def _logprob(inputs, params, fid):
    import torch
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    logits, m = inputs["logits"], inputs["mask"]
    B, T, V = logits.shape
    targets = inputs.get("targets")
    if targets is None:
        targets = torch.zeros((B, T), dtype=torch.long)
    # TRL's fused LM head scores only the positions with a label (not -100) and zero-fills the others; the
    # logits are fed as hidden states against an identity lm_head (an exact projection)
    hidden = logits[m]
    weight = torch.eye(V, dtype=logits.dtype)
    softcap = _p(params, fid, "softcap")
    lp, ent, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets[m], _p(params, fid, "temperature"),
                                               4096, softcap, _p(params, fid, "logit_scale"), ("entropy",))
    out_lp = torch.zeros((B, T), dtype=lp.dtype).masked_scatter(m, lp)
    out_ent = torch.zeros((B, T), dtype=ent.dtype).masked_scatter(m, ent)
    return out_lp, out_ent


def logprob_token(inputs, params):
    return {"logprobs": _logprob(inputs, params, "logprob.token")[0]}


def logprob_entropy(inputs, params):
    return {"entropy": _logprob(inputs, params, "logprob.entropy")[1]}


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": ppo_clip,
    "surrogate.trl_delta": trl_delta,
    "surrogate.cispo": cispo,
    "surrogate.sapo": sapo,
    "surrogate.gspo": gspo,
    "surrogate.vespo": vespo,
    "kl.k3": _kl("kl.k3", False),
    "kl.k3_unbiased": _kl("kl.k3_unbiased", True),
    "mask.opsm": opsm,
    "mask.entropy_quantile": entropy_quantile,
    "logprob.token": logprob_token,
    "logprob.entropy": logprob_entropy,
}
