"""The verl adapter's implementations: every value comes from verl 0.9.1's own functions.

Each function takes the canonical inputs (padded [B, T] tensors, a boolean ``mask``) and the spec
parameters, builds the verl call (a minimal ``ActorConfig`` where the function wants one) and
returns the spec's outputs.  Nothing here re-implements a verl formula.  Three read-outs are used
where verl computes a quantity but does not return it (see README.md, "How values are read"):

- per-token policy losses: verl's loss functions aggregate internally with
  ``core_algos.agg_loss(loss_mat=...)``; the adapter wraps that module attribute for the duration of
  the call and keeps the ``loss_mat`` verl passed to it (the returned scalar is verl's unchanged);
- the rollout-correction helpers compute their statistics and raw weights but return only the
  final weights / mask; the adapter records the tensors they pass to their own metrics helpers
  (``compute_is_metrics``, ``compute_rs_metrics``);
- CISPO's stopped weight is read as verl's gradient at A = -1 (d(-sg(w) A l)/dl = w).

verl is imported lazily, inside the calls, so this module imports without verl installed.
"""

from __future__ import annotations

import contextlib
import math

import torch

from pgspec.reference import REGISTRY

TINY = 5e-324  # the smallest positive double: a ratio lower bound that can never bind
INF = float("inf")


from .errors import ParamUnsupported  # noqa: E402,F401 - raised here, and by loss.py


# spec parameter -> verl config name, per formula (documentation and reports; README.md has the table)
PARAM_MAP: dict[str, dict[str, str]] = {
    "surrogate.ppo_clip": {
        "eps_low": "actor.clip_ratio_low",
        "eps_high": "actor.clip_ratio_high",
        "log_ratio_clamp": "fixed: 20 (clamp of log_prob - old_log_prob in compute_policy_loss_vanilla)",
        "(dual clip)": "actor.clip_ratio_c = +inf (verl always dual-clips; +inf switches it off)",
    },
    "surrogate.dual_clip": {
        "eps_low": "actor.clip_ratio_low",
        "eps_high": "actor.clip_ratio_high",
        "c": "actor.clip_ratio_c",
        "log_ratio_clamp": "fixed: 20",
    },
    "surrogate.pg": {
        "form": "'logprob' -> policy_loss.loss_mode='gpg'; 'ratio' -> 'vanilla' with clip_ratio_low=1, "
                "clip_ratio_high=+inf, clip_ratio_c=+inf (no clipping)",
        "log_ratio_clamp": "fixed: 20 (form 'ratio'); none (form 'logprob')",
    },
    "surrogate.cispo": {
        "cap_form": "'relative' only (verl clamps to [1 - clip_ratio_low, 1 + clip_ratio_high])",
        "eps_low": "actor.clip_ratio_low (null -> 1.0, a lower bound of 0 that never binds)",
        "eps_high": "actor.clip_ratio_high",
        "log_ratio_clamp": "fixed: 20",
    },
    "surrogate.sapo": {
        "tau_pos": "actor.tau_pos",
        "tau_neg": "actor.tau_neg",
        "log_ratio_clamp": "fixed: 20",
    },
    "surrogate.gspo": {
        "eps_low": "actor.clip_ratio_low",
        "eps_high": "actor.clip_ratio_high",
        "log_ratio_max": "fixed: 10 (clamp of log s_i,t in compute_policy_loss_gspo)",
    },
    "surrogate.gmpo": {
        "eps_low": "actor.clip_ratio_low (policy_loss.loss_mode='geo_mean')",
        "eps_high": "actor.clip_ratio_high",
    },
    **{f"kl.{k}": {"(estimator)": f"kl_penalty(..., kl_penalty={v!r}) (actor.kl_loss_type / algorithm.kl_penalty)",
                   "log_ratio_min": v2, "log_ratio_max": v2, "output_min": v3, "output_max": v3}
       for k, v, v2, v3 in (("k1", "k1", "fixed: none", "fixed: none"),
                            ("k2", "k2", "fixed: none", "fixed: none"),
                            ("k3", "k3", "fixed: -20 / 20", "fixed: -10 / 10"),
                            ("abs", "abs", "fixed: none", "fixed: none"),
                            ("k3_straight_through", "k3+", "fixed: -20 / 20", "fixed: -10 / 10"))},
    "agg.token_mean": {
        "(mode)": "actor.loss_agg_mode='token-mean'",
        "num_tokens": "agg_loss(batch_num_tokens=...) (actor.global_batch_info)",
        "eps": "fixed: 0",
    },
    "agg.sample_mean": {
        "(mode)": "actor.loss_agg_mode='seq-mean-token-mean'",
        "num_sequences": "agg_loss(global_batch_size=...)",
        "count_empty_sequences": "true -> global_batch_size = B (as the trainer's ppo_mini_batch_size * n); "
                                 "false -> global_batch_size=None (verl counts non-empty rows)",
        "sequence_token_counts": "unsupported (must be null)",
        "eps_length": "fixed: 1e-8 added to an int64 count (rounds away in float32 for n >= 1)",
        "eps_count": "fixed: 0",
    },
    "agg.seq_mean_token_sum": {
        "(mode)": "actor.loss_agg_mode='seq-mean-token-sum'",
        "num_sequences": "agg_loss(global_batch_size=...)",
        "count_empty_sequences": "as agg.sample_mean",
    },
    "agg.constant": {
        "(mode)": "actor.loss_agg_mode='seq-mean-token-sum-norm'",
        "divisor": "agg_loss(loss_scale_factor=...) (actor.loss_scale_factor)",
        "divide_by": "'K*N' only",
        "num_sequences": "agg_loss(global_batch_size=...)",
        "count_empty_sequences": "as agg.sample_mean",
    },
    "adv.group_normalized": {
        "(estimator)": "compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=True) (algorithm.adv_estimator='grpo')",
        "std": "'bessel' only (torch.std)",
        "eps": "epsilon",
        "eps_placement": "'std' only (either form when eps = 0)",
        "singleton": "fixed: 'mean0_std1'",
    },
    "adv.group_centered": {
        "(estimator)": "compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False) "
                       "(algorithm.norm_adv_by_std_in_grpo=False, Dr.GRPO)",
        "singleton": "fixed: 'mean0_std1'",
    },
    "is.token.truncate": {
        "(level)": "rollout_correction.rollout_is='token'",
        "c_max": "rollout_is_threshold=<c_max> (a number: TIS; null -> inf)",
        "c_min": "unsupported (must be null: verl's TIS is upper-only)",
        "log_ratio_clamp": "fixed: 20 (SAFETY_BOUND)",
    },
    "is.token.mask": {
        "(level)": "rollout_correction.rollout_is='token'",
        "c_min": "rollout_is_threshold='<c_min>_<c_max>' (IcePop; null -> 5e-324)",
        "c_max": "the same string's upper bound (null -> inf)",
        "log_ratio_clamp": "fixed: 20",
    },
    "is.sequence.truncate": {
        "(level)": "rollout_correction.rollout_is='sequence'",
        "c_max": "rollout_is_threshold=<c_max>",
        "c_min": "unsupported (must be null)",
        "log_ratio_clamp": "fixed: 20 (on the sequence log-ratio sum)",
    },
    "is.sequence.mask": {
        "(level)": "rollout_correction.rollout_is='sequence'",
        "c_min": "rollout_is_threshold='<c_min>_<c_max>'",
        "c_max": "the same string's upper bound",
        "log_ratio_clamp": "fixed: 20",
    },
    "is.reject": {
        "estimator": "rollout_rs suffix _k1 / _k2 / _k3",
        "level": "rollout_rs prefix token_ / seq_sum_ / seq_mean_ / seq_max_ (no seq_max_k1)",
        "direction": "'mu_old' only (verl's log_ratio is old - rollout)",
        "lower": "k1 only: rollout_rs_threshold='<e^lower>_<e^upper>' (verl takes log of both: bounds on "
                 "k1 = -log rho, verl#6377); k2/k3: must be null",
        "upper": "k1: as above; k2/k3: rollout_rs_threshold=<upper> (must be > 0)",
        "log_ratio_clamp": "fixed: 20",
    },
    "mask.geometric_sequence": {
        "(option)": "rollout_rs='seq_mean_k1' (the geo_rs preset)",
        "lower": "rollout_rs_threshold='<1/upper>_<1/lower>': verl bounds k1 = -log g, so the bounds on g "
                 "are the reciprocals of verl's (verl#6377)",
        "upper": "as above",
        "numerator": "which log-probs form log_ratio (verl's log_ratio is an input)",
    },
}


def _param(params, fid, name):
    """A parameter by its spec name (registry default if absent); numbers as float."""
    value = params[name] if name in params else next(p.default for p in REGISTRY[fid].params if p.name == name)
    if value is None or isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _core():
    from verl.trainer.ppo import core_algos

    return core_algos


def _rc():
    from verl.trainer.ppo import rollout_corr_helper

    return rollout_corr_helper


def actor_config(**kw):
    """The smallest ActorConfig verl's loss functions accept (frozen: one per parameter set)."""
    from verl.workers.config import ActorConfig

    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)


@contextlib.contextmanager
def record(module, name):
    """Wrap ``module.name`` for the duration: calls pass through unchanged; (args, kwargs) recorded."""
    original = getattr(module, name)
    calls = []

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    setattr(module, name, wrapper)
    try:
        yield calls
    finally:
        setattr(module, name, original)


def _token_advantages(adv, like):
    return adv.unsqueeze(-1).expand_as(like) if adv.dim() == 1 else adv


def policy_loss(loss_mode, inputs, config, advantages=None, logprobs=None):
    """verl's registered policy loss; returns (per-token loss_mat as verl built it, verl's scalar)."""
    core = _core()
    fn = core.get_policy_loss_fn(loss_mode)
    logp = inputs["logprobs"] if logprobs is None else logprobs
    old = inputs.get("old_logprobs")
    if old is None:  # on-policy: verl's old_log_prob is the detached current log-prob
        old = logp.detach()
    adv = _token_advantages(inputs["advantages"] if advantages is None else advantages, logp)
    with record(core, "agg_loss") as calls:
        loss, _metrics = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=inputs["mask"],
                            loss_agg_mode="token-mean", config=config)
    if not calls:
        raise RuntimeError(f"verl policy loss {loss_mode!r} did not call agg_loss")
    return calls[-1][1]["loss_mat"], loss


# ---------------------------------------------------------------- surrogate.*

def ppo_clip(inputs, params):
    f = "surrogate.ppo_clip"
    cfg = actor_config(clip_ratio_low=_param(params, f, "eps_low"), clip_ratio_high=_param(params, f, "eps_high"),
                       clip_ratio_c=INF)
    return {"loss": policy_loss("vanilla", inputs, cfg)[0]}


def dual_clip(inputs, params):
    f = "surrogate.dual_clip"
    cfg = actor_config(clip_ratio_low=_param(params, f, "eps_low"), clip_ratio_high=_param(params, f, "eps_high"),
                       clip_ratio_c=_param(params, f, "c"))
    return {"loss": policy_loss("vanilla", inputs, cfg)[0]}


def pg(inputs, params):
    form = _param(params, "surrogate.pg", "form")
    if form == "logprob":
        return {"loss": policy_loss("gpg", inputs, actor_config())[0]}
    cfg = actor_config(clip_ratio_low=1.0, clip_ratio_high=INF, clip_ratio_c=INF)
    return {"loss": policy_loss("vanilla", inputs, cfg)[0]}


def cispo(inputs, params):
    f = "surrogate.cispo"
    if _param(params, f, "cap_form") != "relative":
        raise ParamUnsupported("verl's cispo clamps the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high]; "
                               "it has no absolute cap (cap_form='absolute')")
    eps_low = _param(params, f, "eps_low")
    cfg = actor_config(clip_ratio_low=1.0 if eps_low is None else eps_low, clip_ratio_high=_param(params, f, "eps_high"))
    loss = policy_loss("cispo", inputs, cfg)[0]
    # the stopped weight: verl's gradient of its own per-token loss at A = -1 is exactly w
    with torch.enable_grad():
        probe = inputs["logprobs"].detach().clone().requires_grad_(True)
        mat = policy_loss("cispo", inputs, cfg, advantages=-torch.ones_like(probe), logprobs=probe)[0]
        (w,) = torch.autograd.grad(torch.where(inputs["mask"], mat, torch.zeros_like(mat)).sum(), probe)
    return {"loss": loss, "weight": w}


def sapo(inputs, params):
    f = "surrogate.sapo"
    cfg = actor_config(tau_pos=_param(params, f, "tau_pos"), tau_neg=_param(params, f, "tau_neg"))
    return {"loss": policy_loss("sapo", inputs, cfg)[0]}


def gspo(inputs, params):
    """Per-sequence loss: verl's per-token GSPO loss (all tokens of a sequence carry the same value)
    averaged over the sequence's tokens, which also gives the spec's per-token gradient -A s_i / L_i."""
    f = "surrogate.gspo"
    cfg = actor_config(clip_ratio_low=_param(params, f, "eps_low"), clip_ratio_high=_param(params, f, "eps_high"))
    mat = policy_loss("gspo", inputs, cfg)[0]
    mask = inputs["mask"]
    total = torch.where(mask, mat, torch.zeros_like(mat)).sum(dim=-1)
    return {"loss": total / mask.sum(dim=-1).clamp(min=1).to(total.dtype)}


def gmpo(inputs, params):
    """verl's geo_mean returns the plain mean of its per-sequence losses: one call per sequence."""
    f = "surrogate.gmpo"
    cfg = actor_config(clip_ratio_low=_param(params, f, "eps_low"), clip_ratio_high=_param(params, f, "eps_high"))
    fn = _core().get_policy_loss_fn("geo_mean")
    logp, old, mask = inputs["logprobs"], inputs["old_logprobs"], inputs["mask"]
    adv = _token_advantages(inputs["advantages"], logp)
    rows = []
    for i in range(logp.shape[0]):
        loss, _ = fn(old_log_prob=old[i:i + 1], log_prob=logp[i:i + 1], advantages=adv[i:i + 1],
                     response_mask=mask[i:i + 1], loss_agg_mode="token-mean", config=cfg)
        rows.append(loss)
    return {"loss": torch.stack(rows) if rows else logp.new_zeros((0,))}


# ---------------------------------------------------------------- kl.*

# the clamps verl's kl_penalty applies, by estimator: (log_ratio_min, log_ratio_max, output_min, output_max)
KL_FIXED_CLAMPS = {"k1": (None, None, None, None), "k2": (None, None, None, None), "abs": (None, None, None, None),
                   "k3": (-20.0, 20.0, -10.0, 10.0), "k3+": (-20.0, 20.0, -10.0, 10.0)}


def _kl(name):
    fid = {"k1": "kl.k1", "k2": "kl.k2", "abs": "kl.abs", "k3": "kl.k3", "k3+": "kl.k3_straight_through"}[name]

    def run(inputs, params):
        for clamp, fixed in zip(("log_ratio_min", "log_ratio_max", "output_min", "output_max"), KL_FIXED_CLAMPS[name]):
            value = _param(params, fid, clamp)
            if value is not None and value != fixed:
                raise ParamUnsupported(f"verl's kl_penalty({name!r}) has {clamp} fixed at "
                                       f"{'none' if fixed is None else fixed}; {clamp}={value!r} cannot be configured")
        return {"kl": _core().kl_penalty(inputs["logprobs"], inputs["ref_logprobs"], name)}

    run.__name__ = f"kl_{name}"
    return run


# ---------------------------------------------------------------- agg.*

def _global_batch_size(fid, params, mask):
    n = _param(params, fid, "num_sequences")
    if n is not None:
        return int(n)
    if _param(params, fid, "count_empty_sequences"):
        return int(mask.shape[0])
    return None


def agg_token_mean(inputs, params):
    n = _param(params, "agg.token_mean", "num_tokens")
    value = _core().agg_loss(inputs["values"], inputs["mask"], "token-mean",
                             batch_num_tokens=None if n is None else int(n))
    return {"value": value}


def agg_sample_mean(inputs, params):
    f = "agg.sample_mean"
    if params.get("sequence_token_counts") is not None:
        raise ParamUnsupported("verl's seq-mean-token-mean divides each sequence by its local token count; "
                               "it takes no global per-sequence counts (sequence_token_counts)")
    value = _core().agg_loss(inputs["values"], inputs["mask"], "seq-mean-token-mean",
                             global_batch_size=_global_batch_size(f, params, inputs["mask"]))
    return {"value": value}


def agg_seq_mean_token_sum(inputs, params):
    f = "agg.seq_mean_token_sum"
    value = _core().agg_loss(inputs["values"], inputs["mask"], "seq-mean-token-sum",
                             global_batch_size=_global_batch_size(f, params, inputs["mask"]))
    return {"value": value}


def agg_constant(inputs, params):
    f = "agg.constant"
    if _param(params, f, "divide_by") != "K*N":
        raise ParamUnsupported("verl's seq-mean-token-sum-norm divides by the sequence count and the scale "
                               "factor (divide_by='K*N'); it has no divide_by='K'")
    value = _core().agg_loss(inputs["values"], inputs["mask"], "seq-mean-token-sum-norm",
                             global_batch_size=_global_batch_size(f, params, inputs["mask"]),
                             loss_scale_factor=_param(params, f, "divisor"))
    return {"value": value}


# ---------------------------------------------------------------- adv.*

def _grpo(inputs, eps, normalize):
    import numpy as np

    rewards = inputs["rewards"]
    index = np.asarray(inputs["group_ids"].detach().cpu().tolist())
    token_rewards = rewards.detach().unsqueeze(-1)
    response_mask = torch.ones_like(token_rewards)
    kwargs = {"norm_adv_by_std_in_grpo": normalize}
    if eps is not None:
        kwargs["epsilon"] = eps
    adv, _ = _core().compute_grpo_outcome_advantage(token_rewards, response_mask, index, **kwargs)
    return {"advantages": adv[:, 0]}


def adv_group_normalized(inputs, params):
    f = "adv.group_normalized"
    if _param(params, f, "std") != "bessel":
        raise ParamUnsupported("verl's GRPO advantage uses torch.std (Bessel); std='population' is not available")
    eps = _param(params, f, "eps")
    if _param(params, f, "eps_placement") != "std" and eps != 0:
        raise ParamUnsupported("verl adds epsilon to the std (eps_placement='std'), not to the variance")
    return _grpo(inputs, eps, True)


def adv_group_centered(inputs, params):
    return _grpo(inputs, None, False)


# ---------------------------------------------------------------- is.*

def _log_ratio(inputs, numerator="old_logprobs"):
    return inputs[numerator] - inputs["sampler_logprobs"]


def _num(x):
    return repr(float(x))


def _is_weights(log_ratio, mask, level, threshold):
    """verl's compute_rollout_correction_weights; also the raw (pre-truncation) weights it computed."""
    rc = _rc()
    with record(rc, "compute_is_metrics") as calls:
        weights, _ = rc.compute_rollout_correction_weights(log_ratio, mask, rollout_is=level,
                                                           rollout_is_threshold=threshold,
                                                           rollout_is_batch_normalize=False)
    return weights, calls[-1][1]["raw_rollout_is_weights"]


def _empty_rows_probe(log_ratio, mask):
    """For sequences without an unmasked token: the same rows with one unmasked token whose log-ratio is 0,
    so verl's per-sequence quantity for an empty (zero) sum can be read at that token."""
    empty = ~mask.any(dim=-1)
    if not bool(empty.any()) or mask.shape[-1] == 0:
        return None, empty
    probe_mask = mask.clone()
    probe_mask[empty, 0] = True
    probe_lr = log_ratio.clone()
    probe_lr[empty, 0] = 0
    return (probe_lr, probe_mask), empty


def _per_sequence(token_values, mask, probe_values, empty):
    """The value at each sequence's first unmasked token (verl broadcasts per-sequence values)."""
    first = torch.where(mask.any(dim=-1), mask.to(torch.int8).argmax(dim=-1), torch.zeros_like(mask[:, 0], dtype=torch.long))
    out = token_values.gather(-1, first.unsqueeze(-1)).squeeze(-1) if mask.shape[-1] else token_values.new_zeros(mask.shape[0])
    if probe_values is not None:
        out = torch.where(empty, probe_values[:, 0], out)
    return out


def _is_threshold(fid, params, mode):
    c_min, c_max = _param(params, fid, "c_min"), _param(params, fid, "c_max")
    if mode == "truncate":
        if c_min is not None:
            raise ParamUnsupported("verl's TIS threshold is an upper bound only (c_min must be null)")
        return INF if c_max is None else c_max
    lo = TINY if not c_min else c_min
    hi = INF if c_max is None else c_max
    return f"{_num(lo)}_{_num(hi)}"


def _is(level, mode):
    fid = f"is.{level}.{mode}"

    def run(inputs, params):
        threshold = _is_threshold(fid, params, mode)
        mask = inputs["mask"]
        lr = _log_ratio(inputs)
        weights, raw = _is_weights(lr, mask, level, threshold)
        out = {"weight": weights}
        if mode == "mask":
            out["keep"] = (weights != 0) & mask
        if level == "token":
            out["ratio"] = raw
            return out
        probe, empty = _empty_rows_probe(lr, mask)
        pw = praw = None
        if probe is not None:
            pw, praw = _is_weights(probe[0], probe[1], level, threshold)
        out["seq_weight"] = _per_sequence(weights, mask, pw, empty)
        out["seq_ratio"] = _per_sequence(raw, mask, praw, empty)
        if mode == "mask":
            out["seq_keep"] = out["seq_weight"] != 0
        return out

    run.__name__ = f"is_{level}_{mode}"
    return run


def _rejection(log_ratio, mask, option, threshold):
    """verl's compute_rollout_rejection_mask; also the statistics it computed for its metrics."""
    rc = _rc()
    with record(rc, "compute_rs_metrics") as calls:
        keep, _ = rc.compute_rollout_rejection_mask(log_ratio, mask, rollout_rs=option, rollout_rs_threshold=threshold)
    kwargs = calls[-1][1]
    return keep.bool() & mask, kwargs["rs_statistic"], kwargs["per_sequence_values"]


def _exp_bound(x, default):
    """A ratio-space bound U for verl, which compares k1 with math.log(U): the double nearest e^x whose
    log is exactly x when one exists (so a bound on the statistic stays closed and exact)."""
    if x is None:
        return default
    try:
        y = math.exp(x)
    except OverflowError:
        return INF
    if y == 0.0:
        return TINY
    candidates = [y]
    up = down = y
    for _ in range(4):
        up, down = math.nextafter(up, INF), math.nextafter(down, 0.0)
        candidates += [up, down]
    return next((c for c in candidates if c > 0 and math.log(c) == x), y)


def is_reject(inputs, params):
    f = "is.reject"
    est, level = _param(params, f, "estimator"), _param(params, f, "level")
    lower, upper = _param(params, f, "lower"), _param(params, f, "upper")
    if _param(params, f, "direction") != "mu_old":
        raise ParamUnsupported("verl's rejection statistics use log_ratio = old - rollout (direction 'mu_old')")
    if level == "seq_max" and est == "k1":
        raise ParamUnsupported("verl has no seq_max_k1 option")
    if est == "k1":
        # verl applies log() to both bounds of "L_U" and compares them with k1 = -log rho
        threshold = f"{_num(_exp_bound(lower, TINY))}_{_num(_exp_bound(upper, INF))}"
    else:
        if lower is not None:
            raise ParamUnsupported(f"verl's {est} rejection takes an upper bound only (lower must be null)")
        threshold = INF if upper is None else upper
    option = f"{level}_{est}"
    mask = inputs["mask"]
    lr = _log_ratio(inputs)
    keep, stat, seq_stat = _rejection(lr, mask, option, threshold)
    out = {"keep": keep}
    if level == "token":  # no sequence statistic at level token (the spec's are null there)
        nothing = torch.full(mask.shape[:1], float("nan"), dtype=stat.dtype, device=stat.device)
        out.update(token_stat=stat, seq_stat=nothing, seq_keep=torch.zeros_like(mask[:, 0]))
        return out
    # the per-token statistic comes from verl's token-level option (a bound that never binds)
    token_threshold = f"{_num(TINY)}_{_num(INF)}" if est == "k1" else INF
    out["token_stat"] = _rejection(lr, mask, f"token_{est}", token_threshold)[1]
    out["seq_stat"] = seq_stat
    probe, empty = _empty_rows_probe(lr, mask)
    pkeep = None
    if probe is not None:
        pkeep, _, pstat = _rejection(probe[0], probe[1], option, threshold)
        out["seq_stat"] = torch.where(empty, pstat, seq_stat)
    out["seq_keep"] = _per_sequence(keep, mask, pkeep, empty)
    return out


def geometric_sequence(inputs, params):
    f = "mask.geometric_sequence"
    lower, upper = _param(params, f, "lower"), _param(params, f, "upper")
    numerator = _param(params, f, "numerator")
    # verl keeps log L <= k1 = -mean(log g) <= log U, i.e. g in [1/U, 1/L]
    lo = TINY if upper is None else 1.0 / upper
    hi = INF if not lower else 1.0 / lower
    threshold = f"{_num(lo)}_{_num(hi)}"
    mask = inputs["mask"]
    lr = _log_ratio(inputs, numerator)
    keep, _, seq_stat = _rejection(lr, mask, "seq_mean_k1", threshold)
    probe, empty = _empty_rows_probe(lr, mask)
    pkeep = None
    if probe is not None:
        pkeep, _, pstat = _rejection(probe[0], probe[1], "seq_mean_k1", threshold)
        seq_stat = torch.where(empty, pstat, seq_stat)
    return {"keep": keep, "seq_keep": _per_sequence(keep, mask, pkeep, empty), "seq_ratio": torch.exp(-seq_stat)}


def compute_in_float32(fn):
    """bfloat16 runs store the inputs in bfloat16 and compute in float32 (spec/tolerance.md), as verl's
    trainer does: its log-probs, advantages and losses are float32 tensors under bf16 training.  The
    cast is differentiable, so gradients still arrive at the bfloat16 inputs."""

    def run(inputs, params):
        cast = {k: (v.float() if torch.is_tensor(v) and v.dtype == torch.bfloat16 else v) for k, v in inputs.items()}
        return fn(cast, params)

    run.__name__ = fn.__name__
    run.__doc__ = fn.__doc__
    return run


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": ppo_clip,
    "surrogate.dual_clip": dual_clip,
    "surrogate.pg": pg,
    "surrogate.cispo": cispo,
    "surrogate.sapo": sapo,
    "surrogate.gspo": gspo,
    "surrogate.gmpo": gmpo,
    "kl.k1": _kl("k1"),
    "kl.k2": _kl("k2"),
    "kl.k3": _kl("k3"),
    "kl.abs": _kl("abs"),
    "kl.k3_straight_through": _kl("k3+"),
    "agg.token_mean": agg_token_mean,
    "agg.sample_mean": agg_sample_mean,
    "agg.seq_mean_token_sum": agg_seq_mean_token_sum,
    "agg.constant": agg_constant,
    "adv.group_normalized": adv_group_normalized,
    "adv.group_centered": adv_group_centered,
    "is.token.truncate": _is("token", "truncate"),
    "is.token.mask": _is("token", "mask"),
    "is.sequence.truncate": _is("sequence", "truncate"),
    "is.sequence.mask": _is("sequence", "mask"),
    "is.reject": is_reject,
    "mask.geometric_sequence": geometric_sequence,
}
from .loss import IMPLEMENTATIONS as _LOSS_IMPLEMENTATIONS, PARAM_MAP as _LOSS_PARAM_MAP  # noqa: E402

IMPLEMENTATIONS.update(_LOSS_IMPLEMENTATIONS)
PARAM_MAP.update(_LOSS_PARAM_MAP)
IMPLEMENTATIONS = {fid: compute_in_float32(fn) for fid, fn in IMPLEMENTATIONS.items()}
