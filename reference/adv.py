"""adv: outcome advantages from per-sequence rewards and prompt groups (spec/adv.md).

No formula here is differentiable: rewards are data.  Groups are the sets of sequences that share a
``group_ids`` value; they need not be contiguous, and their labels carry no meaning (relabelling or
permuting the batch permutes the advantages and changes nothing else).

Conventions fixed here (each a parameter where frameworks differ):

* A group of one sequence ("singleton"): ``singleton="zero"`` takes its mean to be its own reward,
  so A = 0 (AReaL; TRL's NaN std is mapped to 0); ``singleton="mean0_std1"`` takes mean 0 and
  std 1, so A = R / (1 + eps) (verl, SkyRL).
* A denominator equal to 0 (identical rewards with eps = 0, so 0/0) gives A = 0: a group whose
  rewards are all equal has A = 0 whatever eps is.
"""

from __future__ import annotations

from mpmath import mp, mpf

from ._ad import sqrt, total, value_of
from ._common import GROUP_IDS, REWARDS, ZERO, seq_output
from ._registry import Param, formula

GRPO = "Shao et al. 2024, DeepSeekMath (GRPO), arXiv:2402.03300, Sec. 4.1.2"
DR_GRPO = "Liu et al. 2025, Understanding R1-Zero-Like Training (Dr.GRPO), arXiv:2503.20783, App. A"
SCALERL = "Khatri et al. 2025, The Art of Scaling RL Compute (ScaleRL), arXiv:2510.13786, Sec. 4"

STD_KIND = Param(
    "std", "population", kind="choice", choices=("population", "bessel"),
    doc="population: divide the sum of squared deviations by n; bessel: by n - 1 (torch.std default)",
)
EPS = Param(
    "eps", 0, lo=0,
    doc="eps >= 0 guarding the division (TRL 1e-4, verl/slime/NeMo-RL 1e-6, AReaL 1e-5, OpenRLHF 1e-9)",
)
EPS_PLACEMENT = Param(
    "eps_placement", "std", kind="choice", choices=("std", "variance"),
    doc="std: divide by (sigma + eps) (every framework studied); variance: divide by sqrt(sigma^2 + eps)",
)
SINGLETON = Param(
    "singleton", "zero", kind="choice", choices=("zero", "mean0_std1"),
    doc="a group of one sequence: zero = its mean is its reward (A = 0); "
        "mean0_std1 = mean 0 and std 1 as in verl/SkyRL (A = R / (1 + eps) when normalized, R when centered)",
)
BATCH_STD_OF = Param(
    "std_of", "centered", kind="choice", choices=("centered", "rewards"),
    doc="the batch std is taken of the group-centered advantages (centered, ScaleRL) "
        "or of the raw rewards (rewards, TRL scale_rewards='batch')",
)

VERL_GRPO = "verl 0.9.1 verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage (Bessel, eps 1e-6, singleton mean 0 std 1)"
TRL_GRPO = "trl 1.16.0 GRPOTrainer._generate_and_score_completions (Bessel nanstd, + 1e-4, NaN -> 0)"


# Per-group primitives (composable by other families) -------------------------------------------

def groups_of(group_ids):
    """{group id: [batch indices]} in order of first appearance."""
    out: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        out.setdefault(g, []).append(i)
    return out


def mean(xs):
    """(1/n) sum x at the working precision."""
    return total(xs) / len(xs)


def std_dev(xs, kind, center=None):
    """sqrt(sum (x - mu)^2 / n) (population) or / (n - 1) (bessel); mu = mean(xs) unless given.

    The Bessel std of a single value is undefined: returns None.
    """
    n = len(xs)
    if kind == "bessel" and n < 2:
        return None
    mu = mean(xs) if center is None else center
    return sqrt(total((x - mu) * (x - mu) for x in xs) / (n if kind == "population" else n - 1))


def normalize(x, sigma, eps, eps_placement):
    """x / (sigma + eps) or x / sqrt(sigma^2 + eps); 0 when that denominator is 0 (then x = 0 too)."""
    denom = sigma + eps if eps_placement == "std" else sqrt(sigma * sigma + eps)
    if value_of(denom) == 0:
        return ZERO
    return x / denom


def group_stats(rewards, members, kind, singleton):
    """(mu_g, sigma_g) of one group's rewards (sigma_g is None when ``kind`` is None).

    A singleton group has (R, 0) under singleton="zero" and (0, 1) under singleton="mean0_std1".
    A group whose rewards are all equal has (R, 0) exactly: the rewards are compared, not the
    rounded mean, so R_i - mu_g is exactly 0 there.
    """
    rs = [rewards[i] for i in members]
    if len(rs) == 1:
        return (rs[0], ZERO) if singleton == "zero" else (ZERO, mpf(1))
    if all(value_of(r) == value_of(rs[0]) for r in rs):
        return rs[0], ZERO
    mu = mean(rs)
    return mu, (None if kind is None else std_dev(rs, kind, mu))


def group_centered_values(rewards, group_ids, singleton="zero"):
    """C_i = R_i - mu_{g(i)} for every sequence (exactly 0 for identical rewards and "zero" singletons)."""
    out = [ZERO] * len(rewards)
    for members in groups_of(group_ids).values():
        mu, _ = group_stats(rewards, members, None, singleton)
        for i in members:
            out[i] = rewards[i] - mu
    return out


def group_normalized(rewards, group_ids, std_kind="population", eps=0, eps_placement="std", singleton="zero"):
    """A_i = (R_i - mu_{g(i)}) / (sigma_{g(i)} + eps)   (or / sqrt(sigma^2 + eps)); see the module doc."""
    out = [ZERO] * len(rewards)
    for members in groups_of(group_ids).values():
        mu, sigma = group_stats(rewards, members, std_kind, singleton)
        for i in members:
            out[i] = normalize(rewards[i] - mu, sigma, eps, eps_placement)
    return out


def batch_normalized(rewards, group_ids, std_kind="population", eps=0, eps_placement="std", singleton="zero",
                     std_of="centered"):
    """A_i = C_i / (sigma_B + eps)  (or / sqrt(sigma_B^2 + eps)),  C = group_centered_values(...),
    sigma_B = std over the batch of C (std_of="centered") or of R (std_of="rewards").

    sigma_B = 0 exactly when every pooled value is equal; A = 0 when the divisor is 0 or sigma_B is
    undefined (Bessel over one sequence; TRL's NaN std is mapped to 0).
    """
    centered = group_centered_values(rewards, group_ids, singleton)
    pooled = centered if std_of == "centered" else rewards
    if not pooled or (std_kind == "bessel" and len(pooled) < 2):
        return [ZERO] * len(centered)
    sigma = ZERO if all(value_of(x) == value_of(pooled[0]) for x in pooled) else std_dev(pooled, std_kind)
    return [normalize(c, sigma, eps, eps_placement) for c in centered]


# Formulas ---------------------------------------------------------------------------------------

@formula(
    "adv.group_normalized",
    title="GRPO advantage A_i = (R_i - mean_g R) / (std_g R + eps)",
    inputs=(REWARDS, GROUP_IDS),
    params=(STD_KIND, EPS, EPS_PLACEMENT, SINGLETON),
    outputs=(seq_output("advantages", "A_i"),),
    references=(
        GRPO,
        TRL_GRPO,
        VERL_GRPO,
        "OpenRLHF 0.11.2 (Bessel, eps 1e-9, groups of one refused); AReaL 1.0.4 Normalization (Bessel, eps 1e-5, singleton 0)",
        "slime (Bessel, eps 1e-6); NeMo-RL (Bessel, eps 1e-6 where std > 0, leave-one-out baseline); "
        "Megatron-LM megatron/rl/rl_utils.py calculate_grpo_advantages (population, eps 1e-4)",
    ),
)
def group_normalized_advantages(rewards, group_ids, *, std, eps, eps_placement, singleton):
    """adv.group_normalized:  A_i = (R_i - mu_{g(i)}) / (sigma_{g(i)} + eps)  [eps_placement="std"]
    or (R_i - mu_{g(i)}) / sqrt(sigma_{g(i)}^2 + eps)  [eps_placement="variance"],
    mu_g = mean of the group's rewards, sigma_g = their population or Bessel std;
    A_i = 0 when the denominator is 0; singletons per the ``singleton`` parameter."""
    return {"advantages": group_normalized(rewards, group_ids, std, eps, eps_placement, singleton)}


@formula(
    "adv.group_centered",
    title="Dr.GRPO advantage A_i = R_i - mean_g R",
    inputs=(REWARDS, GROUP_IDS),
    params=(SINGLETON,),
    outputs=(seq_output("advantages", "A_i"),),
    references=(
        DR_GRPO,
        "verl 0.9.1 compute_grpo_outcome_advantage with norm_adv_by_std_in_grpo=False",
        "trl 1.16.0 GRPOConfig scale_rewards='none'",
        "slime --disable-grpo-std-normalization",
    ),
)
def group_centered_advantages(rewards, group_ids, *, singleton):
    """adv.group_centered:  A_i = R_i - mu_{g(i)},  mu_g = mean of the group's rewards
    (a singleton: A = 0 under "zero", A = R under "mean0_std1")."""
    return {"advantages": group_centered_values(rewards, group_ids, singleton)}


@formula(
    "adv.batch_normalized",
    title="ScaleRL advantage: group-centered, divided by the batch std (+ eps)",
    inputs=(REWARDS, GROUP_IDS),
    params=(STD_KIND, EPS, EPS_PLACEMENT, SINGLETON, BATCH_STD_OF),
    outputs=(seq_output("advantages", "A_i"),),
    references=(
        SCALERL,
        "trl 1.16.0 GRPOConfig scale_rewards='batch' (group mean, Bessel std of the batch rewards, + 1e-4)",
    ),
)
def batch_normalized_advantages(rewards, group_ids, *, std, eps, eps_placement, singleton, std_of):
    """adv.batch_normalized:  A_i = C_i / (sigma_B + eps)  (or C_i / sqrt(sigma_B^2 + eps)),
    C_i = R_i - mu_{g(i)},  sigma_B = std over the whole batch of C (std_of="centered") or of R
    (std_of="rewards"), with its own mean subtracted; A_i = 0 when the denominator is 0 or sigma_B
    is undefined (Bessel over one sequence)."""
    return {"advantages": batch_normalized(rewards, group_ids, std, eps, eps_placement, singleton, std_of)}
