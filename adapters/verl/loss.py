"""The verl adapter's loss.* recipes: one call of verl 0.9.1's actor loss, ``verl.workers.utils.losses.ppo_loss``.

``ppo_loss`` is the function verl's engine workers use as the actor's loss (the 0.9.1 wheel has no
``dp_actor``; ``engine_workers.py`` passes ``ppo_loss`` to ``engine.train_batch``).  It composes, in verl's
own order: the registered policy loss (``get_policy_loss_fn(actor.policy_loss.loss_mode)``) with the
rollout-correction weights multiplied into its per-token loss, aggregated by ``agg_loss`` with
``actor.loss_agg_mode`` and the global batch info; then ``+ kl_loss_coef * agg_loss(kl_penalty(...))``
(same aggregation mode) when ``use_kl_loss``.  The weights come from verl's trainer-side
``compute_rollout_correction_and_rejection_mask`` (``algorithm.rollout_correction.rollout_is``).

The adapter only lays the canonical tensors out the way ``ppo_loss`` reads them (a flat ``log_probs``
model output that ``no_padding_2_padding`` slices back to ``[B, T]``, a one-token prompt per row) and sets
the global batch info as verl's FSDP engine does: ``batch_num_tokens`` = the batch's unmasked token count
(``forward_backward_batch``), ``global_batch_size`` = the number of rows (the trainer's
``ppo_mini_batch_size * rollout.n``), ``dp_size`` = 1.  Nothing here re-implements a verl formula.
"""

from __future__ import annotations

import contextlib

import torch

from pgspec.reference import REGISTRY

INF = float("inf")
TINY = 5e-324


from .errors import ParamUnsupported  # noqa: E402  (one exception class for the adapter)


# recipe -> (verl policy_loss.loss_mode, actor.loss_agg_mode); loss.dapo / loss.cispo take theirs from `aggregation`
RECIPES = {
    "loss.grpo": ("vanilla", "seq-mean-token-mean"),
    "loss.dapo": ("vanilla", None),
    "loss.dr_grpo": ("vanilla", "seq-mean-token-sum-norm"),
    "loss.bnpo": ("vanilla", "token-mean"),
    "loss.gspo": ("gspo", "seq-mean-token-mean"),
    "loss.cispo": ("cispo", None),
    "loss.sapo": ("sapo", "seq-mean-token-mean"),
    "loss.gmpo": ("geo_mean", "seq-mean-token-mean"),
    "loss.luspo": (None, "seq-mean-token-sum"),
}

# spec kl_estimator -> verl actor.kl_loss_type
KL_TYPES = {"k1": "k1", "k2": "k2", "k3": "low_var_kl", "abs": "abs", "k3_straight_through": "k3+"}
# verl's fixed clamps inside kl_penalty (low_var_kl and k3+): input [-20, 20], output [-10, 10]
KL_FIXED = {"k3": (-20.0, 20.0, -10.0, 10.0), "k3_straight_through": (-20.0, 20.0, -10.0, 10.0)}

_COMMON = {
    "is_level": "algorithm.rollout_correction.rollout_is: 'none' -> null, 'token', 'sequence' ('geometric' unsupported)",
    "is_mode": "'truncate' -> rollout_is_threshold=<is_c_max> (TIS; is_c_min must be null); "
               "'mask' -> rollout_is_threshold='<is_c_min>_<is_c_max>' (IcePop)",
    "is_c_min, is_c_max": "rollout_is_threshold (see is_mode)",
    "is_log_ratio_clamp": "fixed: 20 (SAFETY_BOUND); null or 20 only",
    "opsm_delta": "unsupported (must be null)",
    "entropy_quantile": "unsupported (must be null)",
    "beta": "actor.kl_loss_coef, actor.use_kl_loss = beta > 0",
    "kl_estimator": "actor.kl_loss_type: k1 -> 'k1', k2 -> 'k2', k3 -> 'low_var_kl', abs -> 'abs', "
                    "k3_straight_through -> 'k3+' (k3_unbiased unsupported)",
    "kl_log_ratio_min/max, kl_output_min/max": "fixed: -20/20 and -10/10 for k3 and k3+, none for the others; "
                                              "null or exactly those values only",
}

PARAM_MAP: dict[str, dict[str, str]] = {
    "loss.grpo": {"(recipe)": "ppo_loss with policy_loss.loss_mode='vanilla', loss_agg_mode='seq-mean-token-mean'",
                  "eps_low": "actor.clip_ratio_low", "eps_high": "actor.clip_ratio_high",
                  "log_ratio_clamp": "fixed: 20; null or 20 only", "(dual clip)": "actor.clip_ratio_c = +inf", **_COMMON},
    "loss.dapo": {"(recipe)": "ppo_loss with loss_mode='vanilla'",
                  "aggregation": "'token_mean' -> loss_agg_mode='token-mean' ('prompt_mean' unsupported)",
                  "eps_low": "actor.clip_ratio_low", "eps_high": "actor.clip_ratio_high",
                  "log_ratio_clamp": "fixed: 20; null or 20 only", "(dual clip)": "actor.clip_ratio_c = +inf", **_COMMON},
    "loss.dr_grpo": {"(recipe)": "ppo_loss with loss_mode='vanilla', loss_agg_mode='seq-mean-token-sum-norm'",
                     "divisor": "actor.loss_scale_factor", "divide_by": "'K*N' only (N = global_batch_size = B)",
                     "eps_low": "actor.clip_ratio_low", "eps_high": "actor.clip_ratio_high",
                     "log_ratio_clamp": "fixed: 20; null or 20 only", "(dual clip)": "actor.clip_ratio_c = +inf", **_COMMON},
    "loss.bnpo": {"(recipe)": "ppo_loss with loss_mode='vanilla', loss_agg_mode='token-mean'",
                  "eps_low": "actor.clip_ratio_low", "eps_high": "actor.clip_ratio_high",
                  "log_ratio_clamp": "fixed: 20; null or 20 only", "(dual clip)": "actor.clip_ratio_c = +inf", **_COMMON},
    "loss.gspo": {"(recipe)": "ppo_loss with loss_mode='gspo', loss_agg_mode='seq-mean-token-mean'",
                  "eps_low": "actor.clip_ratio_low", "eps_high": "actor.clip_ratio_high",
                  "log_ratio_max": "fixed: 10; null or 10 only", **_COMMON},
    "loss.cispo": {"(recipe)": "ppo_loss with loss_mode='cispo'",
                   "aggregation": "'token_mean' -> loss_agg_mode='token-mean' ('prompt_mean' unsupported)",
                   "cap_form": "'relative' only", "eps_low": "actor.clip_ratio_low (null -> 1.0)",
                   "eps_high": "actor.clip_ratio_high", "log_ratio_clamp": "fixed: 20; null or 20 only", **_COMMON},
    "loss.sapo": {"(recipe)": "ppo_loss with loss_mode='sapo' (verl forces seq-mean-token-mean), "
                              "loss_agg_mode='seq-mean-token-mean' (for the KL term)",
                  "tau_pos": "actor.tau_pos", "tau_neg": "actor.tau_neg",
                  "log_ratio_clamp": "fixed: 20; null or 20 only", **_COMMON},
    "loss.gmpo": {"(recipe)": "ppo_loss with loss_mode='geo_mean' (a plain mean over rows), "
                              "loss_agg_mode='seq-mean-token-mean' (for the KL term)",
                  "eps_low": "actor.clip_ratio_low", "eps_high": "actor.clip_ratio_high", **_COMMON},
    "loss.luspo": {"(recipe)": "ppo_loss with loss_agg_mode='seq-mean-token-sum'",
                   "ratio_level": "'sequence' -> loss_mode='gspo'; 'token' -> loss_mode='vanilla' (clip_ratio_c=+inf)",
                   "eps_low": "actor.clip_ratio_low", "eps_high": "actor.clip_ratio_high", **_COMMON},
}


def _param(params, fid, name):
    value = params[name] if name in params else next((p.default for p in REGISTRY[fid].params if p.name == name), None)
    if value is None or isinstance(value, bool):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _fixed(fid, params, name, verl_value, what):
    value = _param(params, fid, name)
    if value is not None and value != verl_value:
        raise ParamUnsupported(f"verl fixes {what} at {verl_value!r}; {name}={value!r} cannot be configured")


def _num(x):
    return repr(float(x))


def _rollout_is_weights(fid, params, inputs):
    """verl's trainer-side rollout correction (compute_rollout_correction_and_rejection_mask), or None."""
    level = _param(params, fid, "is_level")
    if level == "none":
        return None
    if level not in ("token", "sequence"):
        raise ParamUnsupported(f"verl's rollout_is is 'token' or 'sequence'; is_level={level!r} is not available")
    _fixed(fid, params, "is_log_ratio_clamp", 20.0, "the IS log-ratio clamp (SAFETY_BOUND)")
    c_min, c_max = _param(params, fid, "is_c_min"), _param(params, fid, "is_c_max")
    if _param(params, fid, "is_mode") == "truncate":
        if c_min is not None:
            raise ParamUnsupported("verl's TIS threshold is an upper bound only (is_c_min must be null with is_mode='truncate')")
        threshold = INF if c_max is None else c_max
    else:
        threshold = f"{_num(TINY if not c_min else c_min)}_{_num(INF if c_max is None else c_max)}"
    from verl.trainer.ppo import rollout_corr_helper as rc

    proto, _mask, _metrics = rc.compute_rollout_correction_and_rejection_mask(
        old_log_prob=inputs["old_logprobs"], rollout_log_prob=inputs["sampler_logprobs"], response_mask=inputs["mask"],
        rollout_is=level, rollout_is_threshold=threshold, rollout_is_batch_normalize=False)
    return proto.batch["rollout_is_weights"]


def _config(fid, params):
    from verl.workers.config import ActorConfig, PolicyLossConfig

    loss_mode, agg = RECIPES[fid]
    kw = {}
    if fid in ("loss.dapo", "loss.cispo"):
        aggregation = _param(params, fid, "aggregation")
        if aggregation != "token_mean":
            raise ParamUnsupported(f"verl has no per-prompt aggregation (aggregation={aggregation!r}); "
                                   "loss_agg_mode 'token-mean' is aggregation='token_mean'")
        agg = "token-mean"
    if fid == "loss.luspo":
        loss_mode = "gspo" if _param(params, fid, "ratio_level") == "sequence" else "vanilla"
    if fid == "loss.dr_grpo":
        if _param(params, fid, "divide_by") != "K*N":
            raise ParamUnsupported("verl's seq-mean-token-sum-norm divides by the sequence count and "
                                   "loss_scale_factor (divide_by='K*N'); divide_by='K' is not available")
        kw["loss_scale_factor"] = _param(params, fid, "divisor")
    if loss_mode == "vanilla":
        _fixed(fid, params, "log_ratio_clamp", 20.0, "the vanilla log-ratio clamp")
        kw["clip_ratio_c"] = INF  # the recipes have no dual clip; +inf switches verl's off
    elif loss_mode == "gspo" and fid == "loss.gspo":
        _fixed(fid, params, "log_ratio_max", 10.0, "GSPO's sequence log-ratio clamp")
    elif loss_mode in ("cispo", "sapo"):
        _fixed(fid, params, "log_ratio_clamp", 20.0, f"{loss_mode}'s log-ratio clamp")
    if loss_mode == "cispo" and _param(params, fid, "cap_form") != "relative":
        raise ParamUnsupported("verl's cispo clamps the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high]; "
                               "it has no absolute cap (cap_form='absolute')")
    if loss_mode == "sapo":
        kw["tau_pos"], kw["tau_neg"] = _param(params, fid, "tau_pos"), _param(params, fid, "tau_neg")
    else:
        eps_low = _param(params, fid, "eps_low")
        kw["clip_ratio_low"] = 1.0 if eps_low is None else eps_low
        kw["clip_ratio_high"] = _param(params, fid, "eps_high")
    for name in ("opsm_delta", "entropy_quantile"):
        if _param(params, fid, name) is not None:
            raise ParamUnsupported(f"verl's actor loss has no counterpart of {name} (must be null)")
    beta = _param(params, fid, "beta")
    if beta:
        est = _param(params, fid, "kl_estimator")
        if est not in KL_TYPES:
            raise ParamUnsupported(f"verl's kl_penalty has no {est!r} estimator")
        fixed = KL_FIXED.get(est, (None, None, None, None))
        for name, value in zip(("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max"), fixed):
            _fixed(fid, params, name, value, f"{name} of kl_penalty({KL_TYPES[est]!r})")
        kw.update(use_kl_loss=True, kl_loss_coef=beta, kl_loss_type=KL_TYPES[est])
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                       policy_loss=PolicyLossConfig(loss_mode=loss_mode), loss_agg_mode=agg, **kw)


def _batch(inputs, weights, with_ref):
    """The TensorDict ``ppo_loss`` reads, and the flat ``log_probs`` model output (one-token prompts)."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    logp, mask = inputs["logprobs"], inputs["mask"]
    b, t = logp.shape
    adv = inputs["advantages"]
    adv = adv.unsqueeze(-1).expand_as(logp) if adv.dim() == 1 else adv
    fields = {
        "prompts": torch.zeros((b, 1), dtype=torch.long),
        "responses": torch.zeros((b, t), dtype=torch.long),
        "attention_mask": torch.ones((b, 1 + t), dtype=torch.long),
        "response_mask": mask,
        "old_log_probs": inputs["old_logprobs"],
        "advantages": adv,
    }
    if weights is not None:
        fields["rollout_is_weights"] = weights
    if with_ref:
        fields["ref_log_prob"] = inputs["ref_logprobs"]
    data = TensorDict(fields, batch_size=[b])
    # verl's FSDP engine (forward_backward_batch) and trainer (_update_actor) set these for every batch
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum().item()), global_batch_size=b)
    # the model's packed output: row i's response log-probs sit at the positions of its tokens minus one
    flat = torch.cat([logp, logp.new_zeros((b, 1))], dim=1).reshape(-1)
    return {"log_probs": flat}, data


@contextlib.contextmanager
def _record_agg_loss(module):
    """Wrap ``module.agg_loss`` for the call: calls pass through unchanged, their ``loss_mat`` is kept."""
    original = module.agg_loss
    mats = []

    def wrapper(*args, **kwargs):
        mats.append(kwargs["loss_mat"] if "loss_mat" in kwargs else args[0])
        return original(*args, **kwargs)

    module.agg_loss = wrapper
    try:
        yield mats
    finally:
        module.agg_loss = original


def recipe(fid):
    def run(inputs, params):
        from verl.trainer.ppo import core_algos
        from verl.workers.utils import losses

        config = _config(fid, params)
        weights = _rollout_is_weights(fid, params, inputs)
        model_output, data = _batch(inputs, weights, config.use_kl_loss)
        with _record_agg_loss(core_algos) as pg_mats, _record_agg_loss(losses) as kl_mats:
            loss, _metrics = losses.ppo_loss(config, model_output, data)
        out = {"loss": loss}
        # terms: the per-token policy loss verl's policy loss passed to agg_loss (IS weights applied)
        # + kl_loss_coef * the kl_penalty matrix ppo_loss aggregated; geo_mean never builds a per-token loss
        if pg_mats and (kl_mats or not config.use_kl_loss):
            terms = pg_mats[-1]
            if config.use_kl_loss:
                terms = terms + config.kl_loss_coef * kl_mats[-1]
            out["terms"] = terms
        return out

    run.__name__ = fid.replace(".", "_")
    return run


IMPLEMENTATIONS = {fid: recipe(fid) for fid in RECIPES}
