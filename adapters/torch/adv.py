"""adv.* in PyTorch (spec/adv.md).

Rewards are data (no gradient).  Groups are the sets of sequences sharing a ``group_ids`` value,
contiguous or not; they are found with ``torch.unique(..., return_inverse=True)`` and reduced with
``index_add_`` / ``scatter_reduce``, the way a framework does it without assuming a fixed group
size.  Two conventions need explicit code, as in any framework that wants them:

* a group whose rewards are all equal (a singleton included) is detected by comparing the rewards
  (min == max), not by looking at the rounded mean or std, and gets A = 0 whatever eps is;
* a zero denominator (sigma = 0 with eps = 0) is selected away with ``torch.where``, so 0/0 never
  produces NaN.
"""

from __future__ import annotations

import torch

from pgspec.reference import REGISTRY


def _param(formula_id, params, name):
    """The case's parameter, or the spec default from the reference registry."""
    if name in params:
        return params[name]
    return next(p.default for p in REGISTRY[formula_id].params if p.name == name)


def _segment_sum(x, inv, n):
    return torch.zeros(n, dtype=x.dtype, device=x.device).index_add_(0, inv, x)


def group_moments(rewards, group_ids, std_kind, singleton):
    """(C, sigma) per sequence: C_i = R_i - mu_{g(i)} and sigma_{g(i)} (None when std_kind is None).

    Identical-reward groups (singletons included) get C = 0 and sigma = 0 exactly; under
    singleton="mean0_std1" a singleton gets mu = 0 and sigma = 1 instead (verl, SkyRL).
    """
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    G = counts.numel()
    n = counts.to(rewards.dtype)
    mu = _segment_sum(rewards, inv, G) / n
    lo = torch.full((G,), float("inf"), dtype=rewards.dtype, device=rewards.device)
    hi = torch.full((G,), float("-inf"), dtype=rewards.dtype, device=rewards.device)
    identical = (lo.scatter_reduce(0, inv, rewards, "amin") == hi.scatter_reduce(0, inv, rewards, "amax"))[inv]
    single = (counts == 1)[inv]
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    centered = torch.where(identical, zero, rewards - mu[inv])
    if singleton == "mean0_std1":
        centered = torch.where(single, rewards, centered)
    if std_kind is None:
        return centered, None
    ddof = 1 if std_kind == "bessel" else 0
    # The squares are summed in float32 for the 16-bit dtypes, as torch.std accumulates them: in
    # float16 the square of a deviation below 2^-12 underflows (rewards 2^-20 apart would get
    # sigma = 0 and an advantage of 0).  Groups of one never use this divisor (they are
    # identical-reward groups): the clamp avoids 0/0.
    acc = centered.float() if centered.dtype in (torch.float16, torch.bfloat16) else centered
    var = _segment_sum(acc * acc, inv, G) / (n.to(acc.dtype) - ddof).clamp(min=1)
    sigma = torch.where(identical, zero, torch.sqrt(var).to(rewards.dtype)[inv])
    if singleton == "mean0_std1":
        sigma = torch.where(single, torch.ones_like(sigma), sigma)
    return centered, sigma


def normalize(x, sigma, eps, eps_placement):
    """x / (sigma + eps) or x / sqrt(sigma^2 + eps); 0 where that denominator is 0 (never NaN)."""
    eps = float(eps)
    denom = sigma + eps if eps_placement == "std" else torch.sqrt(sigma * sigma + eps)
    nonzero = denom != 0
    safe = torch.where(nonzero, denom, torch.ones_like(denom))
    return torch.where(nonzero, x / safe, torch.zeros_like(x))


def group_normalized(inputs, params):
    fid = "adv.group_normalized"
    centered, sigma = group_moments(inputs["rewards"], inputs["group_ids"], _param(fid, params, "std"),
                                    _param(fid, params, "singleton"))
    return {"advantages": normalize(centered, sigma, _param(fid, params, "eps"),
                                    _param(fid, params, "eps_placement"))}


def group_centered(inputs, params):
    centered, _ = group_moments(inputs["rewards"], inputs["group_ids"], None,
                                _param("adv.group_centered", params, "singleton"))
    return {"advantages": centered}


def batch_normalized(inputs, params):
    fid = "adv.batch_normalized"
    rewards, std_kind = inputs["rewards"], _param(fid, params, "std")
    centered, _ = group_moments(rewards, inputs["group_ids"], None, _param(fid, params, "singleton"))
    pooled = centered if _param(fid, params, "std_of") == "centered" else rewards
    n = pooled.numel()
    if n == 0 or (std_kind == "bessel" and n < 2):
        # no batch std (empty batch, or Bessel over one sequence: TRL's NaN -> 0)
        return {"advantages": torch.zeros_like(centered)}
    if bool(pooled.min() == pooled.max()):
        sigma = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    else:
        sigma = torch.std(pooled, correction=1 if std_kind == "bessel" else 0)
    return {"advantages": normalize(centered, sigma, _param(fid, params, "eps"),
                                    _param(fid, params, "eps_placement"))}


IMPLEMENTATIONS = {
    "adv.group_normalized": group_normalized,
    "adv.group_centered": group_centered,
    "adv.batch_normalized": batch_normalized,
}
