"""loss.* in PyTorch (spec/loss.md): the recipes composed from the other torch families.

Every recipe is written the way a trainer's ``_compute_loss`` is (TRL, verl): a per-token policy
loss from ``surrogate`` (a per-sequence loss such as GSPO's is broadcast to its tokens), the
sequence and token masks of ``mask`` (OPSM, entropy top-quantile) and the train/inference weight
of ``is`` applied to it, ``beta`` times a ``kl`` estimator added, and the ``agg`` aggregator over
the input mask:

    term = M^opsm * M^ent * w^IS.detach() * pg + beta * kl,    loss = Agg(term, mask)

Nothing is re-derived here; each piece is the family module's own function.  Three choices, all
the spec's (spec/loss.md, "The common structure"):

* a dropped token (OPSM, entropy mask, IS mask with weight 0) gets the constant 0 by
  ``torch.where``, not a product with 0: an infinite policy term there (a ratio of e^200 in
  float32) would otherwise become NaN, and the token keeps its place in the denominator because the
  aggregator sees the input mask;
* the KL term is added after the factors (it is never masked or IS-weighted) and is aggregated
  with the policy term, or by its own aggregator when ``kl_aggregation`` is not 'policy' (slime);
* the IS weight, the OPSM statistic and the masks are computed from detached log-probs.

Parameters are read by their spec names with the reference registry's defaults.
"""

from __future__ import annotations

import torch

from pgspec.reference import REGISTRY

from . import agg as tagg
from . import is_ as tis
from . import kl as tkl
from . import mask as tmask
from . import surrogate as tsur

OPTION_NAMES = ("is_level", "is_mode", "is_c_min", "is_c_max", "is_log_ratio_clamp", "opsm_delta", "opsm_advantage_gate",
                "entropy_quantile", "beta", "kl_estimator", "kl_log_ratio_min", "kl_log_ratio_max",
                "kl_output_min", "kl_output_max", "kl_sg_ratio_where_clamped", "kl_aggregation")


def _param(fid, params, name):
    """``params[name]`` as given, else the spec default of ``fid`` (choices, bools and None unchanged)."""
    if name in params:
        return params[name]
    return next(p.default for p in REGISTRY[fid].params if p.name == name)


def _real(fid, params, name):
    value = _param(fid, params, name)
    return None if value is None else float(value)


def _options(fid, params):
    return {name: _param(fid, params, name) for name in OPTION_NAMES}


# the factors ------------------------------------------------------------------------------------

def _check_inputs(fid, inputs, opts, *, needs_groups=False, sampler_required=False, sampler_folded=False):
    """Each enabled option needs its input; an input that nothing reads is refused (spec/loss.md, Inputs)."""
    has = lambda name: inputs.get(name) is not None  # noqa: E731
    uses_sampler = opts["is_level"] != "none" or opts["opsm_delta"] is not None
    beta = float(opts["beta"])
    needed = {
        "sampler_logprobs": (uses_sampler or sampler_required, uses_sampler or sampler_required or sampler_folded),
        "ref_logprobs": (beta > 0, beta > 0),
        "group_ids": (needs_groups, needs_groups),
        "entropy": (opts["entropy_quantile"] is not None, opts["entropy_quantile"] is not None),
    }
    for name, (required, allowed) in needed.items():
        if required and not has(name):
            raise ValueError(f"{fid}: missing input {name!r}, which the chosen options need")
        if has(name) and not allowed:
            raise ValueError(f"{fid}: input {name!r} was given but no enabled option reads it")


def is_weight(opts, inputs):
    """w^IS [B, T] of is.<level>.<mode> (a constant), or None when is_level is 'none'."""
    level = opts["is_level"]
    if level == "none":
        return None
    impl = tis.IMPLEMENTATIONS[f"is.{level}.{opts['is_mode']}"]
    bounds = {"c_min": opts["is_c_min"], "c_max": opts["is_c_max"], "log_ratio_clamp": opts["is_log_ratio_clamp"]}
    return impl(inputs, bounds)["weight"].detach()


def opsm_keep(opts, inputs):
    """M^opsm [B, T] of mask.opsm on sg[l] (its advantage_gate), or None when opsm_delta is null."""
    if opts["opsm_delta"] is None:
        return None
    sub = {"logprobs": inputs["logprobs"].detach(), "sampler_logprobs": inputs["sampler_logprobs"],
           "advantages": inputs["advantages"], "mask": inputs["mask"]}
    return tmask.opsm(sub, {"delta": opts["opsm_delta"], "advantage_gate": opts["opsm_advantage_gate"]})["keep"]


def entropy_keep(opts, inputs):
    """M^ent [B, T] of mask.entropy_quantile, or None when entropy_quantile is null."""
    if opts["entropy_quantile"] is None:
        return None
    sub = {"entropy": inputs["entropy"], "mask": inputs["mask"]}
    return tmask.entropy_quantile(sub, {"top_entropy_quantile": opts["entropy_quantile"]})["keep"]


def kl_term(opts, inputs):
    """kl_{i,t} [B, T] of the kl_estimator with its clamps, or None when beta = 0."""
    if float(opts["beta"]) == 0:
        return None
    est = opts["kl_estimator"]
    kl_params = {"log_ratio_min": opts["kl_log_ratio_min"], "log_ratio_max": opts["kl_log_ratio_max"],
                 "output_min": opts["kl_output_min"], "output_max": opts["kl_output_max"]}
    if est == "k3_unbiased":
        kl_params["sg_ratio_where_clamped"] = opts["kl_sg_ratio_where_clamped"]
    return tkl.IMPLEMENTATIONS[f"kl.{est}"](inputs, kl_params)["kl"]


def compose(fid, inputs, params, pg, aggregate, *, needs_groups=False, sampler_required=False,
            sampler_folded=False):
    """term = M^opsm M^ent sg[w^IS] pg + beta kl;  loss = aggregate(term).

    ``pg`` is the [B, T] policy term; ``aggregate(values, mask)`` an agg.* call.  A dropped token's
    policy term is the selected constant 0 (it stays in the aggregator's denominator).
    """
    opts = _options(fid, params)
    _check_inputs(fid, inputs, opts, needs_groups=needs_groups, sampler_required=sampler_required,
                  sampler_folded=sampler_folded)
    zero = torch.zeros((), dtype=pg.dtype, device=pg.device)
    w = is_weight(opts, inputs)
    if w is not None:
        pg = torch.where(w == 0, zero, pg * w)  # w = 1 leaves pg as it is; w = 0 is a drop
    drop = None
    keep_opsm = opsm_keep(opts, inputs)
    if keep_opsm is not None:
        drop = ~keep_opsm.expand(pg.shape)
    keep_tok = entropy_keep(opts, inputs)
    if keep_tok is not None:
        drop = ~keep_tok if drop is None else drop | ~keep_tok
    if drop is not None:
        pg = torch.where(drop, zero, pg)
    term = pg
    kl = kl_term(opts, inputs)
    if kl is not None:
        term = pg + float(opts["beta"]) * kl
        if opts["kl_aggregation"] != "policy":   # slime: the KL keeps its own aggregator
            kl_agg = _agg(f"agg.{opts['kl_aggregation']}")
            loss = aggregate(pg, inputs["mask"]) + float(opts["beta"]) * kl_agg(kl, inputs["mask"])
            return {"loss": loss, "terms": term}
    return {"loss": aggregate(term, inputs["mask"]), "terms": term}


# aggregators --------------------------------------------------------------------------------------

def _agg(agg_id, agg_params=None, **ids):
    impl = tagg.IMPLEMENTATIONS[agg_id]
    return lambda values, mask: impl({"values": values, "mask": mask, **ids}, agg_params or {})["value"]


def _prompt_or_token_mean(aggregation, inputs):
    if aggregation == "prompt_mean":
        return _agg("agg.prompt_mean", group_ids=inputs.get("group_ids"))
    return _agg("agg.token_mean")


def _broadcast(seq_loss, mask):
    """A per-sequence loss [B] at every token of its row [B, T]."""
    return seq_loss.unsqueeze(-1).expand(mask.shape)


def _ppo(fid, inputs, params, clamp_name="log_ratio_clamp"):
    sub = {"eps_low": _real(fid, params, "eps_low"), "eps_high": _real(fid, params, "eps_high"),
           "log_ratio_clamp": _real(fid, params, clamp_name) if clamp_name else None}
    return tsur.ppo_clip(inputs, sub)["loss"]


def _gspo_seq(fid, inputs, params, cap_name="log_ratio_max", clamp_name="log_ratio_clamp"):
    sub = {"eps_low": _real(fid, params, "eps_low"), "eps_high": _real(fid, params, "eps_high"),
           "log_ratio_max": _real(fid, params, cap_name) if cap_name else None,
           "log_ratio_clamp": _real(fid, params, clamp_name) if clamp_name else None}
    return tsur.gspo(inputs, sub)["loss"]


# the recipes ------------------------------------------------------------------------------------

def grpo(inputs, params):
    fid = "loss.grpo"
    return compose(fid, inputs, params, _ppo(fid, inputs, params), _agg("agg.sample_mean"))


def dapo(inputs, params):
    fid = "loss.dapo"
    aggregation = _param(fid, params, "aggregation")
    return compose(fid, inputs, params, _ppo(fid, inputs, params), _prompt_or_token_mean(aggregation, inputs),
                   needs_groups=aggregation == "prompt_mean")


def dr_grpo(inputs, params):
    fid = "loss.dr_grpo"
    agg_params = {"divisor": _param(fid, params, "divisor"), "divide_by": _param(fid, params, "divide_by")}
    return compose(fid, inputs, params, _ppo(fid, inputs, params), _agg("agg.constant", agg_params))


def bnpo(inputs, params):
    fid = "loss.bnpo"
    return compose(fid, inputs, params, _ppo(fid, inputs, params), _agg("agg.token_mean"))


def gspo(inputs, params):
    fid = "loss.gspo"
    pg = _broadcast(_gspo_seq(fid, inputs, params), inputs["mask"])
    return compose(fid, inputs, params, pg, _agg("agg.sample_mean"))


def cispo(inputs, params):
    fid = "loss.cispo"
    cap_form = _param(fid, params, "cap_form")
    if cap_form != "relative" and _param(fid, params, "eps_low") is not None:
        raise ValueError("loss.cispo: parameter 'eps_low' applies only to cap_form='relative'")
    sub = {"cap_form": cap_form, "eps_low": _real(fid, params, "eps_low"), "eps_high": _real(fid, params, "eps_high"),
           "log_ratio_clamp": _real(fid, params, "log_ratio_clamp")}
    aggregation = _param(fid, params, "aggregation")
    return compose(fid, inputs, params, tsur.cispo(inputs, sub)["loss"], _prompt_or_token_mean(aggregation, inputs),
                   needs_groups=aggregation == "prompt_mean")


def sapo(inputs, params):
    fid = "loss.sapo"
    sub = {name: _real(fid, params, name) for name in ("tau_pos", "tau_neg", "log_ratio_clamp")}
    return compose(fid, inputs, params, tsur.sapo(inputs, sub)["loss"], _agg("agg.sample_mean"))


def gmpo(inputs, params):
    fid = "loss.gmpo"
    sub = {"eps_low": _real(fid, params, "eps_low"), "eps_high": _real(fid, params, "eps_high")}
    pg = _broadcast(tsur.gmpo(inputs, sub)["loss"], inputs["mask"])
    return compose(fid, inputs, params, pg, _agg("agg.sample_mean"))


def luspo(inputs, params):
    fid = "loss.luspo"
    if _param(fid, params, "ratio_level") == "sequence":
        pg = _broadcast(_gspo_seq(fid, inputs, params, cap_name=None, clamp_name=None), inputs["mask"])
    else:
        pg = _ppo(fid, inputs, params, clamp_name=None)
    return compose(fid, inputs, params, pg, _agg("agg.seq_mean_token_sum"))


VESPO_PARAMS = ("k_pos", "lambda_pos", "k_neg", "lambda_neg", "lambda_min", "log_ratio_clamp", "min_weight",
                "max_log_weight")


def vespo(inputs, params):
    """The sampler log-probs, when given, are folded into phi_i by surrogate.vespo (TRL), never as w^IS."""
    fid = "loss.vespo"
    if _param(fid, params, "is_level") != "none":
        raise ValueError("loss.vespo: parameter 'is_level' must be 'none' (VESPO folds the sampler ratio into phi)")
    sub = {name: _real(fid, params, name) for name in VESPO_PARAMS}
    return compose(fid, inputs, params, tsur.vespo(inputs, sub)["loss"], _agg("agg.token_mean"),
                   sampler_folded=True)


def minirl(inputs, params):
    """-M_t sg[min(e^(l - l^mu), C)] A l: decoupled-PPO token mask on r = e^(l - l_old), the TIS weight
    of the current policy over the sampler (is truncation), the REINFORCE form of surrogate.cispo."""
    fid = "loss.minirl"
    eps_low, eps_high, cap = (_real(fid, params, n) for n in ("eps_low", "eps_high", "is_cap"))
    a = tsur.token_advantages(inputs)
    r = torch.exp(tsur.log_ratio(inputs, detach=True))
    keep = ~(((a > 0) & (r > 1 + eps_high)) | ((a < 0) & (r < 1 - eps_low)))
    over_sampler = {**inputs, "old_logprobs": inputs["sampler_logprobs"]}
    w = tis.truncate_weight(torch.exp(tsur.log_ratio(over_sampler, detach=True)), None, cap)
    zero = torch.zeros((), dtype=a.dtype, device=a.device)
    # A = 0 selects a coefficient 0, never forms 0 * w: w = e^200 overflows float32 and bfloat16 (with no
    # cap), and 0 * inf would be NaN in the value and, through the product's backward, in the gradient
    coef = torch.where(a == 0, zero, -w.detach() * a)
    pg = coef * tsur._selected(inputs, "logprobs")
    pg = torch.where(keep, pg, torch.zeros((), dtype=pg.dtype, device=pg.device))
    return compose(fid, inputs, params, pg, _agg("agg.seq_mean_token_sum"), sampler_required=True)


IMPLEMENTATIONS = {
    "loss.grpo": grpo,
    "loss.dapo": dapo,
    "loss.dr_grpo": dr_grpo,
    "loss.bnpo": bnpo,
    "loss.gspo": gspo,
    "loss.cispo": cispo,
    "loss.sapo": sapo,
    "loss.gmpo": gmpo,
    "loss.luspo": luspo,
    "loss.vespo": vespo,
    "loss.minirl": minirl,
}
