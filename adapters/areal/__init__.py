"""pgspec adapter for AReaL 1.0.4 (see adapters/areal/README.md).

Every implementation calls AReaL's own functions; the adapter only moves tensors between pgspec's
canonical layout and AReaL's arguments:

- ``areal.utils.functional.ppo_actor_loss_fn``: ``surrogate.ppo_clip``, ``surrogate.dual_clip``
  (token level), ``surrogate.gspo`` (``importance_sampling_level="sequence"``), ``loss.bnpo`` and
  ``loss.dapo`` (token mean, optional rejection sampling as the train/inference IS weight).
  Plain PPO is the decoupled loss with ``proximal_logprobs = old_logprobs``.
- ``areal.utils.functional.sapo_loss_fn``: ``surrogate.sapo``.
- ``areal.utils.functional.apply_rejection_sampling`` (``RejectionSamplingConfig``):
  ``is.token.truncate`` / ``is.token.mask`` (level token, metric ratio, action clamp / mask),
  ``is.geometric.truncate`` / ``is.geometric.mask`` (level sequence, agg mean), ``is.reject``
  (metrics kl_k1/kl_k2/kl_k3).
- ``areal.utils.data.KLEstimator``: ``kl.k1``, ``kl.k2``, ``kl.k3``.
- ``areal.utils.data.Normalization`` (``NormConfig``): ``adv.group_normalized``,
  ``adv.group_centered``, ``adv.batch_normalized``.

AReaL's losses return a scalar already aggregated as a token mean over the pre-rejection count
N0 (``loss_mask.count_nonzero() or 1``).  For the per-token ``surrogate.*`` outputs the adapter
returns AReaL's own per-token loss (``stat["loss"]``) and the gradient of the scalar seeded with
N0 (``torch.autograd.grad(loss, logprobs, grad_outputs=N0)``): the backward of ``sum / N0`` then
hands exactly 1 to every unmasked token, which is the spec's gradient of the sum of the unmasked
per-token losses.  ``surrogate.gspo`` (one loss per sequence) calls AReaL once per row: the token
mean of a row whose every token carries the sequence loss is that loss.

``KLEstimator`` (no mask argument) gets the log-probs multiplied by the mask, as AReaL's actor does
before calling it (``old_logp *= loss_mask``); functions with ``loss_mask`` get the canonical inputs as
they are (NaN/inf at masked positions included), so their masking is what is tested.

torch.compile: none of the AReaL functions above is compiled at the tested commit (AReaL compiles
only ``gather_logprobs`` / ``gather_logprobs_entropy``, which the adapter does not call), but every
implementation still runs with TorchDynamo disabled (``torch._dynamo.config.patch(disable=True)``
around the call), so that no compiled graph could reuse a Python float of an earlier case
(pytorch #194976 / #197889; README, "torch.compile").  ``PGSPEC_AREAL_COMPILE=default`` runs
torch's default instead (the version string says so).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import os
from pathlib import Path

from ..base import Adapter, current_cotangent, load_deviations, spec_param
from pgspec.adapters.base import Unsupported as _PropertyUnsupported

FRAMEWORK = "AReaL"
DIST_NAME = "areal"

# spec parameter -> AReaL argument / config field, per formula ID
PARAM_MAP = {
    "surrogate.ppo_clip": {"eps_low": "eps_clip", "eps_high": "eps_clip_higher",
                           "log_ratio_clamp": "(none: AReaL never clamps; must be null)"},
    "surrogate.dual_clip": {"eps_low": "eps_clip", "eps_high": "eps_clip_higher", "c": "c_clip",
                            "log_ratio_clamp": "(none; must be null)"},
    "surrogate.gspo": {"eps_low": "eps_clip", "eps_high": "eps_clip_higher",
                       "log_ratio_max": "(none; must be null)",
                       "(level)": "importance_sampling_level='sequence'"},
    "surrogate.sapo": {"tau_pos": "tau_pos (PPOActorConfig.sapo_tau_pos)",
                       "tau_neg": "tau_neg (PPOActorConfig.sapo_tau_neg)",
                       "log_ratio_clamp": "(none; must be null)"},
    "kl.k1": {"(estimator)": "KLEstimator('k1')", "output_min/output_max": "apply_clamp (True = [-10, 10], False = none)",
              "log_ratio_min/log_ratio_max": "(none; must be null)"},
    "kl.k2": {"(estimator)": "KLEstimator('k2')", "output_min/output_max": "apply_clamp (True = [-10, 10], False = none)",
              "log_ratio_min/log_ratio_max": "(none; must be null)"},
    "kl.k3": {"(estimator)": "KLEstimator('k3')", "output_min/output_max": "apply_clamp (True = [-10, 10], False = none)",
              "log_ratio_min/log_ratio_max": "(none; must be null)"},
    "is.token.truncate": {"c_min": "RejectionSamplingConfig.lower (null -> AReaL's 0.0)",
                          "c_max": "RejectionSamplingConfig.upper (null -> inf; must be > 1)",
                          "(mode)": "level='token', metric='ratio', action='clamp'",
                          "log_ratio_clamp": "(none; must be null)"},
    "is.token.mask": {"c_min": "RejectionSamplingConfig.lower", "c_max": "RejectionSamplingConfig.upper (null -> inf; must be > 1)",
                      "(mode)": "level='token', metric='ratio', action='mask'",
                      "log_ratio_clamp": "(none; must be null)"},
    "is.geometric.truncate": {"c_min": "RejectionSamplingConfig.lower (null -> AReaL's 0.0)",
                              "c_max": "RejectionSamplingConfig.upper (null -> inf; must be > 1)",
                              "(mode)": "level='sequence', agg='mean', metric='ratio', action='clamp'",
                              "log_ratio_clamp": "(none; must be null)"},
    "is.geometric.mask": {"c_min": "RejectionSamplingConfig.lower", "c_max": "RejectionSamplingConfig.upper (null -> inf; must be > 1)",
                          "(mode)": "level='sequence', agg='mean', metric='ratio', action='mask'",
                          "log_ratio_clamp": "(none; must be null)"},
    "is.reject": {"estimator": "metric ('kl_k1', 'kl_k2', 'kl_k3')",
                  "direction": "(fixed 'old_mu': AReaL's metric is of log(pi_prox / pi_behave))",
                  "level": "level='token' | level='sequence' with agg='sum'/'mean'/'max' (seq_sum/seq_mean/seq_max)",
                  "lower": "lower", "upper": "upper (null -> inf; k2/k3 need > 0)",
                  "log_ratio_clamp": "(none; must be null)"},
    "adv.group_normalized": {"std": "NormConfig.std_unbiased (bessel -> True)", "eps": "NormConfig.eps",
                             "eps_placement": "(fixed 'std': x / (std + eps))",
                             "singleton": "(fixed 'zero')",
                             "(groups)": "NormConfig(mean_level='group', std_level='group', group_size=n): rows reordered into contiguous groups of n"},
    "adv.group_centered": {"singleton": "(fixed 'zero')",
                           "(groups)": "NormConfig(mean_level='group', std_level=None, group_size=n)"},
    "adv.batch_normalized": {"std": "NormConfig.std_unbiased", "eps": "NormConfig.eps",
                             "std_of": "(fixed 'centered': std_level='batch' takes the std about the group means)",
                             "eps_placement": "(fixed 'std')", "singleton": "(fixed 'zero')",
                             "(groups)": "NormConfig(mean_level='group', std_level='batch', group_size=n)"},
    "loss.bnpo": {"eps_low": "eps_clip", "eps_high": "eps_clip_higher",
                  "is_level": "rejection_sampling: none -> None; token -> level='token'; geometric -> level='sequence', agg='mean'",
                  "is_mode": "RejectionSamplingConfig.action (truncate -> 'clamp', mask -> 'mask')",
                  "is_c_min": "RejectionSamplingConfig.lower", "is_c_max": "RejectionSamplingConfig.upper",
                  "beta": "(none: AReaL's KL is reward-only; must be 0)",
                  "(aggregation)": "token mean over the pre-rejection count (fixed)"},
    "loss.dapo": {"eps_low": "eps_clip", "eps_high": "eps_clip_higher", "aggregation": "(fixed 'token_mean')",
                  "is_level": "as loss.bnpo", "is_mode": "as loss.bnpo", "is_c_min": "lower", "is_c_max": "upper",
                  "beta": "(must be 0)"},
}


class AReaLUnsupported(_PropertyUnsupported, NotImplementedError):
    """A parameter value or input that AReaL 1.0.4 cannot express.  The declared capabilities
    (deviations.toml) keep golden cases outside them from reaching the adapter; a property example
    outside them raises this, which the property runner reports as ``unsupported``."""


def _unsupported(fid, why):
    raise AReaLUnsupported(f"areal: {fid}: {why} (AReaL 1.0.4 has no such option)")


_param = spec_param   # a spec parameter's value, defaulted, as the framework's config holds it


_NULL_ONLY_WHY = {
    "log_ratio_clamp": "AReaL never clamps the log-ratio",
    "log_ratio_max": "AReaL never caps the sequence log-ratio",
    "log_ratio_min": "KLEstimator has no input clamp",
    "is_log_ratio_clamp": "apply_rejection_sampling never clamps the log-ratio",
    "opsm_delta": "AReaL has no off-policy sequence mask",
    "entropy_quantile": "AReaL has no entropy-quantile token mask",
}


def _require_null(params, fid, *names):
    for n in names:
        if _param(params, fid, n) is not None:
            why = _NULL_ONLY_WHY.get(n, "no AReaL counterpart")
            _unsupported(fid, f"{n}={params.get(n)!r}: {why}; only null is expressible")


def _token_advantages(adv, like):
    return adv.unsqueeze(-1).expand_as(like) if adv.dim() == 1 else adv


def _compute(x):
    """bfloat16/float16 storage is computed in float32, as AReaL's engines produce float32
    log-probs (``log_softmax(logits.float())``) and the tolerance model defines bfloat16 runs."""
    import torch

    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _n0(mask):
    """AReaL's denominator: ``loss_mask.count_nonzero() or 1``."""
    return int(mask.count_nonzero()) or 1


def _grad_of_token_sum(loss, n0, x):
    """The VJP of the per-token losses with the case's cotangent c (pgspec.adapters.base.current_cotangent)
    w.r.t. x, from AReaL's scalar sum/N0: its gradient seeded with N0 is d(sum of unmasked per-token
    losses)/dx, and at token level AReaL computes each token's loss from that token's log-prob alone
    (elementwise: exp(l_t - l_old_t), its clamp, max/min with the token's advantage, or SAPO's gate), so
    the Jacobian is diagonal and the VJP is c_t times that gradient at each token."""
    import torch

    if not loss.requires_grad:  # called under torch.no_grad() (the finite-difference objective)
        return None
    (g,) = torch.autograd.grad(loss, [x], grad_outputs=torch.full_like(loss, float(n0)), allow_unused=True)
    g = torch.zeros_like(x) if g is None else g
    return g * current_cotangent(like=g)


def _with_grad(out, name, g):
    """Attach {"grad": {name: g}} unless no gradient could be formed (no autograd graph)."""
    if g is not None:
        out["grad"] = {name: g}
    return out


# ----------------------------------------------------------------------------------- surrogates

def _ppo(fid):
    def run(inputs, params):
        from areal.utils.functional import ppo_actor_loss_fn

        _require_null(params, fid, "log_ratio_clamp")
        lp, old, m = _compute(inputs["logprobs"]), _compute(inputs["old_logprobs"]), inputs["mask"]
        c = _param(params, fid, "c") if fid == "surrogate.dual_clip" else None
        loss, stat = ppo_actor_loss_fn(
            logprobs=lp, proximal_logprobs=old, old_logprobs=old,
            advantages=_token_advantages(_compute(inputs["advantages"]), lp),
            eps_clip=_param(params, fid, "eps_low"), loss_mask=m,
            eps_clip_higher=_param(params, fid, "eps_high"), c_clip=c,
            importance_sampling_level="token",
        )
        return _with_grad({"loss": stat["loss"]}, "logprobs", _grad_of_token_sum(loss, _n0(m), lp))

    run.__name__ = fid.replace(".", "_")
    return run


def surrogate_gspo(inputs, params):
    """One AReaL call per sequence: the token mean of a row is its sequence loss."""
    import torch
    from areal.utils.functional import ppo_actor_loss_fn

    fid = "surrogate.gspo"
    _require_null(params, fid, "log_ratio_max")
    lp, old, m = _compute(inputs["logprobs"]), _compute(inputs["old_logprobs"]), inputs["mask"]
    adv = _compute(inputs["advantages"])
    if adv.dim() != 1:
        _unsupported(fid, "surrogate.gspo takes one advantage per sequence")
    B, T = lp.shape
    values, total = [], None
    c = current_cotangent(like=lp.new_zeros((B,)))
    for i in range(B):
        row_lp, row_old, row_m = lp[i:i + 1], old[i:i + 1], m[i:i + 1]
        loss, stat = ppo_actor_loss_fn(
            logprobs=row_lp, proximal_logprobs=row_old, old_logprobs=row_old,
            advantages=adv[i:i + 1].unsqueeze(-1).expand(1, T),
            eps_clip=_param(params, fid, "eps_low"), loss_mask=row_m,
            eps_clip_higher=_param(params, fid, "eps_high"),
            importance_sampling_level="sequence",
        )
        if bool(row_m.any()):
            first = int(row_m[0].nonzero()[0, 0])
            values.append(stat["loss"][0, first])
        else:
            values.append(loss.detach())
        # the VJP with the cotangent (one value per sequence): the rows' losses weighted by c_i
        weighted = loss * c[i]
        total = weighted if total is None else total + weighted
    value = torch.stack(values) if values else lp.new_zeros((0,))
    grad = torch.zeros_like(lp)
    if total is not None:
        if not total.requires_grad:  # under torch.no_grad(): no gradient to report
            return {"loss": value}
        (grad,) = torch.autograd.grad(total, [lp], allow_unused=True)
        grad = torch.zeros_like(lp) if grad is None else grad
    return {"loss": value, "grad": {"logprobs": grad}}


def surrogate_sapo(inputs, params):
    from areal.utils.functional import sapo_loss_fn

    fid = "surrogate.sapo"
    _require_null(params, fid, "log_ratio_clamp")
    lp, m = _compute(inputs["logprobs"]), inputs["mask"]
    loss, stat = sapo_loss_fn(
        logprobs=lp, old_logprobs=_compute(inputs["old_logprobs"]),
        advantages=_token_advantages(_compute(inputs["advantages"]), lp),
        tau_pos=_param(params, fid, "tau_pos"), tau_neg=_param(params, fid, "tau_neg"),
        loss_mask=m, importance_sampling_level="token",
    )
    return _with_grad({"loss": stat["loss"]}, "logprobs", _grad_of_token_sum(loss, _n0(m), lp))


# ------------------------------------------------------------------------------------------- kl

def _masked(x, mask):
    """AReaL's own preprocessing before KLEstimator: ``old_logp *= loss_mask``, ``ref_logp *= loss_mask``
    (trainer/ppo/actor.py#L195-L196), a product, so NaN/inf at a masked position stays NaN."""
    return x * mask.to(x.dtype)


def _kl(fid):
    estimator = fid.split(".")[1]

    def run(inputs, params):
        from areal.utils.data import KLEstimator

        _require_null(params, fid, "log_ratio_min", "log_ratio_max")
        lo, hi = _param(params, fid, "output_min"), _param(params, fid, "output_max")
        if (lo, hi) == (None, None):
            clamp = False
        elif (lo, hi) == (-10.0, 10.0):
            clamp = True
        else:
            _unsupported(fid, f"output clamp [{lo}, {hi}]: KLEstimator's apply_clamp is [-10, 10] or none")
        m = inputs["mask"]
        # AReaL: log_probs - log_probs_base = l - l_ref = -x
        kl = KLEstimator(estimator, apply_clamp=clamp)(_masked(inputs["logprobs"], m), _masked(inputs["ref_logprobs"], m))
        return {"kl": kl}

    run.__name__ = fid.replace(".", "_")
    return run


# ------------------------------------------------------------------------------------------- is

def _augment_empty(old, mu, mask):
    """Give every empty row one on-policy token at position 0 (x = 0), so that AReaL's per-sequence
    value of that row (computed internally from a zero sum over a count clamped to 1) is readable
    at a token.  Rows are independent in every ``is`` formula; the added token is masked in the
    case, so it is never compared."""
    import torch

    empty = ~mask.any(-1)
    if not bool(empty.any()) or mask.shape[-1] == 0:
        return old, mu, mask
    pos = torch.zeros_like(mask)
    pos[:, 0] = empty
    zero = torch.zeros((), dtype=old.dtype, device=old.device)
    return torch.where(pos, zero, old), torch.where(pos, zero, mu), mask | pos


def _first_token(x, mask):
    """x[i, first unmasked t] per row (mask after _augment_empty: every row has one)."""
    import torch

    if x.shape[-1] == 0:
        return x.new_zeros(x.shape[:1])
    first = mask.to(torch.int8).argmax(-1, keepdim=True)
    return x.gather(-1, first).squeeze(-1)


def _rs(old, mu, mask, fid, *, level, action, metric="ratio", upper=None, lower=None, agg="mean"):
    from areal.api.cli_args import RejectionSamplingConfig
    from areal.utils.functional import apply_rejection_sampling

    try:
        config = RejectionSamplingConfig(level=level, action=action, metric=metric, agg=agg,
                                         upper=math.inf if upper is None else upper, lower=lower)
    except ValueError as e:
        _unsupported(fid, f"RejectionSamplingConfig refuses these bounds: {e}")
    return apply_rejection_sampling(proximal_logprobs=old, old_logprobs=mu, loss_mask=mask,
                                    cu_seqlens=None, config=config)


def _is(fid):
    _, level_name, mode = fid.split(".")
    level = "token" if level_name == "token" else "sequence"
    action = "clamp" if mode == "truncate" else "mask"

    def run(inputs, params):
        _require_null(params, fid, "log_ratio_clamp")
        lo, hi = _param(params, fid, "c_min"), _param(params, fid, "c_max")
        old, mu, m = _augment_empty(inputs["old_logprobs"], inputs["sampler_logprobs"], inputs["mask"])
        res = _rs(old, mu, m, fid, level=level, action=action, upper=hi, lower=lo)
        # rho itself: AReaL's weight under bounds that never bind
        rho = _rs(old, mu, m, fid, level=level, action="clamp", upper=None, lower=None).behave_imp_weight
        out = {"weight": res.behave_imp_weight}
        if action == "mask":
            out["keep"] = res.loss_mask.bool()
        if level == "token":
            out["ratio"] = rho
        else:
            out["seq_weight"] = _first_token(res.behave_imp_weight, m)
            out["seq_ratio"] = _first_token(rho, m)
            if action == "mask":
                out["seq_keep"] = _first_token(res.loss_mask.bool(), m)
        return out

    run.__name__ = fid.replace(".", "_")
    return run


_REJECT_LEVELS = {"token": ("token", "mean"), "seq_sum": ("sequence", "sum"),
                  "seq_mean": ("sequence", "mean"), "seq_max": ("sequence", "max")}


def is_reject(inputs, params):
    """AReaL's kl_k* rejection.  keep/seq_keep are AReaL's decision; token_stat is AReaL's metric
    (the very ``KLEstimator._compute_approx_kl(..., apply_clamp=False)`` call that
    apply_rejection_sampling makes); seq_stat, which AReaL keeps internal, is that token metric
    reduced the way apply_rejection_sampling reduces it (masked sum; sum / max(count, 1); masked
    max, 0 for an empty row)."""
    import torch
    from areal.utils.data import KLEstimator

    fid = "is.reject"
    _require_null(params, fid, "log_ratio_clamp")
    if _param(params, fid, "direction") != "old_mu":
        _unsupported(fid, "direction 'mu_old': AReaL's metric is always of log(pi_prox / pi_behave) ('old_mu')")
    est = _param(params, fid, "estimator")
    level, agg = _REJECT_LEVELS[_param(params, fid, "level")]
    old, mu, m = _augment_empty(inputs["old_logprobs"], inputs["sampler_logprobs"], inputs["mask"])
    res = _rs(old, mu, m, fid, level=level, action="mask", metric=f"kl_{est}",
              upper=_param(params, fid, "upper"), lower=_param(params, fid, "lower"), agg=agg)
    d = KLEstimator._compute_approx_kl(log_probs=old.detach(), log_probs_base=mu.detach(),
                                       kl_estimator=est, apply_clamp=False)
    keep = res.loss_mask.bool()
    if agg == "max":
        seq = d.masked_fill(~m, float("-inf")).amax(-1) if d.shape[-1] else d.new_zeros(d.shape[:1])
        seq = torch.where(m.any(-1), seq, torch.zeros_like(seq))
    else:
        seq = torch.where(m, d, torch.zeros_like(d)).sum(-1)
        if agg == "mean":
            seq = seq / m.sum(-1).clamp(min=1)
    return {"keep": keep, "token_stat": d, "seq_stat": seq, "seq_keep": _first_token(keep, m)}


# ------------------------------------------------------------------------------------------ adv

def _groups(group_ids):
    """{group id: [row, ...]} in order of first appearance."""
    rows: dict[int, list[int]] = {}
    for k, g in enumerate(int(g) for g in group_ids.tolist()):
        rows.setdefault(g, []).append(k)
    return rows


def _adv(fid):
    def run(inputs, params):
        import torch
        from areal.api.cli_args import NormConfig
        from areal.utils.data import Normalization

        if _param(params, fid, "singleton") != "zero":
            _unsupported(fid, "singleton 'mean0_std1': AReaL's group of one gets mean = R, so A = 0 ('zero')")
        if fid != "adv.group_centered":
            if _param(params, fid, "eps_placement") != "std":
                _unsupported(fid, "eps_placement 'variance': AReaL divides by std + eps")
            unbiased = _param(params, fid, "std") == "bessel"
            eps = _param(params, fid, "eps")
        if fid == "adv.batch_normalized" and _param(params, fid, "std_of") != "centered":
            _unsupported(fid, "std_of 'rewards': AReaL's batch std is taken about the group means")
        rewards = inputs["rewards"]
        if rewards.dtype in (torch.bfloat16, torch.float16):
            rewards = rewards.float()  # AReaL keeps rewards in float32
        std_level = {"adv.group_normalized": "group", "adv.batch_normalized": "batch", "adv.group_centered": None}[fid]

        def normalize(rows, n):
            """AReaL's Normalization of these rows, laid out as contiguous groups of n."""
            kw = dict(mean_level="group", std_level=std_level, group_size=n)
            if std_level is not None:
                kw.update(std_unbiased=unbiased, eps=eps)
            idx = torch.tensor(rows, dtype=torch.long, device=rewards.device)
            out[idx] = Normalization(NormConfig(**kw))(rewards[idx])

        groups = _groups(inputs["group_ids"])
        out = torch.empty(rewards.shape, dtype=torch.float32, device=rewards.device)  # Normalization returns .float()
        sizes = sorted({len(r) for r in groups.values()})
        if len(sizes) <= 1:
            # one group size n: the batch as AReaL's rollout lays it out (n answers per prompt)
            normalize([k for r in groups.values() for k in r], sizes[0] if sizes else 1)
        elif std_level == "batch":
            # the batch std couples the groups, and AReaL's batches hold one group size
            _unsupported(fid, f"group sizes {sizes}: AReaL's NormConfig.group_size fixes one group size")
        else:
            # group-level statistics: each group is normalized on its own, exactly as AReaL normalizes a
            # batch of groups of that size (a batch of mixed sizes never reaches Normalization)
            for rows in groups.values():
                normalize(rows, len(rows))
        return {"advantages": out}

    run.__name__ = fid.replace(".", "_")
    return run


# ----------------------------------------------------------------------------------------- loss

def _loss(fid):
    def run(inputs, params):
        from areal.utils.functional import ppo_actor_loss_fn

        _require_null(params, fid, "log_ratio_clamp", "is_log_ratio_clamp", "opsm_delta", "entropy_quantile")
        if _param(params, fid, "beta") != 0:
            _unsupported(fid, "beta != 0: AReaL's KL enters the reward, not the actor loss")
        if fid == "loss.dapo" and _param(params, fid, "aggregation") != "token_mean":
            # with one prompt group holding tokens the prompt mean is the batch token mean
            g = inputs.get("group_ids")
            if g is None or len(set(g[inputs["mask"].any(-1)].tolist())) > 1:
                _unsupported(fid, "aggregation 'prompt_mean' over several prompt groups: ppo_actor_loss_fn is a "
                                  "batch token mean")
        lp, old, m = _compute(inputs["logprobs"]), _compute(inputs["old_logprobs"]), inputs["mask"]
        is_level = _param(params, fid, "is_level")
        rs, behave = None, old
        if is_level != "none":
            from areal.api.cli_args import RejectionSamplingConfig

            if is_level == "sequence":
                _unsupported(fid, "is_level 'sequence': AReaL's sequence-level ratio weight is the geometric mean")
            hi, lo = _param(params, fid, "is_c_max"), _param(params, fid, "is_c_min")
            try:
                rs = RejectionSamplingConfig(level="token" if is_level == "token" else "sequence", agg="mean",
                                             action="clamp" if _param(params, fid, "is_mode") == "truncate" else "mask",
                                             metric="ratio", upper=math.inf if hi is None else hi, lower=lo)
            except ValueError as e:
                _unsupported(fid, f"RejectionSamplingConfig refuses these bounds: {e}")
            behave = _compute(inputs["sampler_logprobs"])
        loss, stat = ppo_actor_loss_fn(
            logprobs=lp, proximal_logprobs=old, old_logprobs=behave,
            advantages=_token_advantages(_compute(inputs["advantages"]), lp),
            eps_clip=_param(params, fid, "eps_low"), loss_mask=m,
            eps_clip_higher=_param(params, fid, "eps_high"), rejection_sampling=rs,
            importance_sampling_level="token",
        )
        return {"loss": loss, "terms": stat["loss"]}

    run.__name__ = fid.replace(".", "_")
    return run


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": _ppo("surrogate.ppo_clip"),
    "surrogate.dual_clip": _ppo("surrogate.dual_clip"),
    "surrogate.gspo": surrogate_gspo,
    "surrogate.sapo": surrogate_sapo,
    "kl.k1": _kl("kl.k1"),
    "kl.k2": _kl("kl.k2"),
    "kl.k3": _kl("kl.k3"),
    "is.token.truncate": _is("is.token.truncate"),
    "is.token.mask": _is("is.token.mask"),
    "is.geometric.truncate": _is("is.geometric.truncate"),
    "is.geometric.mask": _is("is.geometric.mask"),
    "is.reject": is_reject,
    "adv.group_normalized": _adv("adv.group_normalized"),
    "adv.group_centered": _adv("adv.group_centered"),
    "adv.batch_normalized": _adv("adv.batch_normalized"),
    "loss.bnpo": _loss("loss.bnpo"),
    "loss.dapo": _loss("loss.dapo"),
}


def _installed_version():
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DIST_NAME)
    except PackageNotFoundError:
        return None


class AReaLAdapter(Adapter):
    framework_modules = ("areal",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    def available(self):
        if importlib.util.find_spec("areal") is None:
            return False, ("AReaL is not installed in this interpreter (a plain pip install fails): in the pgspec "
                           "checkout, bash ci/install-areal.sh VENV, then VENV/bin/pgspec run --adapter areal "
                           "(adapters/areal/README.md)")
        try:
            import areal.utils.functional  # noqa: F401  (AReaL's package __init__ pulls ray, transformers, ...)
        except Exception as e:  # noqa: BLE001
            return False, f"AReaL is installed but does not import: {type(e).__name__}: {e}"
        return True, ""


COMPILE_MODES = ("eager", "default")


def compile_mode() -> str:
    mode = os.environ.get("PGSPEC_AREAL_COMPILE", "eager")
    if mode not in COMPILE_MODES:
        raise ValueError(f"PGSPEC_AREAL_COMPILE must be one of {COMPILE_MODES}, got {mode!r}")
    return mode


def _without_dynamo(fn):
    """``fn`` with TorchDynamo disabled for the call: a ``torch.compile``d function reached from it
    runs its Python body eagerly (no graph is compiled, so none is reused with a stale float)."""

    @functools.wraps(fn)
    def run(inputs, params):
        import torch

        with torch._dynamo.config.patch(disable=True):
            return fn(inputs, params)

    return run


def make_adapter() -> Adapter:
    mode = compile_mode()
    impls = dict(IMPLEMENTATIONS) if mode == "default" else {k: _without_dynamo(v) for k, v in IMPLEMENTATIONS.items()}
    version = _installed_version() or "not installed"
    return AReaLAdapter(
        name="areal",
        framework=FRAMEWORK,
        version=version if mode == "eager" else f"{version}; torch.compile mode {mode}",
        devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16"),
        implementations=impls,
        param_map={k: dict(v) for k, v in PARAM_MAP.items()},
        deviations=load_deviations(Path(__file__).with_name("deviations.toml")),
    )
