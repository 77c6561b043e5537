"""pgspec adapter for Megatron-LM's RL module, loaded from the user's checkout (adapters/megatron/README.md).

Executed: ``calculate_grpo_loss`` and ``calculate_grpo_advantages`` of ``megatron/rl/rl_utils.py``
(AST-extracted, see loader.py).

- ``calculate_grpo_loss`` returns per-token terms: ``surrogate.ppo_clip`` is its loss with
  ``kl_beta = 0``, ``entropy_weight = 0`` and no IS correction; ``kl.k3`` is its ``kl_term``
  (k3 of ref - current, no clamp); ``is.token.truncate`` is its loss on policy (current = old, so
  min(r A, clip(r) A) = A) with advantages -1: exactly the IS weight min(exp(old - inference), c).
- ``calculate_grpo_advantages``: ``adv.group_normalized`` (population std, + 1e-4 on the std),
  groups reordered into the [num_groups][group_size] lists it takes.
- ``PGSPEC_MEGATRON_LAYOUT=packed`` runs every ``calculate_grpo_loss`` call through its packed
  path instead: all rows in one bin with ``seq_starts`` / ``seq_lengths`` (a sequence of length
  T + 1 gives T log-probs), the advantages spread by the function itself.

The aggregation (``train_rl.py`` ``loss_func``: Σ loss·mask and the token count, divided in
Megatron's schedule) needs CUDA (``losses.cuda()``) and the training arguments: it is declared
unsupported (deviations.toml), not re-implemented.
"""

from __future__ import annotations

import os
from pathlib import Path

from pgspec.adapters.base import Unsupported as _PropertyUnsupported

from .._gitsource import Revision, SourceAdapter, source_env
from ..base import load_deviations, spec_param
from . import loader

FRAMEWORK = "Megatron-LM RL"

MAIN = Revision(
    name="main d98e8a64",
    commit="d98e8a64ddf34856e74b24714e3bedb2f5a39553",
    blobs={"megatron/rl/rl_utils.py": "06fe76f81a1948a3046bdaf9533032a0806856b7"},
    clone=("git clone https://github.com/NVIDIA/Megatron-LM megatron-lm && git -C megatron-lm checkout "
           "d98e8a64ddf34856e74b24714e3bedb2f5a39553"),
)
REVISIONS = [MAIN]


class MegatronUnsupported(_PropertyUnsupported, NotImplementedError):
    """A parameter value or input form calculate_grpo_loss cannot express (declared as a capability)."""


def _unsupported(fid, why):
    raise MegatronUnsupported(f"megatron: {fid}: {why}")


def _fns():
    src = ADAPTER.source()
    if src is None:
        raise RuntimeError(f"no Megatron-LM checkout ({source_env('megatron')} is not set)")
    return loader.load(src)


_param = spec_param   # every parameter read here is a scalar or a choice (same values as before)


def _compute(x):
    import torch

    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _fill(x, mask):
    import torch

    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def packed() -> bool:
    layout = os.environ.get("PGSPEC_MEGATRON_LAYOUT", "unpacked")
    if layout not in ("unpacked", "packed"):
        raise ValueError(f"PGSPEC_MEGATRON_LAYOUT must be 'unpacked' or 'packed', got {layout!r}")
    return layout == "packed"


def _grpo_loss(cur, old, ref, adv, eps_low, eps_high, kl_beta=0.0, inference=None, coef=None):
    """calculate_grpo_loss on [B, T] tensors, through the unpacked or the packed path."""
    f = _fns()["calculate_grpo_loss"]
    B, T = cur.shape
    if not packed():
        return f(cur, old, ref, adv, eps_low, eps_high, kl_beta, 0.0, inference_logprobs=inference,
                 is_truncation_coef=coef)
    flat = lambda x: None if x is None else x.reshape(1, B * T)  # noqa: E731
    out = f(flat(cur), flat(old), flat(ref), adv, eps_low, eps_high, kl_beta, 0.0, inference_logprobs=flat(inference),
            is_truncation_coef=coef, seq_starts=[i * T for i in range(B)], seq_lengths=[T + 1] * B)
    return tuple(t.reshape(B, T) if hasattr(t, "reshape") and t.dim() == 2 else t for t in out)


def surrogate_ppo_clip(inputs, params):
    fid = "surrogate.ppo_clip"
    if _param(params, fid, "log_ratio_clamp") is not None:
        _unsupported(fid, "log_ratio_clamp: the ratio is exp(current - old), never clamped")
    m = inputs["mask"]
    adv = _compute(inputs["advantages"])
    if adv.dim() != 1:
        _unsupported(fid, "per-token advantages: calculate_grpo_loss takes one advantage per sequence")
    # no mask argument: padding holds 0, as in Megatron's padded batches
    cur, old = _fill(_compute(inputs["logprobs"]), m), _fill(_compute(inputs["old_logprobs"]), m)
    loss, *_ = _grpo_loss(cur, old, cur.detach(), adv, _param(params, fid, "eps_low"), _param(params, fid, "eps_high"))
    return {"loss": loss}


def kl_k3(inputs, params):
    fid = "kl.k3"
    for n in ("log_ratio_min", "log_ratio_max", "output_min", "output_max"):
        if _param(params, fid, n) is not None:
            _unsupported(fid, f"{n}: the KL term is never clamped")
    m = inputs["mask"]
    cur, ref = _fill(_compute(inputs["logprobs"]), m), _fill(_compute(inputs["ref_logprobs"]), m)
    import torch

    zero_adv = torch.zeros(cur.shape[0], dtype=cur.dtype)
    _, kl_term, *_ = _grpo_loss(cur, cur.detach(), ref, zero_adv, 0.2, 0.2)
    return {"kl": kl_term}


def is_token_truncate(inputs, params):
    """On policy (current = old) with advantages -1 the loss is -w * min(-1, -1) = w."""
    import torch

    fid = "is.token.truncate"
    if _param(params, fid, "log_ratio_clamp") is not None:
        _unsupported(fid, "log_ratio_clamp")
    if _param(params, fid, "c_min") is not None:
        _unsupported(fid, "c_min: the IS truncation has an upper bound only")
    m = inputs["mask"]
    old, mu = _fill(_compute(inputs["old_logprobs"]), m), _fill(_compute(inputs["sampler_logprobs"]), m)
    minus_one = torch.full((old.shape[0],), -1.0, dtype=old.dtype)
    loss, *_ = _grpo_loss(old.detach(), old, old.detach(), minus_one, 0.2, 0.2, inference=mu,
                          coef=_param(params, fid, "c_max"))
    return {"weight": loss}


def _group_layout(fid, group_ids):
    ids = [int(g) for g in group_ids.tolist()]
    rows: dict = {}
    for k, g in enumerate(ids):
        rows.setdefault(g, []).append(k)
    sizes = {len(r) for r in rows.values()}
    if len(sizes) > 1:
        _unsupported(fid, "groups of unequal size: calculate_grpo_advantages takes [num_groups][group_size]")
    return list(rows.values())


def adv_group_normalized(inputs, params):
    import torch

    fid = "adv.group_normalized"
    want = {"std": "population", "eps": 1e-4, "eps_placement": "std", "singleton": "zero"}
    for k, v in want.items():
        if _param(params, fid, k) != v:
            _unsupported(fid, f"{k}={params.get(k)!r}: (r - mean) / (1e-4 + population std), fixed")
    groups = _group_layout(fid, inputs["group_ids"])
    r = inputs["rewards"].double().tolist()
    adv = _fns()["calculate_grpo_advantages"]([[r[k] for k in g] for g in groups], [[1] * len(g) for g in groups])
    out = [0.0] * len(r)
    for value, k in zip(adv, [k for g in groups for k in g]):
        out[k] = value
    return {"advantages": torch.tensor(out, dtype=inputs["rewards"].dtype)}


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": surrogate_ppo_clip,
    "kl.k3": kl_k3,
    "is.token.truncate": is_token_truncate,
    "adv.group_normalized": adv_group_normalized,
}


class MegatronAdapter(SourceAdapter):
    framework_modules = ("megatron",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    revisions = REVISIONS

    def load(self):
        return loader.load(self.source())


def make_adapter():
    global ADAPTER
    a = MegatronAdapter(name="megatron", framework=FRAMEWORK, version="no checkout", devices=("cpu", "cuda"),
                        dtypes=("float64", "float32", "bfloat16"), implementations=dict(IMPLEMENTATIONS))
    a.refresh_version()
    if packed():
        a.version += "; packed layout (seq_starts / seq_lengths)"
    a.deviations = load_deviations(Path(__file__).with_name("deviations.toml"))
    ADAPTER = a
    return a


ADAPTER = None
