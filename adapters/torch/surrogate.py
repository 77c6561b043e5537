"""surrogate.* in PyTorch (spec/surrogate.md).

Written the way the frameworks write these losses: the PPO family as max(-A r, -A clip(r)) with
torch.maximum (whose backward splits the cotangent of a tie in half, as spec/conventions.md
requires inside the clip range), the dual clip with torch.where on A < 0, CISPO and VESPO as
REINFORCE terms with a .detach()ed weight, GSPO from the masked mean log-ratio, GMPO with verl's
sign-aware log-space clip.  Masked positions are selected away with torch.where before anything is
computed from them, so NaN or inf there reaches neither an output nor a gradient.
Likewise a zero advantage selects a zero loss (``zero_where_no_advantage``): a ratio that
overflowed (e^200 in float32) is never multiplied by A = 0 into a NaN.

Two places differ from the most literal framework code, both because the literal code gives a
wrong float32 gradient on inputs the spec covers (see the report in tests/test_torch_surrogate.py):

* ``exp_``: e^d with a *strong zero* in its backward.  On the clipped side of PPO (A > 0 and
  d = 200, say) the ratio overflows to inf in float32 and the branch that holds it receives a zero
  cotangent; torch.exp's backward multiplies that zero by its result, 0 * inf = NaN, where the
  spec's gradient is exactly 0.  Here a zero cotangent stays 0; any other cotangent is multiplied
  by e^d as usual (so a genuinely overflowing gradient is still inf).
* ``soft_gate``: SAPO's gate sigma(tau (r - 1)) 4 / tau as one autograd node of the log-ratio, its
  derivative 4 sigma(x) sigma(-x) r evaluated without the cancellation 1 - sigma(x) of
  torch.sigmoid's backward (relative error ~ u e^x, over the tolerance already at x ~ 3), and with
  x = tau expm1(d), as spec/surrogate.md says the reference does.
"""

from __future__ import annotations

import math

import torch

from pgspec.reference import REGISTRY, SpecError

from .agg import segment_sums


def _param(params, fid, name):
    """A parameter by its spec name, defaulting to the reference registry's default."""
    if name in params:
        value = params[name]
    else:
        value = next(p.default for p in REGISTRY[fid].params if p.name == name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and next(p for p in REGISTRY[fid].params if p.name == name).kind == "choice":
        return value
    return float(value)


# building blocks -----------------------------------------------------------------------------

class _StrongZeroExp(torch.autograd.Function):
    """y = e^x; dx = g y, and exactly 0 where g == 0 (never 0 * inf = NaN)."""

    @staticmethod
    def forward(ctx, x):
        y = torch.exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return torch.where(g == 0, torch.zeros_like(g), g * y)


def exp_(x):
    return _StrongZeroExp.apply(x)


def _choose(cond, x, y, like):
    """x where cond else y, as a tensor of like's dtype (parameters never rounded to float32 first)."""
    return torch.where(cond, torch.tensor(x, dtype=like.dtype, device=like.device),
                       torch.tensor(y, dtype=like.dtype, device=like.device))


def _selected(inputs, name):
    """An input [B, T] with its masked positions replaced by 0 (selected, never multiplied)."""
    x = inputs[name]
    return torch.where(inputs["mask"], x, torch.zeros_like(x))


def token_advantages(inputs):
    """A_{i,t}: [B, T] advantages, or [B] advantages broadcast to the tokens; 0 at masked positions."""
    a = inputs["advantages"]
    m = inputs["mask"]
    if a.dim() == 1:
        a = a.unsqueeze(-1).expand(m.shape)
    return torch.where(m, a, torch.zeros_like(a))


def sequence_advantages(inputs):
    """A_i [B], 0 for an empty sequence (its advantage is never read)."""
    a = inputs["advantages"]
    return torch.where(inputs["mask"].any(-1), a, torch.zeros_like(a))


def log_ratio(inputs, detach=False):
    """d = l - l_old at unmasked positions, 0 elsewhere; l is detached when asked."""
    lp = _selected(inputs, "logprobs")
    if detach:
        lp = lp.detach()
    return lp - _selected(inputs, "old_logprobs")


def _clamp(x, c):
    return x if c is None else torch.clamp(x, -c, c)


def zero_where_no_advantage(a, loss):
    """loss, and exactly 0 where A = 0: a ratio that overflowed (e^200 = inf in float32) times A = 0
    would be NaN where the spec's -A r is 0, so the zero is selected, never multiplied."""
    return torch.where(a == 0, torch.zeros_like(loss), loss)


def ppo_clip_loss(r, a, eps_low, eps_high):
    """max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)), 0 where A = 0."""
    return zero_where_no_advantage(a, torch.maximum(-a * r, -a * torch.clamp(r, 1 - eps_low, 1 + eps_high)))


# formulas ---------------------------------------------------------------------------------------

def pg(inputs, params):
    fid = "surrogate.pg"
    a = token_advantages(inputs)
    if _param(params, fid, "form") == "logprob":
        if inputs.get("old_logprobs") is not None:
            raise SpecError(f"{fid}: input 'old_logprobs' is not read by form='logprob'; omit it or use form='ratio'")
        if _param(params, fid, "log_ratio_clamp") is not None:
            raise SpecError(f"{fid}: parameter 'log_ratio_clamp' has no meaning for form='logprob'; it must be null")
        return {"loss": -a * _selected(inputs, "logprobs")}
    if inputs.get("old_logprobs") is None:
        lp = _selected(inputs, "logprobs")
        d = lp - lp.detach()   # on-policy: exp(l - sg[l]), value 1, derivative 1
    else:
        d = log_ratio(inputs)
    r = exp_(_clamp(d, _param(params, fid, "log_ratio_clamp")))
    return {"loss": zero_where_no_advantage(a, -a * r)}


def ppo_clip(inputs, params):
    fid = "surrogate.ppo_clip"
    r = exp_(_clamp(log_ratio(inputs), _param(params, fid, "log_ratio_clamp")))
    return {"loss": ppo_clip_loss(r, token_advantages(inputs), _param(params, fid, "eps_low"),
                                  _param(params, fid, "eps_high"))}


def dual_clip(inputs, params):
    fid = "surrogate.dual_clip"
    a = token_advantages(inputs)
    r = exp_(_clamp(log_ratio(inputs), _param(params, fid, "log_ratio_clamp")))
    loss = ppo_clip_loss(r, a, _param(params, fid, "eps_low"), _param(params, fid, "eps_high"))
    c = _param(params, fid, "c")
    return {"loss": torch.where(a < 0, torch.minimum(loss, -c * a), loss)}


def trl_delta(inputs, params):
    fid = "surrogate.trl_delta"
    a = token_advantages(inputs)
    eps_low, eps_high = _param(params, fid, "eps_low"), _param(params, fid, "eps_high")
    r = exp_(log_ratio(inputs))
    coef_2 = torch.clamp(r, 1 - eps_low, 1 + eps_high)   # clipped branch: the uncapped ratio
    coef_1 = torch.clamp(r, max=_param(params, fid, "delta"))
    return {"loss": -torch.min(coef_1 * a, coef_2 * a)}


def _mean_log_ratio(d, mask):
    """(1/L_i) sum_t m d; 0 for an empty sequence.  ``d`` is already 0 at masked positions."""
    return d.sum(-1) / mask.sum(-1).clamp(min=1)


def gspo(inputs, params):
    fid = "surrogate.gspo"
    m = inputs["mask"]
    a = sequence_advantages(inputs)
    log_s = _mean_log_ratio(_clamp(log_ratio(inputs), _param(params, fid, "log_ratio_clamp")), m)
    cap = _param(params, fid, "log_ratio_max")
    if cap is not None:
        log_s = torch.clamp(log_s, max=cap)
    loss = ppo_clip_loss(exp_(log_s), a, _param(params, fid, "eps_low"), _param(params, fid, "eps_high"))
    return {"loss": torch.where(m.any(-1), loss, torch.zeros_like(loss))}


def gmpo(inputs, params):
    fid = "surrogate.gmpo"
    m = inputs["mask"]
    a = sequence_advantages(inputs)
    d = log_ratio(inputs)
    sgn = _choose(a > 0, 1.0, -1.0, d).unsqueeze(-1)   # sgn(0) = -1 (paper Algorithm 1)
    d_clip = torch.clamp(d, -_param(params, fid, "eps_low"), _param(params, fid, "eps_high"))
    d_tilde = sgn * torch.min(sgn * d, sgn * d_clip)
    d_tilde = torch.where(m, d_tilde, torch.zeros_like(d_tilde))
    loss = zero_where_no_advantage(a, -a * exp_(_mean_log_ratio(d_tilde, m)))
    return {"loss": torch.where(m.any(-1), loss, torch.zeros_like(loss))}


def cispo(inputs, params):
    fid = "surrogate.cispo"
    cap_form = _param(params, fid, "cap_form")
    eps_low, eps_high = _param(params, fid, "eps_low"), _param(params, fid, "eps_high")
    if cap_form == "absolute" and eps_low is not None:
        raise SpecError(f"{fid}: parameter 'eps_low' applies only to cap_form='relative'; it must be null")
    r = torch.exp(_clamp(log_ratio(inputs, detach=True), _param(params, fid, "log_ratio_clamp")))
    if cap_form == "absolute":
        w = torch.clamp(r, max=eps_high)
    else:
        w = torch.clamp(r, min=None if eps_low is None else 1 - eps_low, max=1 + eps_high)
    loss = -w.detach() * token_advantages(inputs) * _selected(inputs, "logprobs")
    return {"loss": loss, "weight": w}


class _SoftGate(torch.autograd.Function):
    """f = sigma(x) 4 / tau with x = tau expm1(d); df/dd = 4 sigma(x) sigma(-x) e^d."""

    @staticmethod
    def forward(ctx, d, tau):
        x = tau * torch.expm1(d)
        p = torch.sigmoid(x)
        ctx.save_for_backward(d, x)
        return p * 4 / tau

    @staticmethod
    def backward(ctx, g):
        d, x = ctx.saved_tensors
        q = torch.sigmoid(-x)               # 1 - p without cancellation
        # q == 0 (x beyond ~100): the slope has underflowed; e^d may be inf there, so select 0
        slope = torch.where(q == 0, torch.zeros_like(q), 4 * torch.sigmoid(x) * q * torch.exp(d))
        return torch.where(g == 0, torch.zeros_like(g), g * slope), None


def soft_gate(d, tau):
    """SAPO's gate f(r; tau) = sigma(tau (r - 1)) 4 / tau at r = e^d."""
    return _SoftGate.apply(d, tau)


def sapo(inputs, params):
    fid = "surrogate.sapo"
    a = token_advantages(inputs)
    d = _clamp(log_ratio(inputs), _param(params, fid, "log_ratio_clamp"))
    tau = _choose(a > 0, _param(params, fid, "tau_pos"), _param(params, fid, "tau_neg"), d)
    return {"loss": -a * soft_gate(d, tau)}


def vespo_log_weight(inputs, params):
    """log w_i = clip(sum_t clip(d, -c, c) + sum_t clip(l_old - l_mu, log w_min, W), log w_min, W) (no grad)."""
    fid = "surrogate.vespo"
    lo = math.log(_param(params, fid, "min_weight"))
    hi = _param(params, fid, "max_log_weight")
    m = inputs["mask"]
    with torch.no_grad():
        d = _clamp(log_ratio(inputs, detach=True), _param(params, fid, "log_ratio_clamp"))
        log_w = torch.where(m, d, torch.zeros_like(d)).sum(-1)
        if inputs.get("sampler_logprobs") is not None:
            log_is = torch.clamp(_selected(inputs, "old_logprobs") - _selected(inputs, "sampler_logprobs"), lo, hi)
            log_w = log_w + torch.where(m, log_is, torch.zeros_like(log_is)).sum(-1)
        return torch.clamp(log_w, lo, hi)


def vespo(inputs, params):
    fid = "surrogate.vespo"
    a = inputs["advantages"]
    a = torch.where(inputs["mask"].any(-1), a, torch.zeros_like(a))
    pos = a >= 0
    k = _choose(pos, _param(params, fid, "k_pos"), _param(params, fid, "k_neg"), a)
    lam = _choose(pos, _param(params, fid, "lambda_pos"), _param(params, fid, "lambda_neg"), a)
    lam = torch.clamp(lam, min=_param(params, fid, "lambda_min"))
    with torch.no_grad():   # TRL get_gamma_weights: phi carries no gradient
        log_w = vespo_log_weight(inputs, params)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    loss = -phi.detach().unsqueeze(-1) * a.unsqueeze(-1) * _selected(inputs, "logprobs")
    return {"loss": loss, "phi": phi}


def gspo_document(inputs, params):
    """Fast-LLM PR #502's packed-document GSPO: per-document sums of (l - l_old, A, 1) over the
    unmasked tokens (document ids global across rows), R_s = exp(sum / N_s), A_s stopped,
    l_s = max(-A_s R_s, -A_s clip(R_s)), weighted_loss_s = N_s l_s."""
    fid = "surrogate.gspo_document"
    m, docs = inputs["mask"], inputs["document_ids"]
    d = log_ratio(inputs)[m]
    a = token_advantages(inputs)[m].detach()
    ids, inv = torch.unique(docs[m], sorted=True, return_inverse=True)
    K = ids.numel()
    counts = torch.bincount(inv, minlength=K)
    n = counts.to(d.dtype)
    lrn = segment_sums(d, inv, K)                 # pairwise within each document (agg.segment_sums)
    adv = segment_sums(a, inv, K) / n
    r = exp_(lrn / n)
    loss = ppo_clip_loss(r, adv, _param(params, fid, "eps_low"), _param(params, fid, "eps_high"))
    return {"segment_ids": ids, "token_count": counts, "ratio": r, "advantage": adv, "loss": loss,
            "weighted_loss": loss * n}


IMPLEMENTATIONS = {
    "surrogate.gspo_document": gspo_document,
    "surrogate.pg": pg,
    "surrogate.ppo_clip": ppo_clip,
    "surrogate.dual_clip": dual_clip,
    "surrogate.trl_delta": trl_delta,
    "surrogate.gspo": gspo,
    "surrogate.gmpo": gmpo,
    "surrogate.cispo": cispo,
    "surrogate.sapo": sapo,
    "surrogate.vespo": vespo,
}
