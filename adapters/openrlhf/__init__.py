"""pgspec adapter for OpenRLHF 0.11.2 (see adapters/openrlhf/README.md).

Every formula calls OpenRLHF's own code: ``PolicyLoss`` and ``aggregate_loss`` from
``openrlhf/models/loss.py`` and ``compute_approx_kl`` from ``openrlhf/models/utils.py``.

OpenRLHF cannot be imported the ordinary way on a CPU machine: ``openrlhf.models/__init__`` pulls
in ``actor.py`` -> ``ring_attn_utils`` -> flash_attn (CUDA only), and ``models/utils.py`` does
``import deepspeed`` at the top.  The two source files are therefore loaded *by path* from the
installed distribution under private module names (``_pgspec_openrlhf_models.utils`` and
``.loss``), with a throw-away parent package and, only when DeepSpeed is not installed, a
throw-away ``deepspeed`` module.  Both are removed from ``sys.modules`` right after the two
``exec_module`` calls (a spec-less ``deepspeed`` left there breaks transformers'
``is_deepspeed_available``; research install_probe.md), and ``_load`` checks that none remains.
The loaded modules are OpenRLHF's unmodified code; the adapter only keeps references to them.

Per-token losses: ``PolicyLoss.forward`` reduces its per-token loss matrix with the module-level
``aggregate_loss`` before returning.  The adapter reads that matrix (the spec's ``surrogate.*``
output) by wrapping ``aggregate_loss`` in its private copy of the module for the duration of one
call; the wrapper records its argument and calls the original.  The framework's own aggregation is
tested separately as ``agg.token_mean`` / ``agg.sample_mean``.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from pathlib import Path

from ..base import Adapter, load_deviations

NAME = "openrlhf"
DIST = "openrlhf"
PINNED = "0.11.2"
TAG = f"v{PINNED}"
SRC = f"https://github.com/OpenRLHF/OpenRLHF/blob/{TAG}/openrlhf/models"

# spec parameter -> OpenRLHF name, per formula (also in README.md).  "(fixed ...)" marks a value
# OpenRLHF hard-codes: a case may leave the parameter at its spec default or set it to that value;
# any other value raises UnsupportedParameter.
PARAM_MAP = {
    "surrogate.ppo_clip": {
        "eps_low": "PolicyLoss(clip_eps_low)",
        "eps_high": "PolicyLoss(clip_eps_high)",
        "log_ratio_clamp": "(fixed 20: log_ratio.clamp(-20, 20))",
        "": 'PolicyLoss(policy_loss_type="ppo", dual_clip=None); per-token loss read at aggregate_loss',
    },
    "surrogate.dual_clip": {
        "eps_low": "PolicyLoss(clip_eps_low)",
        "eps_high": "PolicyLoss(clip_eps_high)",
        "c": "PolicyLoss(dual_clip)",
        "log_ratio_clamp": "(fixed 20)",
        "": 'PolicyLoss(policy_loss_type="ppo")',
    },
    "surrogate.gspo": {
        "eps_low": "PolicyLoss(clip_eps_low)",
        "eps_high": "PolicyLoss(clip_eps_high)",
        "log_ratio_max": "(fixed none)",
        "": 'PolicyLoss(policy_loss_type="gspo"); the per-sequence loss is the (constant) row of the per-token loss matrix',
    },
    "kl.k1": {
        "log_ratio_min": "(fixed none)", "log_ratio_max": "(fixed none)",
        "output_min": "(fixed -10: value.clamp(min=-10))", "output_max": "(fixed 10: value.clamp(max=10))",
        "": 'compute_approx_kl(kl_estimator="k1")',
    },
    "kl.k2": {
        "log_ratio_min": "(fixed none)", "log_ratio_max": "(fixed none)",
        "output_min": "(fixed -10)", "output_max": "(fixed 10)",
        "": 'compute_approx_kl(kl_estimator="k2")',
    },
    "kl.k3": {
        "log_ratio_min": "(fixed none)", "log_ratio_max": "(fixed 10: log_ratio.clamp(min=-10), OpenRLHF's sign)",
        "output_min": "(fixed -10)", "output_max": "(fixed 10)",
        "": 'compute_approx_kl(kl_estimator="k3")',
    },
    "kl.k3_straight_through": {
        "log_ratio_min": "(fixed none)", "log_ratio_max": "(fixed 10)",
        "output_min": "(fixed -10)", "output_max": "(fixed 10)",
        "": 'compute_approx_kl(kl_estimator="k3", unbiased_gradient=True, log_probs_old=None): k3 value, gradient of k2 (w = 1)',
    },
    "agg.token_mean": {
        "num_tokens": "aggregate_loss(batch_num_tokens) (dp_size=1)",
        "eps": "(fixed 0)",
        "": "aggregate_loss(token_level_loss=True)",
    },
    "agg.sample_mean": {
        "num_sequences": "aggregate_loss(global_batch_size) (dp_size=1)",
        "count_empty_sequences": "true: global_batch_size = B; false: the local masked_mean over non-empty rows",
        "eps_length": "(fixed 1e-8: token_counts + 1e-8)",
        "eps_count": "(fixed 0)",
        "sequence_token_counts": "(not supported)",
        "": "aggregate_loss(token_level_loss=False)",
    },
    "loss.grpo": {
        "eps_low": "PolicyLoss(clip_eps_low)", "eps_high": "PolicyLoss(clip_eps_high)",
        "log_ratio_clamp": "(fixed 20)",
        "is_level": '"token" -> PolicyLoss(is_correction_level="token", is_correction_gating="ratio"); "sequence", "geometric": not supported',
        "is_mode": 'is_correction_mode: truncate -> "clip", mask -> "mask"',
        "is_c_min": "is_correction_threshold[0] (null -> 0)", "is_c_max": "is_correction_threshold[1] (null -> inf)",
        "is_log_ratio_clamp": "(fixed none)", "opsm_delta": "(not supported)", "entropy_quantile": "(not supported)",
        "beta": "--algo.kl.init_coef (kl_ctl; KL term = aggregate_loss(compute_approx_kl(...), action_mask), token mean)",
        "kl_estimator": "--algo.kl.estimator: k1, k2, k3 (unbiased_gradient=False)",
        "kl_log_ratio_min": "(fixed none)", "kl_log_ratio_max": "(fixed none; k3: 10)",
        "kl_output_min": "(fixed -10)", "kl_output_max": "(fixed 10)",
        "": 'PolicyLoss(policy_loss_type="ppo", token_level_loss=False) (--actor.loss_agg_mode seq-mean) + beta * KL term, as ppo_actor.py',
    },
    "loss.bnpo": {"": 'as loss.grpo with PolicyLoss(token_level_loss=True) (--actor.loss_agg_mode token-mean)'},
    "loss.dapo": {"aggregation": '"token_mean" -> token_level_loss=True; "prompt_mean": not supported',
                  "": "as loss.bnpo"},
    "loss.gspo": {"eps_low": "PolicyLoss(clip_eps_low)", "eps_high": "PolicyLoss(clip_eps_high)",
                  "log_ratio_max": "(fixed none)", "is_level": '(fixed "none")',
                  "": 'PolicyLoss(policy_loss_type="gspo") (always seq-mean) + beta * KL term, as loss.grpo'},
}


try:  # a property example outside OpenRLHF's domain is then reported "unsupported", not an error
    from pgspec.adapters.base import Unsupported as _Unsupported
except ImportError:  # pragma: no cover - the conformance package is always installed with pgspec
    _Unsupported = Exception


class UnsupportedParameter(_Unsupported, NotImplementedError):
    """A parameter value OpenRLHF cannot express.

    Golden cases outside OpenRLHF's domain are declared not-applicable (deviations.toml,
    [[capability]]) and never reach the adapter; the property checks build their own examples, and
    for those this exception (a ``properties.Unsupported``) reports the row as unsupported."""


def _in_float32(fn):
    """bfloat16 runs store the inputs in bfloat16 and compute in float32 (spec/tolerance.md), as
    OpenRLHF's trainer does: the actor casts its logits to float32 before taking log-probs
    (models/actor.py L267 at 0.11.2), so PolicyLoss, compute_approx_kl and aggregate_loss receive
    float32 tensors under bf16 training.  The cast is differentiable."""
    import functools

    @functools.wraps(fn)
    def run(inputs, params):
        import torch

        cast = {k: (v.float() if torch.is_tensor(v) and v.dtype == torch.bfloat16 else v) for k, v in inputs.items()}
        return fn(cast, params)

    return run


def framework_version():
    from importlib import metadata

    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return None


# loading ---------------------------------------------------------------------------------------

_PKG = "_pgspec_openrlhf_models"
_modules = None
_lock = threading.RLock()


def _load():
    """OpenRLHF's models/utils.py and models/loss.py, loaded by path; nothing left in sys.modules."""
    global _modules
    with _lock:
        if _modules is not None:
            return _modules
        from importlib import metadata

        dist = metadata.distribution(DIST)
        models = Path(dist.locate_file("openrlhf/models"))
        if not (models / "loss.py").exists():
            raise ImportError(f"openrlhf is installed but {models / 'loss.py'} is missing")
        names = [_PKG, f"{_PKG}.utils", f"{_PKG}.loss"]
        if "deepspeed" not in sys.modules and importlib.util.find_spec("deepspeed") is None:
            names.append("deepspeed")  # utils.py imports it at the top; uses it only in set_z3_leaf_modules
        saved = {n: sys.modules[n] for n in names if n in sys.modules}
        pkg = types.ModuleType(_PKG)
        pkg.__path__ = [str(models)]
        pkg.__package__ = _PKG
        sys.modules[_PKG] = pkg
        if "deepspeed" in names:
            sys.modules["deepspeed"] = types.ModuleType("deepspeed")
        try:
            loaded = {}
            for short in ("utils", "loss"):
                full = f"{_PKG}.{short}"
                spec = importlib.util.spec_from_file_location(full, models / f"{short}.py")
                module = importlib.util.module_from_spec(spec)
                sys.modules[full] = module
                spec.loader.exec_module(module)
                loaded[short] = module
        finally:
            for n in names:
                if n in saved:
                    sys.modules[n] = saved[n]
                else:
                    sys.modules.pop(n, None)
        leftover = [n for n in names if n in sys.modules and sys.modules[n] is not saved.get(n)]
        if leftover:
            raise RuntimeError(f"openrlhf adapter left modules behind in sys.modules: {leftover}")
        _modules = types.SimpleNamespace(utils=loaded["utils"], loss=loaded["loss"])
        return _modules


# parameters ------------------------------------------------------------------------------------

def _default(fid, name):
    from pgspec.reference import REGISTRY

    return next(p.default for p in REGISTRY[fid].params if p.name == name)


def _num(x):
    return None if x is None else float(x)


def _param(params, fid, name):
    return _num(params.get(name, _default(fid, name)))


def _fixed(params, fid, name, *allowed):
    """Check a parameter the framework hard-codes: allowed are the spec default and the fixed value."""
    value = _param(params, fid, name)
    ok = [None if a is None else float(a) for a in allowed] + [_num(_default(fid, name))]
    if value not in ok:
        shown = ", ".join("null" if a is None else repr(a) for a in allowed)
        raise UnsupportedParameter(f"OpenRLHF {PINNED} fixes {fid} {name} at {shown}; the case asks for {value!r}")
    return value


# implementations -------------------------------------------------------------------------------

def _token_advantages(inputs):
    adv = inputs["advantages"]
    return adv.unsqueeze(-1).expand_as(inputs["logprobs"]) if adv.dim() == 1 else adv


def _policy_loss_matrix(inputs, **kwargs):
    """Call PolicyLoss.forward; return (per-token loss matrix it aggregates, its scalar loss)."""
    mods = _load()
    loss_mod = mods.loss
    with _lock:
        captured = []
        original = loss_mod.aggregate_loss

        def recording(loss, loss_mask, *a, **k):
            captured.append(loss)
            return original(loss, loss_mask, *a, **k)

        loss_mod.aggregate_loss = recording
        try:
            fn = loss_mod.PolicyLoss(**kwargs)
            scalar, *_ = fn(inputs["logprobs"], inputs["old_logprobs"], _token_advantages(inputs), inputs["mask"])
        finally:
            loss_mod.aggregate_loss = original
    if len(captured) != 1:
        raise RuntimeError(f"expected one aggregate_loss call inside PolicyLoss.forward, saw {len(captured)}")
    return captured[0], scalar


def surrogate_ppo_clip(inputs, params):
    fid = "surrogate.ppo_clip"
    _fixed(params, fid, "log_ratio_clamp", 20)
    loss, _ = _policy_loss_matrix(inputs, clip_eps_low=_param(params, fid, "eps_low"),
                                  clip_eps_high=_param(params, fid, "eps_high"), policy_loss_type="ppo")
    return {"loss": loss}


def surrogate_dual_clip(inputs, params):
    fid = "surrogate.dual_clip"
    _fixed(params, fid, "log_ratio_clamp", 20)
    loss, _ = _policy_loss_matrix(inputs, clip_eps_low=_param(params, fid, "eps_low"),
                                  clip_eps_high=_param(params, fid, "eps_high"),
                                  dual_clip=_param(params, fid, "c"), policy_loss_type="ppo")
    return {"loss": loss}


def surrogate_gspo(inputs, params):
    import torch

    fid = "surrogate.gspo"
    _fixed(params, fid, "log_ratio_max", None)
    loss, _ = _policy_loss_matrix(inputs, clip_eps_low=_param(params, fid, "eps_low"),
                                  clip_eps_high=_param(params, fid, "eps_high"), policy_loss_type="gspo")
    # Every unmasked entry of row i is OpenRLHF's sequence loss of row i; take the first one.
    mask = inputs["mask"]
    first = mask.long().argmax(dim=-1, keepdim=True)
    row = loss.gather(-1, first).squeeze(-1)
    return {"loss": torch.where(mask.any(dim=-1), row, torch.zeros_like(row))}


def _kl(estimator, straight_through=False):
    fid = "kl.k3_straight_through" if straight_through else f"kl.{estimator}"

    def run(inputs, params):
        _fixed(params, fid, "log_ratio_min", None)
        _fixed(params, fid, "log_ratio_max", 10 if estimator == "k3" else None)
        _fixed(params, fid, "output_min", -10)
        _fixed(params, fid, "output_max", 10)
        utils = _load().utils
        kl = utils.compute_approx_kl(inputs["logprobs"], inputs["ref_logprobs"], kl_estimator=estimator,
                                     unbiased_gradient=straight_through)
        return {"kl": kl}

    return run


def agg_token_mean(inputs, params):
    fid = "agg.token_mean"
    _fixed(params, fid, "eps", 0)
    num_tokens = params.get("num_tokens")
    value = _load().loss.aggregate_loss(inputs["values"], inputs["mask"], token_level_loss=True, dp_size=1,
                                        batch_num_tokens=None if num_tokens is None else int(num_tokens))
    return {"value": value}


def agg_sample_mean(inputs, params):
    fid = "agg.sample_mean"
    _fixed(params, fid, "eps_length", 1e-8)
    _fixed(params, fid, "eps_count", 0)
    if params.get("sequence_token_counts") is not None:
        raise UnsupportedParameter("OpenRLHF's aggregate_loss has no per-sequence denominators (sequence_token_counts)")
    num_sequences = params.get("num_sequences")
    if num_sequences is None and params.get("count_empty_sequences", False):
        num_sequences = inputs["mask"].shape[0]
    value = _load().loss.aggregate_loss(inputs["values"], inputs["mask"], token_level_loss=False, dp_size=1,
                                        global_batch_size=None if num_sequences is None else int(num_sequences))
    return {"value": value}


# loss recipes ----------------------------------------------------------------------------------
#
# OpenRLHF's actor loss is PolicyActor.training_step (trainer/ray/ppo_actor.py L303-338 at 0.11.2):
#   actor_loss = PolicyLoss(...)(log_probs, old_log_probs, advantages, action_mask, rollout_log_probs)
#   kl = compute_approx_kl(log_probs, base_log_probs, log_probs_old=old, kl_estimator=..., unbiased_gradient=...)
#   loss = actor_loss + aggregate_loss(kl, action_mask) * kl_ctl
# That file needs ray/DeepSpeed; the adapter makes the same three calls to OpenRLHF's own functions
# (PolicyLoss, compute_approx_kl, aggregate_loss with the trainer's default token_level_loss=True).

_RECIPE_KL = {"k1": "k1", "k2": "k2", "k3": "k3"}


def _recipe_loss(fid, inputs, params, *, policy_loss_type, token_level_loss, clip=True):
    import math

    for name in ("opsm_delta", "entropy_quantile", "is_log_ratio_clamp"):
        if _param(params, fid, name) is not None:
            raise UnsupportedParameter(f"OpenRLHF {PINNED} PolicyLoss has no {name} (the case asks for {params[name]!r})")
    kwargs = dict(clip_eps_low=_param(params, fid, "eps_low"), clip_eps_high=_param(params, fid, "eps_high"),
                  token_level_loss=token_level_loss, policy_loss_type=policy_loss_type)
    is_level = params.get("is_level", "none")
    rollout = None
    if is_level != "none":
        if is_level != "token" or policy_loss_type != "ppo":
            raise UnsupportedParameter(
                f"OpenRLHF {PINNED} applies an IS weight only at token level (is_correction_level=token; its seq level "
                f"keeps the token ratios of surviving sequences, and GSPO uses rollout log-probs as the ratio base); "
                f"the case asks for is_level={is_level!r} with {policy_loss_type}")
        mode = params.get("is_mode", "truncate")
        c_min, c_max = _param(params, fid, "is_c_min"), _param(params, fid, "is_c_max")
        kwargs.update(is_correction_level="token", is_correction_mode="clip" if mode == "truncate" else "mask",
                      is_correction_gating="ratio",
                      is_correction_threshold=(0.0 if c_min is None else c_min, math.inf if c_max is None else c_max))
        rollout = inputs["sampler_logprobs"]
    mods = _load()
    fn = mods.loss.PolicyLoss(**kwargs)
    loss, *_ = fn(inputs["logprobs"], inputs["old_logprobs"], _token_advantages(inputs), inputs["mask"],
                  rollout_log_probs=rollout)
    beta = _param(params, fid, "beta")
    if beta:
        estimator = params.get("kl_estimator", "k3")
        if estimator not in _RECIPE_KL:
            raise UnsupportedParameter(
                f"OpenRLHF {PINNED} compute_approx_kl has k1, k2, k3 (and unbiased_gradient, which the trainer calls with "
                f"log_probs_old: w = min(r, 10)); the case asks for kl_estimator={estimator!r}")
        _fixed(params, fid, "kl_log_ratio_min", None)
        _fixed(params, fid, "kl_log_ratio_max", 10 if estimator == "k3" else None)
        _fixed(params, fid, "kl_output_min", -10)
        _fixed(params, fid, "kl_output_max", 10)
        kl = mods.utils.compute_approx_kl(inputs["logprobs"], inputs["ref_logprobs"], log_probs_old=inputs["old_logprobs"],
                                          kl_estimator=_RECIPE_KL[estimator], unbiased_gradient=False)
        loss = loss + mods.loss.aggregate_loss(kl, inputs["mask"]) * beta
    return {"loss": loss}


def loss_grpo(inputs, params):
    _fixed(params, "loss.grpo", "log_ratio_clamp", 20)
    return _recipe_loss("loss.grpo", inputs, params, policy_loss_type="ppo", token_level_loss=False)


def loss_bnpo(inputs, params):
    _fixed(params, "loss.bnpo", "log_ratio_clamp", 20)
    return _recipe_loss("loss.bnpo", inputs, params, policy_loss_type="ppo", token_level_loss=True)


def loss_dapo(inputs, params):
    fid = "loss.dapo"
    _fixed(params, fid, "log_ratio_clamp", 20)
    aggregation = params.get("aggregation", "prompt_mean")
    if aggregation != "token_mean":
        raise UnsupportedParameter(f"OpenRLHF {PINNED} aggregate_loss has token-mean and seq-mean only; the case asks "
                                   f"for aggregation={aggregation!r} (per-prompt token mean)")
    return _recipe_loss(fid, inputs, params, policy_loss_type="ppo", token_level_loss=True)


def loss_gspo(inputs, params):
    _fixed(params, "loss.gspo", "log_ratio_max", None)
    return _recipe_loss("loss.gspo", inputs, params, policy_loss_type="gspo", token_level_loss=False)


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": surrogate_ppo_clip,
    "surrogate.dual_clip": surrogate_dual_clip,
    "surrogate.gspo": surrogate_gspo,
    "kl.k1": _kl("k1"),
    "kl.k2": _kl("k2"),
    "kl.k3": _kl("k3"),
    "kl.k3_straight_through": _kl("k3", straight_through=True),
    "agg.token_mean": agg_token_mean,
    "agg.sample_mean": agg_sample_mean,
    "loss.grpo": loss_grpo,
    "loss.dapo": loss_dapo,
    "loss.bnpo": loss_bnpo,
    "loss.gspo": loss_gspo,
}


class OpenRLHFAdapter(Adapter):
    """available() is False (with the reason) when OpenRLHF is missing or its loss cannot be loaded."""
    framework_modules = ("openrlhf",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    def available(self):
        if framework_version() is None:
            return False, (f"openrlhf is not installed in this interpreter (a plain pip install needs flash-attn): "
                           f"in the pgspec checkout, bash ci/install-openrlhf.sh VENV, then VENV/bin/pgspec run "
                           f"--adapter openrlhf (openrlhf=={PINNED}; adapters/openrlhf/README.md)")
        try:
            _load()
        except Exception as e:  # noqa: BLE001 - reported as the reason
            return False, f"cannot load openrlhf/models/loss.py: {type(e).__name__}: {e}"
        return True, ""


def make_adapter() -> Adapter:
    version = framework_version()
    return OpenRLHFAdapter(
        name=NAME,
        framework="OpenRLHF",
        version=version or "not installed",
        devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16"),
        implementations={fid: _in_float32(fn) for fid, fn in IMPLEMENTATIONS.items()},
        param_map={fid: {k: v for k, v in m.items() if k} for fid, m in PARAM_MAP.items()},
        deviations=load_deviations(Path(__file__).with_name("deviations.toml")),
    )
