"""mask: masks that drop whole sequences or single tokens from the policy term (spec/mask.md).

Every output here is a boolean keep flag (plus the statistic it was decided on).  A mask carries no
gradient, so no formula here has a differentiable input.  A ``loss.*`` recipe excludes a dropped
token from the policy term (select, not multiply); whether it stays in a denominator is the
aggregator's parameter (spec/agg.md).

The plain per-element functions below (``mean_log_ratio``, ``geometric_keep``,
``opsm_statistic``, ``sequence_advantage``, ``opsm_keep``, ``quantile_position``,
``linear_quantile``, ``entropy_keep``) are what the ``loss.*`` recipes compose; the registered
formulas only iterate them over the unmasked tokens.
"""

from __future__ import annotations

from mpmath import mp, mpf

from ._ad import exp, total
from ._common import ADV_SEQ_OR_TOKEN, MASK, SAMPLER_LOGPROBS, positions, require, seq_output, token_adv
from ._registry import Input, Output, Param, formula

DEEPSEEK_V32 = "DeepSeek-AI 2025, DeepSeek-V3.2, arXiv:2512.02556, section 3.1 Eq. 8-9 (off-policy sequence masking)"
GEO_MASK = ("Li, Liu 2025, When Speed Kills Stability, Part 3: Trust Region Optimization via Sequence Masking "
            "(Geo-Mask), https://richardli.xyz/post/rl-collapse-part3")
TRL_4891 = "trl PR #4891 (open): vllm_importance_sampling_mode = sequence_geometric_mean_mask; OPSM as its special case"
NEMO_SEQ_MASK = ("NeMo-RL 7ea279ab nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn "
                 "truncated_importance_sampling_type = seq-mask-tis (PR #1899)")
TRL_OPSM = "trl 1.16.0 GRPOTrainer.get_off_policy_mask (off_policy_mask_threshold; sampler log-probs since trl#4857)"
SLIME_OPSM = ("slime 624b824a slime/utils/ppo_utils.py compute_opsm_mask (--use-opsm, --opsm-delta); per-token "
              "advantage gate fixed to a sequence gate by slime#1917 / radixark/miles#1127")
ENTROPY_8020 = ("Wang et al. 2025, Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective RL for "
                "LLM Reasoning, arXiv:2506.01939")
TRL_ENTROPY = "trl 1.16.0 GRPOTrainer.get_high_entropy_mask (top_entropy_quantile; torch.quantile, linear)"

_OPTIONAL_LOGPROBS = Input("logprobs", (("B", "T"),), optional=True)
_OPTIONAL_OLD = Input("old_logprobs", (("B", "T"),), optional=True)
_LOGPROBS = Input("logprobs", (("B", "T"),))
_ENTROPY = Input("entropy", (("B", "T"),))

KEEP_TOKENS = Output("keep", ("B", "T"), kind="bool",
                     doc="the sequence's decision at each of its unmasked tokens (null where the mask is false)")
SEQ_KEEP = Output("seq_keep", ("B",), kind="bool", doc="true where sequence i is kept")


# Per-element primitives ------------------------------------------------------------------------

def mean_log_ratio(num_row, den_row, ts):
    """(1/L_i) sum_{t in ts} (num_t - den_t), L_i = len(ts); 0 for an empty sequence.

    Summed at the working precision.
    """
    if not ts:
        return mpf(0)
    return total(num_row[t] - den_row[t] for t in ts) / len(ts)


def geometric_keep(g, lower, upper):
    """1[lower <= g <= upper] for the geometric-mean ratio g; a bound that is None is open."""
    return (lower is None or g >= lower) and (upper is None or g <= upper)


def opsm_statistic(logprob_row, sampler_row, ts):
    """kappa_i = (1/L_i) sum_t (l^mu_{i,t} - l_{i,t}): the mean log-ratio sampler over current
    (DeepSeek-V3.2 Eq. 9 with pi_old = the inference engine's probabilities); 0 when L_i = 0."""
    return mean_log_ratio(sampler_row, logprob_row, ts)


def sequence_advantage(adv, ts):
    """A_i: a per-sequence advantage as given, or the mean of per-token advantages over the
    unmasked tokens ts (0 for an empty sequence), the sequence gate of slime#1917 / miles#1127."""
    if not isinstance(adv, list):
        return adv
    if not ts:
        return mpf(0)
    return total(adv[t] for t in ts) / len(ts)


def opsm_keep(advantage, kappa, delta):
    """M_i = 0 iff A_i < 0 and kappa_i > delta; else 1.

    Equivalently, with g_i = exp(-kappa_i) the geometric-mean ratio current over sampler:
    M_i = 1[A_i >= 0] or 1[g_i >= e^{-delta}], the advantage-gated one-sided geometric mask.
    """
    return not (advantage < 0 and kappa > delta)


def quantile_position(level, n):
    """h = level * (n - 1), the 0-based position of the quantile in n sorted values.

    When h is within 2^-44 (n - 1) of an integer it is that integer: a decimal level given as a
    binary float (0.7 = 0.69999999999999995559...) then gives the position its decimal value gives.
    """
    h = level * (n - 1)
    k = mp.nint(h)
    if abs(h - k) <= mpf(2) ** -44 * max(n - 1, 1):
        return k
    return h


def linear_quantile(sorted_values, level):
    """The linear-interpolation quantile (torch.quantile's default, numpy's 'linear', Hyndman-Fan 7):
    with h = level (n-1), j = floor(h):  q = x_j + (h - j)(x_{j+1} - x_j)  (q = x_j when h = j)."""
    n = len(sorted_values)
    h = quantile_position(level, n)
    j = int(mp.floor(h))
    frac = h - j
    if frac == 0:
        return sorted_values[j]
    return sorted_values[j] + frac * (sorted_values[j + 1] - sorted_values[j])


def entropy_keep(entropy, threshold):
    """1[H_{i,t} >= q]: ties with the threshold are kept."""
    return entropy >= threshold


# mask.geometric_sequence -----------------------------------------------------------------------

@formula(
    "mask.geometric_sequence",
    title="Geometric sequence mask: keep i iff lower <= exp(mean_t (l_num - l_mu)) <= upper",
    inputs=(_OPTIONAL_OLD, _OPTIONAL_LOGPROBS, SAMPLER_LOGPROBS, MASK),
    params=(
        Param("numerator", "old_logprobs", kind="choice", choices=("old_logprobs", "logprobs"),
              doc="whose log-probs are over the sampler's: 'old_logprobs' (train/inference mismatch: "
                  "NeMo-RL seq-mask-tis, trl#4891, verl geo_rs, SkyRL) or 'logprobs' (current policy, "
                  "the form OPSM uses); that input must be given and the other must not"),
        Param("lower", 0.99, lo=0, nullable=True,
              doc="keep iff g_i >= lower (null: no lower bound); 0.99 is SkyRL's geometric default"),
        Param("upper", 1.01, lo=0, lo_open=True, nullable=True,
              doc="keep iff g_i <= upper (null: no upper bound); 1.01 is SkyRL's geometric default"),
    ),
    outputs=(
        SEQ_KEEP,
        KEEP_TOKENS,
        seq_output("seq_ratio", "g_i = exp((1/L_i) sum_t m (l^num - l^mu)), 1 for an empty sequence"),
    ),
    references=(GEO_MASK, TRL_4891, NEMO_SEQ_MASK,
                "verl 0.9.1 rollout_corr_helper geo_rs preset (seq_mean_k1, '0.999_1.001')",
                "SkyRL main a9564572 off_policy_correction sequence_mask_metric = geometric [0.99, 1.01]"),
)
def geometric_sequence(old_logprobs, logprobs, sampler_logprobs, mask, *, numerator, lower, upper):
    """mask.geometric_sequence:  g_i = exp((1/L_i) sum_t m_{i,t} (l^num_{i,t} - l^mu_{i,t})),
    keep_i = 1[lower <= g_i <= upper],  l^num = l^old (default) or l;  L_i = 0 gives g_i = 1."""
    fid = "mask.geometric_sequence"
    require(lower is not None or upper is not None,
            f"{fid}: at least one of the parameters 'lower' and 'upper' must be set, got both null")
    require(lower is None or upper is None or lower <= upper,
            f"{fid}: parameter 'lower' must be <= 'upper', got lower={mp.nstr(lower, 15)} and upper={mp.nstr(upper, 15)}")
    given = {"old_logprobs": old_logprobs, "logprobs": logprobs}
    other = "logprobs" if numerator == "old_logprobs" else "old_logprobs"
    require(given[numerator] is not None,
            f"{fid}: missing input {numerator!r} (expected shape [B,T]): parameter numerator={numerator!r} uses it")
    require(given[other] is None,
            f"{fid}: input {other!r} was given but parameter numerator={numerator!r} does not use it; "
            f"pass numerator={other!r} to use it, or leave it out")
    num = given[numerator]
    g = [exp(mean_log_ratio(num[i], sampler_logprobs[i], positions(row))) for i, row in enumerate(mask)]
    keep = [geometric_keep(x, lower, upper) for x in g]
    return {"seq_keep": keep, "keep": _broadcast(mask, keep), "seq_ratio": g}


# mask.opsm -------------------------------------------------------------------------------------

@formula(
    "mask.opsm",
    title="DeepSeek-V3.2 off-policy sequence mask: drop i iff A_i < 0 and mean_t (l_mu - l) > delta",
    inputs=(_LOGPROBS, SAMPLER_LOGPROBS, ADV_SEQ_OR_TOKEN, MASK),
    params=(
        Param("delta", 0.5, lo=0,
              doc="threshold on the mean log-ratio sampler over current; the paper gives no value, "
                  "0.5 is the value TRL's documentation suggests (slime default 1e-4)"),
        Param("advantage_gate", "sequence_mean", kind="choice", choices=("sequence_mean", "token"),
              doc="which advantage gates the drop when advantages are per token [B,T]: sequence_mean: the mean "
                  "A_i over the unmasked tokens, one decision per sequence (slime#1917 / miles#1127; the default, "
                  "a sequence mask); token: each token's own A_{i,t}, the literal DeepSeek-V3.2 Eq. 9. Identical "
                  "for [B] advantages"),
    ),
    outputs=(
        SEQ_KEEP,
        KEEP_TOKENS,
        seq_output("seq_stat", "kappa_i = (1/L_i) sum_t m (l^mu - l), 0 for an empty sequence"),
        seq_output("seq_advantage", "A_i: the given [B] advantage, or the mean of the [B,T] advantages over "
                                    "the unmasked tokens (0 for an empty sequence)"),
    ),
    references=(DEEPSEEK_V32, TRL_OPSM, SLIME_OPSM, TRL_4891),
)
def opsm(logprobs, sampler_logprobs, advantages, mask, *, delta, advantage_gate):
    """mask.opsm:  kappa_i = (1/L_i) sum_t m_{i,t} (l^mu_{i,t} - l_{i,t}),
    A_i = advantages[i] ([B]) or (1/L_i) sum_t m_{i,t} A_{i,t} ([B,T]),
    advantage_gate sequence_mean:  M_i = 0 iff A_i < 0 and kappa_i > delta, else 1;  keep_{i,t} = M_i;
    advantage_gate token (DeepSeek-V3.2 Eq. 9):  keep_{i,t} = 0 iff A_{i,t} < 0 and kappa_i > delta,
    M_i = 1 iff every unmasked token of i is kept.  With [B] advantages A_{i,t} = A_i: the two agree."""
    kappa = [opsm_statistic(logprobs[i], sampler_logprobs[i], positions(row)) for i, row in enumerate(mask)]
    adv = [sequence_advantage(advantages[i], positions(row)) for i, row in enumerate(mask)]
    if advantage_gate == "token":
        keep_tok = [[opsm_keep(token_adv(advantages, i, t), kappa[i], delta) if m else None for t, m in enumerate(row)]
                    for i, row in enumerate(mask)]
        seq_keep = [all(k for k in row if k is not None) for row in keep_tok]
        return {"seq_keep": seq_keep, "keep": keep_tok, "seq_stat": kappa, "seq_advantage": adv}
    keep = [opsm_keep(a, k, delta) for a, k in zip(adv, kappa)]
    return {"seq_keep": keep, "keep": _broadcast(mask, keep), "seq_stat": kappa, "seq_advantage": adv}


# mask.entropy_quantile -------------------------------------------------------------------------

@formula(
    "mask.entropy_quantile",
    title="Entropy top-quantile mask: keep tokens with H >= the (1 - rho) linear quantile of unmasked H",
    inputs=(_ENTROPY, MASK),
    params=(
        Param("top_entropy_quantile", 0.2, lo=0, hi=1,
              doc="rho, the fraction of highest-entropy tokens to keep: the threshold is the linear-"
                  "interpolation quantile at level 1 - rho of the unmasked entropies (paper: top 20%; "
                  "TRL default 1.0 keeps every token)"),
    ),
    outputs=(
        Output("keep", ("B", "T"), kind="bool", doc="1[H_{i,t} >= q] (null where the mask is false)"),
        Output("threshold", (), doc="q, the quantile over the batch's unmasked entropies (null when there is none)"),
    ),
    references=(ENTROPY_8020, TRL_ENTROPY),
)
def entropy_quantile(entropy, mask, *, top_entropy_quantile):
    """mask.entropy_quantile:  q = Q_lin({H_{i,t} : m_{i,t}}, 1 - rho),  keep_{i,t} = 1[H_{i,t} >= q].

    Q_lin is the linear-interpolation quantile over all unmasked tokens of the batch; no unmasked
    token: no threshold and nothing kept.
    """
    values = []
    for i, row in enumerate(mask):
        for t in positions(row):
            require(entropy[i][t] >= 0, f"mask.entropy_quantile: input entropy[{i}][{t}] must be >= 0 "
                                        f"(an entropy), got {mp.nstr(entropy[i][t], 15)}")
            values.append(entropy[i][t])
    if not values:
        return {"keep": [[None for _ in row] for row in mask], "threshold": None}
    q = linear_quantile(sorted(values), 1 - top_entropy_quantile)
    keep = [[entropy_keep(entropy[i][t], q) if m else None for t, m in enumerate(row)] for i, row in enumerate(mask)]
    return {"keep": keep, "threshold": q}


def _broadcast(mask, seq_values):
    """[[seq_values[i] if m else None for t] for i]: a per-sequence value at every unmasked token."""
    return [[seq_values[i] if m else None for m in row] for i, row in enumerate(mask)]
