"""pgspec adapter for torchtune's GRPO losses, loaded from a checkout (see adapters/torchtune/README.md).

torchtune 0.6.1 on PyPI ships the GRPO recipe (``recipes/dev/grpo_full_finetune_distributed.py``)
but not the package it imports, ``torchtune.dev.grpo``: the v0.6.x release branch has no
``torchtune/dev`` folder, and its ``torchtune.rlhf`` has no ``masked_sum``, which the GRPO loss
imports.  The GRPO losses exist only in torchtune's git history; the adapter executes them from a
checkout at the commit of ``main`` on the day 0.6.1 was tagged (19bb8e68, 2025-04-06; the loss file
is unchanged from its first version, #2326, to 2025-04-15).

Executed: ``torchtune/dev/grpo/loss.py`` (``GRPOLoss``, ``GRPOSimpleLoss``) and
``torchtune/rlhf/rewards.py`` (``masked_mean``, ``masked_sum``).  The package ``__init__`` files
are not run (``torchtune/__init__.py`` requires torchao and imports the model stack); the stand-in
``torchtune.rlhf`` re-exports ``masked_mean`` and ``masked_sum`` from the real ``rewards.py``, as
the real ``torchtune/rlhf/__init__.py`` does.

- ``GRPOLoss`` (token-level clipped ratio, ``rlhf.masked_mean`` over the whole batch, k3 KL):
  ``loss.bnpo`` and ``loss.dapo`` (token-mean aggregation).
- ``GRPOSimpleLoss`` (the loss of the recipe's default config ``3B_full_grpo.yaml``: the on-policy
  ratio exp(l - sg(l)), no clip, per-sequence masked mean then batch mean): ``loss.grpo``.
- ``rlhf.masked_mean``: ``agg.token_mean``; ``masked_mean(dim=1).mean()`` (GRPOSimpleLoss's
  reduction): ``agg.sample_mean``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .._gitsource import Revision, SourceAdapter, check_source, package_shell
from ..base import load_deviations, spec_param

FRAMEWORK = "torchtune"
REPO = "https://github.com/pytorch/torchtune"
COMMIT = "19bb8e680ef90dfb527bfc8c8545a6b87c9eb895"
SRC = f"{REPO}/blob/{COMMIT}"

MAIN = Revision(
    name="main 19bb8e68 (the day of v0.6.1)",
    commit=COMMIT,
    blobs={
        "torchtune/dev/grpo/loss.py": "3f2b2dd2600867005fd33c87473c0fc294b3c594",
        "torchtune/rlhf/rewards.py": "83744bb5d7ab93dec02846df424d6bb99cad8722",
    },
    clone=f"git clone {REPO} torchtune && git -C torchtune checkout {COMMIT}",
)
REVISIONS = [MAIN]
EXECUTED = tuple(MAIN.blobs)

PARAM_MAP = {
    "loss.bnpo": {"eps_low": "epsilon", "eps_high": "epsilon (symmetric only)", "log_ratio_clamp": "(fixed none)",
                  "beta": "kl_coeff", "kl_estimator": '(fixed "k3", unclamped)',
                  "": "GRPOLoss(epsilon, kl_coeff): -(masked_mean(min(A r, A clip(r))) - kl_coeff * masked_mean(k3))"},
    "loss.dapo": {"aggregation": '(fixed "token_mean")', "": "as loss.bnpo"},
    "loss.grpo": {"eps_low": "(none: no clip, the ratio is exp(l - sg(l)) = 1)", "eps_high": "(none)",
                  "beta": "kl_coeff", "kl_estimator": '(fixed "k3", unclamped)',
                  "": "GRPOSimpleLoss(epsilon, kl_coeff): masked_mean(-(exp(l - sg l) A - kl_coeff k3), dim=1).mean(); old_logprobs unused"},
    "agg.token_mean": {"num_tokens": "(not supported)", "eps": "(fixed 1e-8 in the denominator)",
                       "": "torchtune.rlhf.masked_mean(values, mask)"},
    "agg.sample_mean": {"count_empty_sequences": "(fixed true)", "eps_length": "(fixed 1e-8)", "eps_count": "(fixed 0)",
                        "": "masked_mean(values, mask, dim=1).mean()"},
}

from pgspec.adapters.base import Unsupported as _PropertyUnsupported  # noqa: E402


class TorchtuneUnsupported(_PropertyUnsupported, NotImplementedError):
    """A parameter value or input form torchtune's GRPO losses cannot express."""


def _unsupported(fid, why):
    raise TorchtuneUnsupported(f"torchtune: {fid}: {why}")


_loaded = {}


def load(src: Path):
    """(loss module, rewards module) from the checkout at ``src``; in the adapter's worker only."""
    key = str(src)
    if key in _loaded:
        return _loaded[key]
    if _loaded:
        raise RuntimeError("one torchtune checkout per process: the worker already loaded " + next(iter(_loaded)))
    root = Path(src) / "torchtune"
    for rel in EXECUTED:
        if not (Path(src) / rel).is_file():
            raise FileNotFoundError(f"{rel} is not in the checkout {src}")
    package_shell("torchtune", root)
    package_shell("torchtune.rlhf", root / "rlhf")
    import importlib

    rewards = importlib.import_module("torchtune.rlhf.rewards")
    rlhf = sys.modules["torchtune.rlhf"]
    # what torchtune/rlhf/__init__.py re-exports and loss.py uses
    rlhf.masked_mean, rlhf.masked_sum = rewards.masked_mean, rewards.masked_sum
    package_shell("torchtune.dev", root / "dev")
    package_shell("torchtune.dev.grpo", root / "dev" / "grpo")
    loss = importlib.import_module("torchtune.dev.grpo.loss")
    _loaded[key] = (loss, rewards)
    return _loaded[key]


def _param(params, fid, name):
    return spec_param(params, fid, name)


def _only(params, fid, name, *allowed):
    value = _param(params, fid, name)
    if value not in allowed:
        _unsupported(fid, f"{name} can only be {', '.join('null' if a is None else repr(a) for a in allowed)}; "
                          f"the case asks for {value!r}")
    return value


def _adv(inputs, fid):
    adv = inputs["advantages"]
    if adv.dim() != 1:
        _unsupported(fid, "advantages are one per sequence ([B x G]); the case gives them per token")
    return adv


def _kl(params, fid):
    beta = _param(params, fid, "beta")
    if beta:
        _only(params, fid, "kl_estimator", "k3")
        for name in ("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max"):
            _only(params, fid, name, None)
        _only(params, fid, "kl_aggregation", "policy")
    return beta


def _common(params, fid):
    for name in ("opsm_delta", "entropy_quantile"):
        _only(params, fid, name, None)
    _only(params, fid, "is_level", "none")


def _ref(inputs):
    ref = inputs.get("ref_logprobs")
    return inputs["logprobs"].detach() if ref is None else ref


def _grpo_loss(fid):
    def run(inputs, params):
        loss_mod, _ = ADAPTER.load()
        _common(params, fid)
        if fid == "loss.dapo":
            _only(params, fid, "aggregation", "token_mean")
        _only(params, fid, "log_ratio_clamp", None)
        lo, hi = _param(params, fid, "eps_low"), _param(params, fid, "eps_high")
        if lo != hi:
            _unsupported(fid, f"one epsilon (symmetric clip); the case asks for eps_low={lo!r}, eps_high={hi!r}")
        beta = _kl(params, fid)
        fn = loss_mod.GRPOLoss(epsilon=lo, kl_coeff=beta)
        loss, *_ = fn(inputs["old_logprobs"], inputs["logprobs"], _ref(inputs), _adv(inputs, fid), inputs["mask"])
        return {"loss": loss}

    run.__name__ = fid.replace(".", "_")
    return run


def loss_grpo(inputs, params):
    fid = "loss.grpo"
    loss_mod, _ = ADAPTER.load()
    _common(params, fid)
    _only(params, fid, "log_ratio_clamp", None)
    # GRPOSimpleLoss ignores pi_old_logprobs (one gradient step per batch): run as torchtune runs it; an
    # off-policy case differs, declared in deviations.toml (formula-variant)
    beta = _kl(params, fid)
    fn = loss_mod.GRPOSimpleLoss(epsilon=_param(params, fid, "eps_low"), kl_coeff=beta)
    loss, *_ = fn(inputs["old_logprobs"], inputs["logprobs"], _ref(inputs), _adv(inputs, fid), inputs["mask"])
    return {"loss": loss}


def agg_token_mean(inputs, params):
    fid = "agg.token_mean"
    _, rewards = ADAPTER.load()
    if params.get("num_tokens") is not None:
        _unsupported(fid, "masked_mean counts the local mask only (num_tokens)")
    return {"value": rewards.masked_mean(inputs["values"], inputs["mask"])}


def agg_sample_mean(inputs, params):
    fid = "agg.sample_mean"
    _, rewards = ADAPTER.load()
    for name in ("num_sequences", "sequence_token_counts"):
        if params.get(name) is not None:
            _unsupported(fid, f"masked_mean(dim=1).mean() has no {name}")
    return {"value": rewards.masked_mean(inputs["values"], inputs["mask"], dim=1).mean()}


IMPLEMENTATIONS = {
    "loss.grpo": loss_grpo,
    "loss.bnpo": _grpo_loss("loss.bnpo"),
    "loss.dapo": _grpo_loss("loss.dapo"),
    "agg.token_mean": agg_token_mean,
    "agg.sample_mean": agg_sample_mean,
}


class TorchtuneAdapter(SourceAdapter):
    framework_modules = ("torchtune",)
    revisions = REVISIONS

    def load(self):
        return load(self.source())


def make_adapter():
    global ADAPTER
    a = TorchtuneAdapter(name="torchtune", framework=FRAMEWORK, version="no checkout", devices=("cpu", "cuda"),
                         dtypes=("float64", "float32", "bfloat16"), implementations=dict(IMPLEMENTATIONS),
                         param_map={fid: {k: v for k, v in m.items() if k} for fid, m in PARAM_MAP.items()})
    a.refresh_version()
    a.deviations = load_deviations(Path(__file__).with_name("deviations.toml"))
    ADAPTER = a
    return a


ADAPTER = None
__all__ = ["make_adapter", "check_source", "REVISIONS"]
