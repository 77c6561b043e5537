"""pgspec adapter for skyrl-train 0.3.1 (see adapters/skyrl/README.md).

Every formula calls SkyRL's own code in ``skyrl_train.utils.ppo_utils``: the policy losses through
``PolicyLossRegistry.get(name)``, the reductions through ``reduce_loss``, the KL estimators through
``compute_approx_kl`` and the GRPO advantages through ``AdvantageEstimatorRegistry.get("grpo")``.
The loss config is SkyRL's default ``trainer.algorithm`` node of ``config/ppo_base_config.yaml``
with the case's parameters merged in (the mapping is ``PARAM_MAP``).

Per-token losses: each registered policy loss reduces its per-token loss matrix with the
module-level ``reduce_loss`` before returning.  The adapter reads that matrix (the spec's
``surrogate.*`` output) by wrapping ``ppo_utils.reduce_loss`` for the duration of one call; the
wrapper records its argument and calls the original, and is removed again in a ``finally``.
SkyRL's reductions themselves are tested as ``agg.*``.

``compute_approx_kl`` is decorated with ``@torch.no_grad()`` in 0.3.1 (SkyRL #1340): its result has
no autograd graph.  The adapter then returns the framework's gradient explicitly as zeros (what a
backward pass through SkyRL's KL loss term gives), so the runner compares it with the reference.
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..base import Adapter, current_cotangent, load_deviations

NAME = "skyrl"
DIST = "skyrl-train"
PINNED = "0.3.1"
# ppo_utils.py of the 0.3.1 wheel is byte-identical to this commit ("Bump skyrl-train to 0.3.1 (#826)")
COMMIT = "ce6def0e8f996eb823de4f10d1c0d1528c9a2f6b"
SRC = f"https://github.com/NovaSky-AI/SkyRL/blob/{COMMIT}/skyrl-train/skyrl_train/utils/ppo_utils.py"

# spec parameter -> SkyRL config name (trainer.algorithm.*), per formula (also in README.md).
# "(fixed ...)" marks a value SkyRL hard-codes: a case may leave the parameter at its spec default
# or set it to that value; anything else raises UnsupportedParameter.
PARAM_MAP = {
    "surrogate.ppo_clip": {
        "eps_low": "eps_clip_low", "eps_high": "eps_clip_high",
        "log_ratio_clamp": "(fixed 20: _safe_exp_delta, exp in float32)",
        "": 'policy_loss_type="regular"',
    },
    "surrogate.dual_clip": {
        "eps_low": "eps_clip_low", "eps_high": "eps_clip_high", "c": "clip_ratio_c",
        "log_ratio_clamp": "(fixed 20)",
        "": 'policy_loss_type="dual_clip"',
    },
    "surrogate.gspo": {
        "eps_low": "eps_clip_low", "eps_high": "eps_clip_high",
        "log_ratio_max": "(fixed 10: clamp(max=10) on the GSPO-token log-weight)",
        "": 'policy_loss_type="gspo"; per-sequence loss = ppo_utils.masked_mean of the per-token loss over the row',
    },
    "surrogate.cispo": {
        "eps_low": "cispo.cispo_eps_clip_low (null -> 1.0: the floor 1 - 1 = 0 never binds since r > 0)",
        "eps_high": "cispo.cispo_eps_clip_high",
        "cap_form": '(fixed "relative")',
        "log_ratio_clamp": "(fixed 20)",
        "": 'policy_loss_type="cispo"; output weight = d(loss)/d(logprobs) of a second call with advantages -1',
    },
    "surrogate.sapo": {
        "tau_pos": "sapo.tau_pos", "tau_neg": "sapo.tau_neg",
        "log_ratio_clamp": "(fixed 20)",
        "": 'policy_loss_type="sapo"',
    },
    "kl.k1": {"log_ratio_min": "(fixed none)", "log_ratio_max": "(fixed none)", "output_min": "(fixed none)",
              "output_max": "(fixed none)", "": 'compute_approx_kl(kl_estimator_type="k1", loss_mask=mask)'},
    "kl.k2": {"log_ratio_min": "(fixed none)", "log_ratio_max": "(fixed none)", "output_min": "(fixed none)",
              "output_max": "(fixed none)", "": 'compute_approx_kl(kl_estimator_type="k2", loss_mask=mask)'},
    "kl.abs": {"log_ratio_min": "(fixed none)", "log_ratio_max": "(fixed none)", "output_min": "(fixed none)",
               "output_max": "(fixed none)", "": 'compute_approx_kl(kl_estimator_type="abs", loss_mask=mask)'},
    "kl.k3": {"log_ratio_min": "(fixed -20)", "log_ratio_max": "(fixed 20)", "output_min": "(fixed -10)",
              "output_max": "(fixed 10)", "": 'compute_approx_kl(kl_estimator_type="k3", loss_mask=mask)'},
    "agg.token_mean": {"num_tokens": "(not supported: local count only)", "eps": "(fixed 0; count clamp(min=1))",
                       "": 'reduce_loss(loss_reduction="token_mean")'},
    "agg.sample_mean": {"num_sequences": "(not supported: local B)", "sequence_token_counts": "(not supported)",
                        "count_empty_sequences": "(fixed true: .mean() over all B rows)",
                        "eps_length": "(fixed 0; count clamp(min=1))", "eps_count": "(fixed 0)",
                        "": 'reduce_loss(loss_reduction="sequence_mean")'},
    "agg.constant": {"divisor": "max_seq_len", "divide_by": '(fixed "K*N")', "num_sequences": "(not supported: local B)",
                     "count_empty_sequences": "(fixed true)", "": 'reduce_loss(loss_reduction="seq_mean_token_sum_norm")'},
    "adv.group_normalized": {"std": '(fixed "bessel": torch.std)', "eps": "epsilon",
                             "eps_placement": '(fixed "std")', "singleton": '(fixed "mean0_std1")',
                             "": 'AdvantageEstimatorRegistry "grpo", grpo_norm_by_std=True'},
    "adv.group_centered": {"singleton": '(fixed "mean0_std1")',
                           "": 'AdvantageEstimatorRegistry "grpo", grpo_norm_by_std=False'},
    "loss.grpo": {
        "eps_low": "eps_clip_low", "eps_high": "eps_clip_high", "log_ratio_clamp": "(fixed 20)",
        "is_level": '"token" with is_mode "truncate" -> use_tis=true (regular/dual_clip losses only); others not supported',
        "is_c_min": "(fixed none)", "is_c_max": "tis_imp_ratio_cap", "is_log_ratio_clamp": "(fixed 20: _safe_exp_delta)",
        "opsm_delta": "(not supported)", "entropy_quantile": "(not supported)",
        "beta": "use_kl_loss=true, kl_loss_coef (KL term = masked_mean(kl, loss_mask, dim=-1).mean(), as worker.py)",
        "kl_estimator": "kl_estimator_type: k1, k2, k3, abs",
        "kl_log_ratio_min": "(as kl.*: k3 fixed -20)", "kl_log_ratio_max": "(k3 fixed 20)",
        "kl_output_min": "(k3 fixed -10)", "kl_output_max": "(k3 fixed 10)",
        "": 'policy_loss_type="regular", loss_reduction="sequence_mean" + beta * KL term',
    },
    "loss.bnpo": {"": 'as loss.grpo with loss_reduction="token_mean"'},
    "loss.dapo": {"aggregation": '"token_mean" only', "": 'as loss.bnpo'},
    "loss.dr_grpo": {"divisor": "max_seq_len", "divide_by": '(fixed "K*N")',
                     "": 'as loss.grpo with loss_reduction="seq_mean_token_sum_norm"'},
    "loss.gspo": {"eps_low": "eps_clip_low", "eps_high": "eps_clip_high", "log_ratio_max": "(fixed 10)",
                  "is_level": '(fixed "none")', "": 'policy_loss_type="gspo", loss_reduction="sequence_mean" + beta * KL term'},
    "loss.cispo": {"eps_low": "cispo.cispo_eps_clip_low (null -> 1.0)", "eps_high": "cispo.cispo_eps_clip_high",
                   "cap_form": '(fixed "relative")', "aggregation": '"token_mean" only', "log_ratio_clamp": "(fixed 20)",
                   "is_level": '(fixed "none")', "": 'policy_loss_type="cispo", loss_reduction="token_mean" + beta * KL term'},
    "loss.sapo": {"tau_pos": "sapo.tau_pos", "tau_neg": "sapo.tau_neg", "log_ratio_clamp": "(fixed 20)",
                  "is_level": '(fixed "none")', "": 'policy_loss_type="sapo", loss_reduction="sequence_mean" + beta * KL term'},
}


try:  # a property example outside SkyRL's domain is then reported "unsupported", not an error
    from pgspec.adapters.base import Unsupported as _Unsupported
except ImportError:  # pragma: no cover - the conformance package is always installed with pgspec
    _Unsupported = Exception


class UnsupportedParameter(_Unsupported, NotImplementedError):
    """A parameter value skyrl-train cannot express.

    Golden cases outside SkyRL's domain are declared not-applicable (deviations.toml, [[capability]])
    and never reach the adapter; the property checks build their own examples, and for those this
    exception (a ``properties.Unsupported``) reports the row as unsupported."""


def framework_version():
    from importlib import metadata

    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return None


_lock = threading.RLock()
_state = {}


def _ppo():
    from skyrl_train.utils import ppo_utils

    return ppo_utils


def _base_config():
    """SkyRL's default trainer.algorithm config (ppo_base_config.yaml), loaded once."""
    if "algorithm" not in _state:
        from importlib import metadata

        from omegaconf import OmegaConf

        path = Path(metadata.distribution(DIST).locate_file("skyrl_train/config/ppo_base_config.yaml"))
        algorithm = OmegaConf.load(path).trainer.algorithm
        _state["algorithm"] = OmegaConf.to_container(algorithm, resolve=False)
    return _state["algorithm"]


def _config(**overrides):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(_base_config())
    cfg.max_seq_len = None
    return OmegaConf.merge(cfg, OmegaConf.create(overrides))


# parameters ------------------------------------------------------------------------------------

def _default(fid, name):
    from pgspec.reference import REGISTRY

    return next(p.default for p in REGISTRY[fid].params if p.name == name)


def _value(x):
    if x is None or isinstance(x, bool):
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return x


def _param(params, fid, name):
    return _value(params.get(name, _default(fid, name)))


def _fixed(params, fid, name, *allowed):
    """A parameter SkyRL hard-codes: the spec default or the fixed value(s) are accepted."""
    value = _param(params, fid, name)
    ok = [_value(a) for a in allowed] + [_value(_default(fid, name))]
    if value not in ok:
        shown = ", ".join("null" if a is None else repr(a) for a in allowed)
        raise UnsupportedParameter(f"skyrl-train {PINNED} fixes {fid} {name} at {shown}; the case asks for {value!r}")
    return value


def _only(params, fid, name, *allowed):
    """A choice SkyRL supports only some values of (the spec default is not implied)."""
    value = _param(params, fid, name)
    if value not in [_value(a) for a in allowed]:
        shown = ", ".join(repr(a) for a in allowed)
        raise UnsupportedParameter(f"skyrl-train {PINNED} supports {fid} {name} = {shown} only; the case asks for {value!r}")
    return value


# policy losses ---------------------------------------------------------------------------------

def _token_advantages(inputs):
    adv = inputs["advantages"]
    return adv.unsqueeze(-1).expand_as(inputs["logprobs"]) if adv.dim() == 1 else adv


def _loss_mask(inputs, like):
    return inputs["mask"].to(like.dtype)  # SkyRL's loss_mask is a 0/1 tensor


def _per_token_loss(name, inputs, config, logprobs=None, advantages=None):
    """Call PolicyLossRegistry.get(name); return the per-token loss matrix it hands to reduce_loss."""
    ppo = _ppo()
    logprobs = inputs["logprobs"] if logprobs is None else logprobs
    advantages = _token_advantages(inputs) if advantages is None else advantages
    fn = ppo.PolicyLossRegistry.get(name)
    with _lock:
        captured = []
        original = ppo.reduce_loss

        def recording(loss, loss_mask, *a, **k):
            captured.append(loss)
            return original(loss, loss_mask, *a, **k)

        ppo.reduce_loss = recording
        try:
            fn(logprobs, inputs["old_logprobs"], advantages, config, loss_mask=_loss_mask(inputs, logprobs))
        finally:
            ppo.reduce_loss = original
    if len(captured) != 1:
        raise RuntimeError(f"expected one reduce_loss call inside the {name!r} policy loss, saw {len(captured)}")
    return captured[0]


def surrogate_ppo_clip(inputs, params):
    fid = "surrogate.ppo_clip"
    _fixed(params, fid, "log_ratio_clamp", 20)
    cfg = _config(policy_loss_type="regular", eps_clip_low=_param(params, fid, "eps_low"),
                  eps_clip_high=_param(params, fid, "eps_high"))
    return {"loss": _per_token_loss("regular", inputs, cfg)}


def surrogate_dual_clip(inputs, params):
    fid = "surrogate.dual_clip"
    _fixed(params, fid, "log_ratio_clamp", 20)
    cfg = _config(policy_loss_type="dual_clip", eps_clip_low=_param(params, fid, "eps_low"),
                  eps_clip_high=_param(params, fid, "eps_high"), clip_ratio_c=_param(params, fid, "c"))
    return {"loss": _per_token_loss("dual_clip", inputs, cfg)}


def surrogate_gspo(inputs, params):
    fid = "surrogate.gspo"
    _fixed(params, fid, "log_ratio_max", 10)
    cfg = _config(policy_loss_type="gspo", loss_reduction="sequence_mean",
                  eps_clip_low=_param(params, fid, "eps_low"), eps_clip_high=_param(params, fid, "eps_high"))
    loss = _per_token_loss("gspo", inputs, cfg)
    # GSPO-token: the sequence loss is the row's token mean (SkyRL's own masked_mean, dim=-1)
    return {"loss": _ppo().masked_mean(loss, _loss_mask(inputs, loss), dim=-1)}


def surrogate_cispo(inputs, params):
    import torch

    fid = "surrogate.cispo"
    _only(params, fid, "cap_form", "relative")
    _fixed(params, fid, "log_ratio_clamp", 20)
    eps_low = _param(params, fid, "eps_low")
    cfg = _config(policy_loss_type="cispo",
                  cispo={"cispo_eps_clip_low": 1.0 if eps_low is None else eps_low,
                         "cispo_eps_clip_high": _param(params, fid, "eps_high")})
    loss = _per_token_loss("cispo", inputs, cfg)
    # The clipped IS weight enters the loss as -A * sg(w) * logprobs, so with A = -1 the gradient
    # of the per-token loss with respect to logprobs is w itself (multiplications by +-1: exact).
    with torch.enable_grad():
        probe = inputs["logprobs"].detach().clone().requires_grad_(True)
        minus_one = torch.full_like(probe, -1.0)
        probe_loss = _per_token_loss("cispo", inputs, cfg, logprobs=probe, advantages=minus_one)
        (weight,) = torch.autograd.grad(probe_loss.sum(), probe)
    return {"loss": loss, "weight": weight}


def surrogate_sapo(inputs, params):
    fid = "surrogate.sapo"
    _fixed(params, fid, "log_ratio_clamp", 20)
    cfg = _config(policy_loss_type="sapo", loss_reduction="sequence_mean",
                  sapo={"tau_pos": _param(params, fid, "tau_pos"), "tau_neg": _param(params, fid, "tau_neg")})
    return {"loss": _per_token_loss("sapo", inputs, cfg)}


# KL --------------------------------------------------------------------------------------------

_KL_CLAMPS = {  # (log_ratio_min, log_ratio_max, output_min, output_max) SkyRL hard-codes
    "k1": (None, None, None, None),
    "k2": (None, None, None, None),
    "abs": (None, None, None, None),
    "k3": (-20, 20, -10, 10),
}


def _kl(estimator):
    fid = f"kl.{estimator}"

    def run(inputs, params):
        import torch

        for name, fixed in zip(("log_ratio_min", "log_ratio_max", "output_min", "output_max"), _KL_CLAMPS[estimator]):
            _fixed(params, fid, name, fixed)
        logprobs = inputs["logprobs"]
        kl = _ppo().compute_approx_kl(logprobs, inputs["ref_logprobs"], loss_mask=_loss_mask(inputs, logprobs),
                                      kl_estimator_type=estimator)
        if kl.requires_grad or not logprobs.requires_grad:
            return {"kl": kl}
        # @torch.no_grad(): SkyRL's KL term contributes no gradient (#1340); report it as such: zero is the
        # VJP with any cotangent (read, so that pgspec knows the gradient is the VJP it judges)
        current_cotangent(like=kl)
        return {"kl": kl, "grad": {"logprobs": torch.zeros_like(logprobs)}}

    return run


# aggregation -----------------------------------------------------------------------------------

def _no_param(params, fid, name):
    if params.get(name) is not None:
        raise UnsupportedParameter(f"skyrl-train {PINNED} reduce_loss has no {name} (it counts the local batch only)")


def agg_token_mean(inputs, params):
    fid = "agg.token_mean"
    _no_param(params, fid, "num_tokens")
    _fixed(params, fid, "eps", 0)
    values = inputs["values"]
    return {"value": _ppo().reduce_loss(values, _loss_mask(inputs, values), "token_mean")}


def agg_sample_mean(inputs, params):
    fid = "agg.sample_mean"
    _no_param(params, fid, "num_sequences")
    _no_param(params, fid, "sequence_token_counts")
    # count_empty_sequences: always true in SkyRL (see agg_constant)
    _fixed(params, fid, "eps_length", 0)
    _fixed(params, fid, "eps_count", 0)
    values = inputs["values"]
    return {"value": _ppo().reduce_loss(values, _loss_mask(inputs, values), "sequence_mean")}


def agg_constant(inputs, params):
    fid = "agg.constant"
    _only(params, fid, "divide_by", "K*N")
    _no_param(params, fid, "num_sequences")
    # count_empty_sequences: SkyRL's batch mean always counts every row; a case asking for false runs
    # as SkyRL does, and deviations.toml declares the difference where a row is empty
    divisor = params.get("divisor")
    if divisor is None:
        raise UnsupportedParameter("agg.constant needs a divisor (SkyRL's max_seq_len)")
    divisor = float(divisor)
    if divisor.is_integer() and abs(divisor) < 2**62:
        divisor = int(divisor)  # max_seq_len is an integer in SkyRL's config
    values = inputs["values"]
    return {"value": _ppo().reduce_loss(values, _loss_mask(inputs, values), "seq_mean_token_sum_norm",
                                        max_seq_len=divisor)}


# advantages ------------------------------------------------------------------------------------

def _grpo(inputs, epsilon, norm_by_std):
    import numpy as np

    rewards = inputs["rewards"]
    index = np.asarray(inputs["group_ids"].detach().cpu().tolist(), dtype=np.int64)
    token_level_rewards = rewards.detach().clone().unsqueeze(-1)  # one "token" holding the outcome reward
    response_mask = token_level_rewards.new_ones(token_level_rewards.shape)
    fn = _ppo().AdvantageEstimatorRegistry.get("grpo")
    advantages, _ = fn(token_level_rewards=token_level_rewards, response_mask=response_mask, index=index,
                       epsilon=epsilon, grpo_norm_by_std=norm_by_std)
    return {"advantages": advantages.squeeze(-1)}


def adv_group_normalized(inputs, params):
    fid = "adv.group_normalized"
    _only(params, fid, "std", "bessel")
    _only(params, fid, "eps_placement", "std")
    # singleton: SkyRL always gives a group of one mean 0 and std 1 ("mean0_std1"); a case asking for
    # "zero" runs as SkyRL does, and deviations.toml declares the difference where a singleton exists
    return _grpo(inputs, _param(params, fid, "eps"), True)


def adv_group_centered(inputs, params):
    # singleton: always "mean0_std1" in SkyRL (see adv_group_normalized)
    return _grpo(inputs, 1e-6, False)


# loss recipes ----------------------------------------------------------------------------------
#
# SkyRL's actor loss is PolicyWorkerBase.training_step (skyrl_train/workers/worker.py L657-691 at 0.3.1):
#   policy_loss, _ = PolicyLossRegistry.get(policy_loss_type)(log_probs, old, advantages, config, loss_mask, rollout_logprobs)
#   kl_loss = masked_mean(compute_approx_kl(log_probs, base_log_probs, loss_mask, kl_estimator_type), loss_mask, dim=-1).mean()
#   loss = policy_loss + kl_loss * kl_loss_coef
# worker.py needs ray and a model; the adapter makes the same calls to SkyRL's own ppo_utils functions.

_RECIPE_KL = ("k1", "k2", "k3", "abs")


def _recipe_loss(fid, inputs, params, *, policy_loss_type, loss_reduction, tis=False, max_seq_len=None, **extra):
    for name in ("opsm_delta", "entropy_quantile"):
        if _param(params, fid, name) is not None:
            raise UnsupportedParameter(f"skyrl-train {PINNED} policy losses have no {name} (the case asks for {params[name]!r})")
    overrides = dict(policy_loss_type=policy_loss_type, loss_reduction=loss_reduction, **extra)
    if max_seq_len is not None:
        overrides["max_seq_len"] = max_seq_len
    is_level = params.get("is_level", "none")
    rollout = None
    if is_level != "none":
        if not tis or is_level != "token" or params.get("is_mode", "truncate") != "truncate":
            raise UnsupportedParameter(
                f"skyrl-train {PINNED} has only token-level truncated IS (use_tis, tis_imp_ratio_cap) and only in the "
                f"regular/dual_clip loss; the case asks for is_level={is_level!r}, is_mode={params.get('is_mode', 'truncate')!r} "
                f"with {policy_loss_type}")
        if _param(params, fid, "is_c_min") is not None:
            raise UnsupportedParameter(f"skyrl-train {PINNED} TIS has no lower bound (is_c_min); the case asks for {params['is_c_min']!r}")
        _fixed(params, fid, "is_log_ratio_clamp", 20)
        cap = _param(params, fid, "is_c_max")
        if cap is None:
            raise UnsupportedParameter(f"skyrl-train {PINNED} TIS needs tis_imp_ratio_cap (is_c_max)")
        overrides.update(use_tis=True, tis_imp_ratio_cap=cap)
        rollout = inputs["sampler_logprobs"]
    cfg = _config(**overrides)
    ppo = _ppo()
    logprobs = inputs["logprobs"]
    mask = _loss_mask(inputs, logprobs)
    loss, _ = ppo.PolicyLossRegistry.get(policy_loss_type)(logprobs, inputs["old_logprobs"], _token_advantages(inputs), cfg,
                                                          loss_mask=mask, rollout_logprobs=rollout)
    beta = _param(params, fid, "beta")
    if beta:
        estimator = params.get("kl_estimator", "k3")
        if estimator not in _RECIPE_KL:
            raise UnsupportedParameter(f"skyrl-train {PINNED} kl_estimator_type is k1, k2, k3 or abs; the case asks for {estimator!r}")
        for name, fixed in zip(("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max"), _KL_CLAMPS[estimator]):
            _fixed(params, fid, name, fixed)
        kl = ppo.compute_approx_kl(logprobs, inputs["ref_logprobs"], loss_mask=mask, kl_estimator_type=estimator)
        loss = loss + ppo.masked_mean(kl, mask, dim=-1).mean() * beta
    return {"loss": loss}


def loss_grpo(inputs, params):
    fid = "loss.grpo"
    _fixed(params, fid, "log_ratio_clamp", 20)
    return _recipe_loss(fid, inputs, params, policy_loss_type="regular", loss_reduction="sequence_mean", tis=True,
                        eps_clip_low=_param(params, fid, "eps_low"), eps_clip_high=_param(params, fid, "eps_high"))


def _token_mean_ppo(fid, inputs, params):
    _fixed(params, fid, "log_ratio_clamp", 20)
    return _recipe_loss(fid, inputs, params, policy_loss_type="regular", loss_reduction="token_mean", tis=True,
                        eps_clip_low=_param(params, fid, "eps_low"), eps_clip_high=_param(params, fid, "eps_high"))


def loss_bnpo(inputs, params):
    return _token_mean_ppo("loss.bnpo", inputs, params)


def loss_dapo(inputs, params):
    fid = "loss.dapo"
    _only(params, fid, "aggregation", "token_mean")
    return _token_mean_ppo(fid, inputs, params)


def loss_dr_grpo(inputs, params):
    fid = "loss.dr_grpo"
    _fixed(params, fid, "log_ratio_clamp", 20)
    _only(params, fid, "divide_by", "K*N")
    divisor = float(_param(params, fid, "divisor"))
    if divisor.is_integer() and abs(divisor) < 2**62:
        divisor = int(divisor)  # max_seq_len is an integer in SkyRL's config
    return _recipe_loss(fid, inputs, params, policy_loss_type="regular", loss_reduction="seq_mean_token_sum_norm",
                        tis=True, max_seq_len=divisor,
                        eps_clip_low=_param(params, fid, "eps_low"), eps_clip_high=_param(params, fid, "eps_high"))


def loss_gspo(inputs, params):
    fid = "loss.gspo"
    _fixed(params, fid, "log_ratio_max", 10)
    return _recipe_loss(fid, inputs, params, policy_loss_type="gspo", loss_reduction="sequence_mean",
                        eps_clip_low=_param(params, fid, "eps_low"), eps_clip_high=_param(params, fid, "eps_high"))


def loss_cispo(inputs, params):
    fid = "loss.cispo"
    _only(params, fid, "cap_form", "relative")
    _only(params, fid, "aggregation", "token_mean")
    _fixed(params, fid, "log_ratio_clamp", 20)
    eps_low = _param(params, fid, "eps_low")
    return _recipe_loss(fid, inputs, params, policy_loss_type="cispo", loss_reduction="token_mean",
                        cispo={"cispo_eps_clip_low": 1.0 if eps_low is None else eps_low,
                               "cispo_eps_clip_high": _param(params, fid, "eps_high")})


def loss_sapo(inputs, params):
    fid = "loss.sapo"
    _fixed(params, fid, "log_ratio_clamp", 20)
    return _recipe_loss(fid, inputs, params, policy_loss_type="sapo", loss_reduction="sequence_mean",
                        sapo={"tau_pos": _param(params, fid, "tau_pos"), "tau_neg": _param(params, fid, "tau_neg")})


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": surrogate_ppo_clip,
    "surrogate.dual_clip": surrogate_dual_clip,
    "surrogate.gspo": surrogate_gspo,
    "surrogate.cispo": surrogate_cispo,
    "surrogate.sapo": surrogate_sapo,
    "kl.k1": _kl("k1"),
    "kl.k2": _kl("k2"),
    "kl.k3": _kl("k3"),
    "kl.abs": _kl("abs"),
    "agg.token_mean": agg_token_mean,
    "agg.sample_mean": agg_sample_mean,
    "agg.constant": agg_constant,
    "adv.group_normalized": adv_group_normalized,
    "adv.group_centered": adv_group_centered,
    "loss.grpo": loss_grpo,
    "loss.dapo": loss_dapo,
    "loss.dr_grpo": loss_dr_grpo,
    "loss.bnpo": loss_bnpo,
    "loss.gspo": loss_gspo,
    "loss.cispo": loss_cispo,
    "loss.sapo": loss_sapo,
}


class SkyRLAdapter(Adapter):
    """available() is False (with the reason) when skyrl-train is missing or cannot be imported."""
    framework_modules = ("skyrl_train", "skyrl")   # its exceptions are the framework's rejections (spec/verdicts.md)

    def available(self):
        if framework_version() is None:
            return False, (f"skyrl-train is not installed in this interpreter (a plain pip install fails): in the "
                           f"pgspec checkout, bash ci/install-skyrl.sh VENV, then VENV/bin/pgspec run --adapter skyrl "
                           f"(skyrl-train=={PINNED}; adapters/skyrl/README.md)")
        try:
            _ppo()
        except Exception as e:  # noqa: BLE001 - reported as the reason
            return False, f"cannot import skyrl_train.utils.ppo_utils: {type(e).__name__}: {e}"
        return True, ""


def make_adapter() -> Adapter:
    version = framework_version()
    return SkyRLAdapter(
        name=NAME,
        framework="SkyRL (skyrl-train)",
        version=version or "not installed",
        devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16"),
        implementations=dict(IMPLEMENTATIONS),
        param_map={fid: {k: v for k, v in m.items() if k} for fid, m in PARAM_MAP.items()},
        deviations=load_deviations(Path(__file__).with_name("deviations.toml")),
    )
