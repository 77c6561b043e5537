"""logprob: token log-probabilities and entropies from logits (spec/logprob.md).

Every formula here works on the *transformed* logits of one position,

    z'_v = softcap_c(s * z_v) / tau,      softcap_c(x) = c * tanh(x / c)   (identity when c is null),

with logit scale s, softcap c and temperature tau, in this order (TRL 1.16.0
``ChunkedLogProbFunction``: scale, then softcap, then division by the temperature).

The log-sum-exp is written in the shifted form

    LSE(z') = z'_* + log1p( sum_{v != *} exp(z'_v - z'_*) ),     * = the first index of the maximum,

which is an identity (so its gradient is the softmax whichever maximum is chosen) and has no
cancellation: every exponent is <= 0 and log1p is exact for a small sum.  The entropy is written
as a sum of non-negative terms for the same reason (see ``entropy_of``).
"""

from __future__ import annotations

from mpmath import mp, mpf

from ._ad import Var, exp, is_var, log1p, total, value_of
from ._common import MASK, per_token, positions, require, token_output
from ._registry import Input, Param, formula

LOGITS = Input("logits", (("B", "T", "V"),))
TARGETS = Input(
    "targets", (("B", "T"),), kind="int",
    doc="realized token ids; each must lie in [0, V) where the mask is true (any integer, e.g. -100, elsewhere)",
)

TEMPERATURE = Param(
    "temperature", 1, lo=0, lo_open=True,
    doc="tau > 0: the transformed logits are divided by tau (after the scale and the softcap)",
)
LOGIT_SCALE = Param(
    "logit_scale", 1, lo=0, lo_open=True,
    doc="s > 0: the raw logits are multiplied by s first (Cohere-style logit scale; Fast-LLM logits_scale_factor)",
)
SOFTCAP = Param(
    "softcap", None, lo=0, lo_open=True, nullable=True,
    doc="c > 0: the scaled logits are capped to c*tanh(x/c) before the temperature (Gemma-style); null: no cap",
)
LOGIT_PARAMS = (TEMPERATURE, LOGIT_SCALE, SOFTCAP)

TRL_LOGITS = (
    "trl 1.16.0 trl/kernels/chunked_logprob.py ChunkedLogProbFunction "
    "(logit_scale, then softcap, then / temperature)"
)
LIGER_LOGITS = "liger-kernel 0.8.5 chunked_loss/fused_linear_ppo.py and ops/grpo_loss.py (logits / temperature)"


# Per-position primitives (composable by other families) ---------------------------------------

def softcap_value(x, c):
    """c * tanh(x / c), differentiable in x, with derivative sech^2(x / c).

    ``_ad.tanh`` differentiates as 1 - tanh^2, which cancels when |x / c| is large (tanh -> +-1);
    1 / cosh^2 is the same number computed without cancellation.
    """
    if c is None:
        return x
    u = value_of(x) / c
    t = mp.tanh(u)
    y = c * t
    if isinstance(x, Var):
        sech2 = 1 / mp.cosh(u) ** 2
        # the derivative as usually computed (autograd through torch.tanh) is 1 - t^2 from the rounded
        # t: an absolute error of about 2 t^2 + 2 |1 - t^2| units of u, all of it once tanh saturates
        return Var(y, ((x, sech2),), dscale=(2 * t * t + 2 * sech2,))
    return y


def transform_logits(row, temperature=1, logit_scale=1, softcap=None):
    """z'_v = softcap_c(s * z_v) / tau for every entry v of one position's logits ``row``."""
    return [softcap_value(z * logit_scale, softcap) / temperature for z in row]


def _argmax(zs):
    """The first index of the largest value (a branch decision; it carries no gradient)."""
    best = 0
    for v in range(1, len(zs)):
        if value_of(zs[v]) > value_of(zs[best]):
            best = v
    return best


def _shifted(zs):
    """(*, [z'_v - z'_* for v], s) with * = argmax and s = sum_{v != *} exp(z'_v - z'_*).

    The gradient at the max meets +1 and -1 (from z'_* - z'_*) and the tiny s/(1 + s); the backward
    pass sums a node's contributions exactly, so 1 - p_* = 1e-87 survives (see _ad.backward).
    """
    star = _argmax(zs)
    diffs = [zs[v] - zs[star] for v in range(len(zs))]
    s = total(exp(diffs[v]) for v in range(len(zs)) if v != star)
    return star, diffs, s


def log_sum_exp(zs):
    """LSE(z') = log sum_v exp(z'_v) = z'_* + log1p(sum_{v != *} exp(z'_v - z'_*))."""
    star, _, s = _shifted(zs)
    return zs[star] + log1p(s)


def log_softmax_at(row, target, temperature=1, logit_scale=1, softcap=None):
    """l = z'_y - LSE(z') = (z'_y - z'_*) - log1p(sum_{v != *} exp(z'_v - z'_*)).

    ``row`` is one position's raw logits (mpf or Var), ``target`` the token id y.  Its gradient with
    respect to z_v is (1[v = y] - p_v) * (s / tau) * softcap'(s z_v).
    """
    zs = transform_logits(row, temperature, logit_scale, softcap)
    _, diffs, s = _shifted(zs)
    if not is_var(s):
        return diffs[target] - log1p(s)
    # As usually written (log_softmax: the log of the rounded normalizer 1 + s >= 1) this log errs by
    # about one unit absolute, not relative to its possibly tiny value; its derivative 1 / (1 + s)
    # by about two units relative (stated, so the absolute rounding does not enter the gradient's).
    sv = value_of(s)
    tail = Var(mp.log1p(sv), ((s, 1 / (1 + sv)),), rounding=mp.log1p(sv) + 1, dscale=(2 / (1 + sv),))
    return diffs[target] - tail


def entropy_of(row, temperature=1, logit_scale=1, softcap=None):
    """H = -sum_v p_v log p_v of p = softmax(z'), written without cancellation:

        H = log1p(S) + T / (1 + S),   T = sum_{v != *} d_v exp(-d_v),
        d_v = z'_* - z'_v >= 0,  S = sum_{v != *} exp(-d_v),

    (every term is >= 0; H = LSE - sum_v p_v z'_v rearranged around the maximum z'_*).

    One node of the transformed logits with the closed-form gradient dH/dz'_v = -p_v (log p_v + H):
    at the maximum log p_* + H = T / (1 + S) exactly, elsewhere log p_v + H = T / (1 + S) - d_v.
    (Term by term, the chain rule would add contributions of size 1 that cancel down to the
    1e-85 of a 200-logit gap, so their rounding would dominate.)
    """
    zs = transform_logits(row, temperature, logit_scale, softcap)
    star = _argmax(zs)
    zv = [value_of(z) for z in zs]
    d = {v: zv[star] - zv[v] for v in range(len(zs)) if v != star}
    e = {v: mp.exp(-dv) for v, dv in d.items()}
    s = mp.fsum(e.values())
    t = mp.fsum(d[v] * e[v] for v in d)
    h = mp.log1p(s) + t / (1 + s)
    if not any(is_var(z) for z in zs):
        return h
    shift = t / (1 + s)
    ps = [(1 if v == star else e[v]) / (1 + s) for v in range(len(zs))]
    logs = [-(mp.log1p(s) + (0 if v == star else d[v])) for v in range(len(zs))]   # log p_v
    plogp = [abs(p * lp) for p, lp in zip(ps, logs)]
    # The usual backward of -sum_w p_w log p_w through the softmax forms, for each v,
    # sum_w -(log p_w + 1) p_w ([w = v] - p_v): terms of size p_w (1 + |log p_w|) (1[w = v] + p_v),
    # each rounded; that sum of magnitudes is the error scale of the derivative as usually computed.
    mass = mp.fsum(p * (1 + abs(lp)) for p, lp in zip(ps, logs))
    parents, own = [], []
    for v, z in enumerate(zs):
        if is_var(z):
            slope = -ps[v] * (shift if v == star else shift - d[v])   # -p_v (log p_v + H)
            parents.append((z, slope))
            own.append(4 * (ps[v] * (1 + abs(logs[v])) + ps[v] * mass))
    # the error of -sum_v p_v log p_v as usually written: a softmax, a log and a product per entry
    # (about three roundings of |p_v log p_v| each), summed pairwise over V entries
    rounding = (3 + max(1, (len(zs) - 1).bit_length())) * mp.fsum(plogp) + abs(h)
    dscale = _entropy_dscale(zs, star, d, ps, h, shift, s, own)
    return Var(h, tuple(parents), rounding=rounding, dscale=dscale)


def _entropy_dscale(zs, star, d, ps, h, shift, s, own):
    """The error of the entropy's derivatives dH/dz'_v as usually computed, a function of the
    operands' forward errors E(z'_w), read when the scale pass runs (see ``_ad.Var.dscale``).

    ``own``: the roundings of the backward's own products (4 u on each term of size
    p_w (1 + |log p_w|) (1[w = v] + p_v)).  To them comes the error the derivative inherits from
    its rounded inputs, to first order:

    * log p_w = (z'_w - z'_*) - log(1 + S), S = sum_{w != *} exp(z'_w - z'_*).  The shifted logit
      z'_w - z'_* errs by e_w - e_* + rho_w (e: the operands' errors, |e_w| <= E(z'_w) u; rho_w: the
      subtraction's rounding, |rho_w| <= |d_w| u, 0 at the maximum), and log(1 + S) by
      sum_{w != *} p_w (e_w - e_* + rho_w) plus its own rounding lam (log(1 + S) + 1 units, and the
      sum's ceil(log2(V - 1)) S/(1 + S)).  The common e_* cancels, so with a_w = E(z'_w) + |d_w|,
          delta_v = error of log p_v:   |delta_v| <= R_v = (1 - p_v) a_v + sum_{w != v} p_w a_w + lam.
    * p_w = exp(log p_w) errs *relatively* by delta_w: exp's condition number is its argument's
      absolute error.
    * dH/dz'_v as usually computed is p_v (-(log p_v + 1) + Sigma), Sigma = sum_w p_w (log p_w + 1)
      (the softmax backward: one factor p_v).  Its error is delta_v (g_v - p_v) + p_v delta_Sigma,
      g_v = -p_v (log p_v + H), and delta_Sigma = sum_w p_w (log p_w + 2) delta_w, in which the part
      common to every delta_w (-sum_u p_u (e_u + rho_u)) sums to -(2 - H) times it, so
          |delta_Sigma| <= sum_w p_w |log p_w + H| a_w + |2 - H| lam.
    So the added error is p_v |log p_v + H + 1| R_v + p_v (sum_w p_w |log p_w + H| a_w + |2 - H| lam).
    Where d_v is large it is |g_v| R_v: the error of p_v multiplies the whole derivative, as in
    logprob.token's gradient through its exp node.
    """
    # floats: the scale passes compute in floats (an mpf E, in their mpf fallback, promotes these)
    V = len(zs)
    P = [float(p) for p in ps]
    D = [0.0 if v == star else float(d[v]) for v in range(V)]
    lh = [float(abs(shift if v == star else shift - d[v])) for v in range(V)]           # |log p_w + H|
    c = [float(p * abs((shift if v == star else shift - d[v]) + 1)) for v, p in enumerate(ps)]  # |g_v - p_v|
    lam = float(mp.log1p(s) + 1 + max(1, (V - 2).bit_length()) * s / (1 + s)) if V > 1 else 0.0
    k = float(abs(2 - h))
    own = tuple(float(x) for x in own)
    live = [v for v, z in enumerate(zs) if is_var(z)]

    def dscale(e_of):
        a = [(e_of(z) if is_var(z) else 0.0) + D[w] for w, z in enumerate(zs)]
        A = sum(P[w] * a[w] for w in range(V))
        sigma = sum(P[w] * lh[w] * a[w] for w in range(V)) + k * lam
        out = []
        for o, v in zip(own, live):
            R = (1 - P[v]) * a[v] + max(0.0, A - P[v] * a[v]) + lam
            out.append(o + c[v] * R + P[v] * sigma)
        return tuple(out)

    return dscale


# Validation --------------------------------------------------------------------------------------

def _check_vocab(formula_id, logits, mask, targets=None):
    """Every unmasked position has V >= 1 logits and (for log-probs) a target in [0, V)."""
    for i, row in enumerate(mask):
        for t in positions(row):
            V = len(logits[i][t])
            require(V >= 1, f"{formula_id}: input 'logits' must have V >= 1 vocabulary entries, got V = 0")
            if targets is not None:
                y = targets[i][t]
                require(
                    0 <= y < V,
                    f"{formula_id}: input targets[{i}][{t}] must be a token id in [0, V) = [0, {V}) "
                    f"where the mask is true, got {y}",
                )


# Formulas ---------------------------------------------------------------------------------------

@formula(
    "logprob.token",
    title="Token log-prob log softmax(softcap_c(s z) / tau)_y at the realized token",
    inputs=(LOGITS, TARGETS, MASK),
    params=LOGIT_PARAMS,
    outputs=(token_output("logprobs", "l_{i,t} = log p_{i,t}(y_{i,t})"),),
    differentiable=("logits",),
    grad_of="logprobs",
    references=(
        TRL_LOGITS,
        LIGER_LOGITS,
        "verl 0.9.1 / NeMo-RL / slime: logits / temperature before log-softmax (research notes)",
        "Fast-LLM main: log softmax(logits_scale_factor * z), temperature via scale = 1/tau",
        "Gemma Team 2024, Gemma 2, arXiv:2408.00118 (final-logit soft-capping c*tanh(z/c), c = 30)",
    ),
)
def token_logprob(logits, targets, mask, *, temperature, logit_scale, softcap):
    """logprob.token:  l_{i,t} = z'_{i,t,y} - log sum_v exp(z'_{i,t,v}),
    z'_{i,t,v} = softcap_c(s z_{i,t,v}) / tau,  y = y_{i,t}   (null where the mask is false)."""
    _check_vocab("logprob.token", logits, mask, targets)
    return {
        "logprobs": per_token(
            mask,
            lambda i, t: log_softmax_at(logits[i][t], targets[i][t], temperature, logit_scale, softcap),
        )
    }


@formula(
    "logprob.entropy",
    title="Token entropy H = -sum_v p_v log p_v of softmax(softcap_c(s z) / tau)",
    inputs=(LOGITS, MASK),
    params=LOGIT_PARAMS,
    outputs=(token_output("entropy", "H_{i,t}, in nats"),),
    differentiable=("logits",),
    grad_of="entropy",
    references=(
        TRL_LOGITS + " (entropy = log Z - sum_v p_v z_v)",
        "slime: full-vocabulary entropy of the temperature-scaled logits (research notes)",
    ),
)
def token_entropy(logits, mask, *, temperature, logit_scale, softcap):
    """logprob.entropy:  H_{i,t} = -sum_v p_{i,t,v} log p_{i,t,v},  p = softmax(z'_{i,t}),
    z'_{i,t,v} = softcap_c(s z_{i,t,v}) / tau   (null where the mask is false)."""
    _check_vocab("logprob.entropy", logits, mask)
    return {
        "entropy": per_token(mask, lambda i, t: entropy_of(logits[i][t], temperature, logit_scale, softcap))
    }
