"""loss: composite recipes built only from the other families' primitives (spec/loss.md).

Every recipe is one LOSS (to be minimized), the same structure for all of them:

    term_{i,t} = M^opsm_i * M^ent_{i,t} * sg[w^IS_{i,t}] * pg_{i,t}  +  beta * kl_{i,t}
    loss       = Agg(term)                       (over every token with mask true)

* pg_{i,t}   the recipe's policy term from the ``surrogate`` family (a per-sequence loss such as
             GSPO's is broadcast to the sequence's tokens);
* w^IS       the train/inference weight of the ``is`` family (``is_level``/``is_mode``), a
             constant: it is built from old and sampler log-probs only;
* M^opsm_i   DeepSeek-V3.2's off-policy sequence mask (``mask.opsm``, ``opsm_delta``);
* M^ent      the entropy top-quantile mask (``mask.entropy_quantile``, ``entropy_quantile``);
* kl         a ``kl`` estimator of log(pi_ref / pi_theta); it is NOT multiplied by the masks or by
             the IS weight (DeepSeek-V3.2 Eq. 8, TRL 1.16.0) and is aggregated with the policy
             term (DeepSeekMath Eq. 3: the KL is inside the per-sequence token mean);
* Agg        an ``agg`` aggregator over the input mask.  Tokens dropped by OPSM, by the entropy
             mask or by an IS mask keep their place in the denominator: their policy term is 0,
             not excluded (every framework surveyed does this, research trl_liger.md 2.5,
             paper_verification.md 10).

A factor that is 0 *replaces* the policy term by the constant 0 (select, not multiply: an inf
there cannot become NaN); a factor that is 1 leaves the policy term's node untouched.

Two small fused nodes keep the two benchmarked recipes lean (bench/reference_cost.py), each the
closed-form derivative of a primitive's equation, never a new formula:

* ``ppo_clip_term``: surrogate.ppo_clip_loss at r = exp(clip(l - l_old, -c, c)) as one node of l;
  where the unclipped branch is active its derivative is d(-A r)/dl = -A r (= the loss itself),
  elsewhere the loss is a constant;
* ``mean_log_ratio``: (1/L) sum_t (l_t - l^old_t) as one node with derivative 1/L per token.
"""

from __future__ import annotations

from mpmath import mp, mpf

from . import agg as _agg
from ._ad import Var, clip, exp, is_var, total, value_of
from ._common import (
    ADV_SEQ, ADV_SEQ_OR_TOKEN, LOGPROBS, MASK, OLD_LOGPROBS, positions, require,
    scalar_output, token_adv, token_output,
)
from ._errors import SpecError
from ._registry import Input, Param, formula
from .is_ import (
    clamp_log_weight, geometric_log_weight, mask_weight, sequence_log_weight, token_log_weight,
    truncate_weight,
)
from .kl import (
    ESTIMATORS, clamp_value, clamped_estimate, importance_weighted_k3, k3, log_ratio, straight_through,
)
from .mask import entropy_keep, linear_quantile, opsm_keep, opsm_statistic, sequence_advantage
from .ratio import clamp_log_ratio, clamped_mean_log_ratio
from .surrogate import (
    cispo_loss, cispo_weight, gmpo_clipped_log_ratio, ppo_clip_loss, sapo_gate, sapo_tau, token_ratio,
    vespo_log_weight, vespo_phi,
)

# Defining papers -------------------------------------------------------------------------------
GRPO = "Shao et al. 2024, DeepSeekMath (GRPO), arXiv:2402.03300, section 4.1.1 Eq. 3-4, section 4.2 (beta = 0.04)"
DAPO = "Yu et al. 2025, DAPO, arXiv:2503.14476, Eq. 8 and section 4.1 (eps_low = 0.2, eps_high = 0.28, no KL)"
DRGRPO = ("Liu et al. 2025, Understanding R1-Zero-Like Training (Dr.GRPO), arXiv:2503.20783, Eq. 2, Listing 1, "
          "App. G Table 6 (eps 0.2, KL 0, generation budget 3000)")
GSPO = "Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071 v2, Eq. 5-7, section 5.1 (3e-4 / 4e-4)"
CISPO = "MiniMax 2025, MiniMax-M1 (CISPO), arXiv:2506.13585, section 3.1 Eq. 4-5"
SAPO = "Gao et al. 2025, Soft Adaptive Policy Optimization (SAPO), arXiv:2511.20347, section 3 and 5.1"
GMPO = "Zhao et al. 2025, Geometric-Mean Policy Optimization, arXiv:2507.20673, Eq. 4 and Algorithm 1"
LUSPO = ("Liu, Yin et al. 2026, Length-Unbiased Sequence Policy Optimization (LUSPO), arXiv:2602.05261 "
         "(GSPO's per-sequence loss scaled by the sequence length)")
VESPO = "VESPO: Variational Sequence-Level Soft Policy Optimization, arXiv:2602.10693 (as implemented in trl PR #5199)"
MINIRL = ("Zheng et al. 2025, Stabilizing Reinforcement Learning with LLMs: Formulation and Practices (MiniRL), "
          "arXiv:2512.01374, section 4.1 Eq. 7, section 4.2 (eps_low 0.2, eps_high 0.27, TIS cap 5)")
DEEPSEEK_V32 = "DeepSeek-AI 2025, DeepSeek-V3.2, arXiv:2512.02556, section 3.1 Eq. 5-9 (KL inside the token mean, not masked by OPSM)"

# Framework sources (versions as read in the research catalog) ------------------------------------
TRL = "trl 1.16.0 trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss"
LIGER = "liger-kernel 0.8.5 liger_kernel/chunked_loss/grpo_loss.py LigerFusedLinearGRPOFunction.ppo_loss_fn"
VERL = "verl 0.9.1 verl/trainer/ppo/core_algos.py"
OAT = "sail-sg/oat oat/algorithms/ppo.py PPOLearner critic_type='drgrpo' (constant_normalizer = generate_max_length)"

# Optional inputs -------------------------------------------------------------------------------
SAMPLER_OPTIONAL = Input("sampler_logprobs", (("B", "T"),), optional=True,
                         doc="inference engine's log-probs at sampling time; needed when is_level is not 'none' "
                             "or opsm_delta is set")
REF_OPTIONAL = Input("ref_logprobs", (("B", "T"),), optional=True,
                     doc="reference policy log-probs; needed when beta > 0")
GROUP_IDS_OPTIONAL = Input("group_ids", (("B",),), kind="int", optional=True,
                           doc="prompt group of each sequence; needed by the prompt_mean aggregation")
ENTROPY_OPTIONAL = Input("entropy", (("B", "T"),), optional=True,
                         doc="per-token entropy of the current policy; needed when entropy_quantile is set")
SAMPLER_REQUIRED = Input("sampler_logprobs", (("B", "T"),),
                         doc="inference engine's log-probs at sampling time (mu_old of MiniRL's IS weight)")

OUTPUTS = (
    scalar_output("loss", "the recipe's loss (to be minimized)"),
    token_output("terms", "term_{i,t} = M^opsm M^ent sg[w^IS] pg_{i,t} + beta kl_{i,t}, the per-token quantity the "
                          "aggregator reduces"),
)

STOP_GRADIENTS = (
    "w^IS_{i,t}, the train/inference weight (built from old and sampler log-probs, which carry no gradient)",
    "the OPSM statistic mean_t (l^mu - l) (a mask decision)",
)


# Lean per-element helpers (fused nodes; see the module docstring) -------------------------------

def ppo_clip_term(l, l_old, a, eps_low, eps_high, log_ratio_clamp=None):
    """surrogate.ppo_clip_loss(r, A) with r = exp(clip(l - l_old, -c, c)), as at most one node of l.

    Its derivative, by the chain rule and the kink rules of spec/conventions.md (clip passes the
    cotangent on the closed interval, a tie in max passes half to each equal operand), is -A r
    where the unclipped branch -A r is the larger (or ties because r lies in [1 - eps_low,
    1 + eps_high]) and the log-ratio clamp is inactive; the loss there is -A r itself, so the
    derivative equals the loss.  Elsewhere the loss is the constant -A clip(r, ...).
    """
    return _ppo_clip_node(l, l_old, a, -a, eps_low, eps_high, 1 - eps_low, 1 + eps_high, log_ratio_clamp)


def _ppo_clip_node(l, l_old, a, neg_a, eps_low, eps_high, lo, hi, c):
    """ppo_clip_term with -A and the clip bounds lo = 1 - eps_low, hi = 1 + eps_high computed once.

    l_old and A carry no gradient, so the node's only operand is l.  When the tolerance scale is
    being tracked (the inputs arrive as Vars), the node states the rounding error of the formula
    as usually written: d = l - l_old (|d|), r = exp(d) (|r| (1 + |d|)), times -A (|loss|), i.e.
    |loss| (2 + |d|); a clipped (constant) loss carries the rounding of its bound and product.
    """
    tracked = is_var(l_old)
    l_old, a, neg_a = value_of(l_old), value_of(a), value_of(neg_a)
    d = value_of(l) - l_old
    if c is not None and abs(d) > c:  # clamped log-ratio: r is a constant, so is the loss
        loss = value_of(ppo_clip_loss(exp(clamp_log_ratio(d, c)), a, eps_low, eps_high))
        return Var(loss, (), rounding=3 * abs(loss)) if tracked else loss
    r = exp(d)
    if lo <= r <= hi:  # inside the clip range both branches are -A r
        loss = r * neg_a
    else:
        loss = value_of(ppo_clip_loss(r, a, eps_low, eps_high))
        if not ((a > 0 and r < lo) or (a < 0 and r > hi)):
            # the clipped branch is active: a constant, -A times the rounded bound
            return Var(loss, (), rounding=2 * abs(loss)) if tracked else loss
    if not (a and is_var(l)):
        return Var(loss, (), rounding=abs(loss) * (2 + abs(d))) if tracked else loss
    if tracked:
        return Var(loss, ((l, loss),), rounding=abs(loss) * (2 + abs(d)))
    return Var(loss, ((l, loss),))


def mean_log_ratio(l_row, old_row, ts):
    """(1/L) sum_{t in ts} (l_t - l^old_t), L = len(ts), as one node (derivative 1/L per token);
    0 for an empty sequence.  The sum is evaluated with mp.fsum (correctly rounded once)."""
    if not ts:
        return mpf(0)
    n = len(ts)
    diffs = [value_of(l_row[t]) - value_of(old_row[t]) for t in ts]
    value = mp.fsum(diffs) / n
    leaves = [l_row[t] for t in ts if is_var(l_row[t])]
    if not leaves:
        return value
    inv = mpf(1) / n
    # tolerance model: a pairwise sum of n differences, each rounded once, then one division
    abs_sum = mp.fsum(abs(x) for x in diffs)
    rounding = (max(1, (n - 1).bit_length()) * abs_sum + abs_sum) / n + abs(value)
    return Var(value, tuple((leaf, inv) for leaf in leaves), rounding=rounding, op="divc")  # edges 1/L: rho = 2


# Parameters ------------------------------------------------------------------------------------

def _option_params(beta=0.0):
    """The IS / OPSM / entropy / KL options every recipe accepts (all off except beta where the paper has it)."""
    return (
        Param("is_level", "none", kind="choice", choices=("none", "token", "sequence", "geometric"),
              doc="train/inference IS weight w^IS (spec/is.md): none; token rho_{i,t}; sequence prod_t rho; "
                  "geometric exp(mean_t log rho); rho = exp(l^old - l^mu); needs sampler_logprobs"),
        Param("is_mode", "truncate", kind="choice", choices=("truncate", "mask"),
              doc="truncate (TIS): w = clip(rho, is_c_min, is_c_max); mask (MIS/IcePop): w = rho 1[is_c_min <= rho <= is_c_max]"),
        Param("is_c_min", None, lo=0, nullable=True, doc="lower bound of the IS weight or band (null: none)"),
        Param("is_c_max", 2.0, lo=0, lo_open=True, nullable=True,
              doc="upper bound of the IS weight or band (TIS cap; verl DAPO recipe 2.0; IcePop 5; null: none)"),
        Param("is_log_ratio_clamp", None, lo=0, lo_open=True, nullable=True,
              doc="if set to c, the level's log-weight is clamped to [-c, c] before exp (verl, slime: 20; null: none)"),
        Param("opsm_delta", None, lo=0, nullable=True,
              doc="DeepSeek-V3.2 OPSM threshold delta: drop sequence i iff A_i < 0 and mean_t (l^mu - l) > delta "
                  "(null: off); needs sampler_logprobs"),
        Param("opsm_advantage_gate", "sequence_mean", kind="choice", choices=("sequence_mean", "token"),
              doc="mask.opsm advantage_gate: sequence_mean gates the whole sequence on its mean advantage (slime#1917 "
                  "fix); token drops each token with A_{i,t} < 0 (the literal DeepSeek-V3.2 Eq. 9, slime 624b824a)"),
        Param("entropy_quantile", None, lo=0, hi=1, nullable=True,
              doc="rho of mask.entropy_quantile: keep tokens whose entropy is >= the (1 - rho) linear quantile of "
                  "the batch's unmasked entropies (null: off; TRL top_entropy_quantile); needs entropy"),
        Param("beta", beta, lo=0, doc="KL coefficient beta (0: no KL term)"),
        Param("kl_estimator", "k3", kind="choice",
              choices=("k1", "k2", "k3", "abs", "k3_straight_through", "k3_unbiased"),
              doc="the kl.* estimator of x = l^ref - l (k3_unbiased: DeepSeek-V3.2's exp(l - l^old) k3, ratio differentiated)"),
        Param("kl_log_ratio_min", None, nullable=True, doc="KL input clamp: lower bound on x (verl k3: -20; null: none)"),
        Param("kl_log_ratio_max", None, nullable=True, doc="KL input clamp: upper bound on x (verl k3: 20; null: none)"),
        Param("kl_output_min", None, nullable=True, doc="KL output clamp: lower bound on the estimate (verl k3: -10; null: none)"),
        Param("kl_output_max", None, nullable=True, doc="KL output clamp: upper bound on the estimate (verl k3: 10; null: none)"),
        Param("kl_sg_ratio_where_clamped", True, kind="bool",
              doc="k3_unbiased only: stop the ratio's gradient where the KL input clamp is active (NeMo-RL PR #2958)"),
        Param("kl_aggregation", "policy", kind="choice", choices=("policy", "sample_mean", "token_mean"),
              doc="how the KL term is aggregated: policy: inside the term, with the recipe's aggregator (DeepSeekMath "
                  "Eq. 3); sample_mean / token_mean: separately, loss = Agg(policy part) + beta agg.<kl_aggregation>(kl) "
                  "(slime --loss-aggregation changes only pg_loss; its KL keeps the sample mean)"),
    )


OPTION_NAMES = ("is_level", "is_mode", "is_c_min", "is_c_max", "is_log_ratio_clamp", "opsm_delta", "opsm_advantage_gate",
                "entropy_quantile", "beta", "kl_estimator", "kl_log_ratio_min", "kl_log_ratio_max",
                "kl_output_min", "kl_output_max", "kl_sg_ratio_where_clamped", "kl_aggregation")


def _eps(name, default, doc, hi=None):
    return Param(name, default, lo=0, hi=hi, doc=doc)


def _clamp_param():
    return Param("log_ratio_clamp", None, lo=0, lo_open=True, nullable=True,
                 doc="if set to c, the token log-ratio l - l_old is clamped to [-c, c] before exp (verl: 20; null: none)")


def _aggregation_param(default, doc):
    return Param("aggregation", default, kind="choice", choices=("prompt_mean", "token_mean"), doc=doc)


# The shared pipeline ---------------------------------------------------------------------------

def _check_inputs(fid, opts, *, sampler_logprobs, ref_logprobs, group_ids, entropy, needs_groups,
                  sampler_required=False, sampler_folded=False):
    """Each enabled option's input must be given; an input no enabled option reads is refused."""
    uses_sampler = opts["is_level"] != "none" or opts["opsm_delta"] is not None
    if uses_sampler and sampler_logprobs is None:
        why = f"is_level={opts['is_level']!r}" if opts["is_level"] != "none" else f"opsm_delta={opts['opsm_delta']}"
        raise SpecError(f"{fid}: missing input 'sampler_logprobs' (expected shape [B,T]): {why} needs the inference "
                        f"engine's log-probs")
    if sampler_logprobs is not None and not (uses_sampler or sampler_required or sampler_folded):
        raise SpecError(f"{fid}: input 'sampler_logprobs' was given but no enabled option reads it "
                        f"(is_level='none', opsm_delta=null); enable one or leave it out")
    if opts["beta"] > 0 and ref_logprobs is None:
        raise SpecError(f"{fid}: missing input 'ref_logprobs' (expected shape [B,T]): beta={opts['beta']} > 0 needs "
                        f"the reference policy's log-probs")
    if ref_logprobs is not None and opts["beta"] == 0:
        raise SpecError(f"{fid}: input 'ref_logprobs' was given but beta = 0 (no KL term); set beta > 0 or leave it out")
    if needs_groups and group_ids is None:
        raise SpecError(f"{fid}: missing input 'group_ids' (expected shape [B]): the prompt_mean aggregation divides "
                        f"by each prompt group's token count")
    if group_ids is not None and not needs_groups:
        raise SpecError(f"{fid}: input 'group_ids' was given but the aggregation does not use it; leave it out")
    if opts["entropy_quantile"] is not None and entropy is None:
        raise SpecError(f"{fid}: missing input 'entropy' (expected shape [B,T]): entropy_quantile="
                        f"{opts['entropy_quantile']} needs the per-token entropy")
    if entropy is not None and opts["entropy_quantile"] is None:
        raise SpecError(f"{fid}: input 'entropy' was given but entropy_quantile is null; set it or leave it out")
    if opts["is_level"] != "none":
        lo, hi = opts["is_c_min"], opts["is_c_max"]
        require(opts["is_mode"] == "truncate" or lo is not None or hi is not None,
                f"{fid}: at least one of the parameters 'is_c_min' and 'is_c_max' must be set when is_level="
                f"{opts['is_level']!r} and is_mode='mask', got both null (the untruncated weight is is_mode="
                f"'truncate' with both bounds null)")
        require(lo is None or hi is None or lo <= hi,
                f"{fid}: parameter 'is_c_min' must be <= 'is_c_max', got is_c_min={mp.nstr(lo, 15)} and "
                f"is_c_max={mp.nstr(hi, 15)}")
    for lo_name, hi_name in (("kl_log_ratio_min", "kl_log_ratio_max"), ("kl_output_min", "kl_output_max")):
        lo, hi = opts[lo_name], opts[hi_name]
        require(lo is None or hi is None or lo < hi,
                f"{fid}: parameter {lo_name!r} must be less than {hi_name!r}, got {lo_name}={lo} and {hi_name}={hi}")


def _is_weights(opts, old_logprobs, sampler_logprobs, mask):
    """w^IS as a function (i, t) -> constant (is family): None when is_level is 'none'."""
    level = opts["is_level"]
    if level == "none":
        return None
    c = opts["is_log_ratio_clamp"]
    c_min, c_max = opts["is_c_min"], opts["is_c_max"]
    weight = truncate_weight if opts["is_mode"] == "truncate" else mask_weight
    if level == "token":
        return lambda i, t: weight(exp(clamp_log_weight(token_log_weight(old_logprobs[i], sampler_logprobs[i], t), c)),
                                   c_min, c_max)
    level_log_weight = sequence_log_weight if level == "sequence" else geometric_log_weight
    seq = [weight(exp(clamp_log_weight(level_log_weight(old_logprobs[i], sampler_logprobs[i], positions(row)), c)),
                  c_min, c_max) for i, row in enumerate(mask)]
    return lambda i, t: seq[i]


def _opsm_keep(opts, logprobs, sampler_logprobs, advantages, mask):
    """M^opsm (mask.opsm) as a function (i, t) -> bool: the statistic uses sg[l] (a decision carries no
    gradient); the gate is the sequence-mean advantage or, with opsm_advantage_gate 'token', A_{i,t}."""
    delta = opts["opsm_delta"]
    if delta is None:
        return None
    kappas, keep = [], []
    for i, row in enumerate(mask):
        ts = positions(row)
        values = {t: value_of(logprobs[i][t]) for t in ts}
        kappas.append(opsm_statistic(values, sampler_logprobs[i], ts))
        keep.append(opsm_keep(sequence_advantage(advantages[i], ts), kappas[-1], delta))
    if opts["opsm_advantage_gate"] == "token":
        return lambda i, t: opsm_keep(token_adv(advantages, i, t), kappas[i], delta)
    return lambda i, t: keep[i]


def _entropy_keep(fid, opts, entropy, mask):
    """M^ent_{i,t} (mask.entropy_quantile) over the batch's unmasked entropies."""
    rho = opts["entropy_quantile"]
    if rho is None:
        return None
    values = []
    for i, row in enumerate(mask):
        for t in positions(row):
            require(entropy[i][t] >= 0, f"{fid}: input entropy[{i}][{t}] must be >= 0 (an entropy), "
                                        f"got {mp.nstr(entropy[i][t], 15)}")
            values.append(entropy[i][t])
    if not values:
        return [[False] * len(row) for row in mask]
    q = linear_quantile(sorted(values), 1 - rho)
    return [[entropy_keep(entropy[i][t], q) if m else None for t, m in enumerate(row)] for i, row in enumerate(mask)]


def _kl_term(opts, logprobs, old_logprobs, ref_logprobs):
    """kl_{i,t} as a function (i, t) -> node (kl family), or None when beta = 0."""
    if opts["beta"] == 0:
        return None
    est = opts["kl_estimator"]
    lo, hi = opts["kl_log_ratio_min"], opts["kl_log_ratio_max"]
    out_lo, out_hi = opts["kl_output_min"], opts["kl_output_max"]
    if est == "k3_unbiased":
        return lambda i, t: clamp_value(
            importance_weighted_k3(logprobs[i][t], old_logprobs[i][t], ref_logprobs[i][t], lo, hi,
                                   opts["kl_sg_ratio_where_clamped"]), out_lo, out_hi)
    if est == "k3_straight_through":
        def st(i, t):
            x = log_ratio(logprobs[i][t], ref_logprobs[i][t])
            return straight_through(clamped_estimate(k3, x, lo, hi, out_lo, out_hi), x)
        return st
    k = ESTIMATORS[est]
    return lambda i, t: clamped_estimate(k, log_ratio(logprobs[i][t], ref_logprobs[i][t]), lo, hi, out_lo, out_hi)


def compose(fid, *, logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy,
            opts, policy_row, aggregate, needs_groups=False, sampler_required=False, sampler_folded=False):
    """term_{i,t} = M^opsm_i M^ent_{i,t} sg[w^IS_{i,t}] pg_{i,t} + beta kl_{i,t};  loss = aggregate(term).

    ``policy_row(i, ts)`` returns the policy terms pg_{i,t} for the unmasked positions ts of row i
    (a per-sequence loss repeated at each of them); ``aggregate(values, mask)`` is an agg.* function.
    A factor 0 replaces the policy term by the constant 0 (the token stays in the denominator).
    """
    _check_inputs(fid, opts, sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids,
                  entropy=entropy, needs_groups=needs_groups, sampler_required=sampler_required,
                  sampler_folded=sampler_folded)
    w_is = _is_weights(opts, old_logprobs, sampler_logprobs, mask)
    keep_seq = _opsm_keep(opts, logprobs, sampler_logprobs, advantages, mask)
    keep_tok = _entropy_keep(fid, opts, entropy, mask)
    kl = _kl_term(opts, logprobs, old_logprobs, ref_logprobs)
    beta = opts["beta"]
    separate_kl = kl is not None and opts["kl_aggregation"] != "policy"
    terms, policy_terms, kl_terms = [], [], []
    for i, row in enumerate(mask):
        ts = positions(row)
        pg = policy_row(i, ts) if ts else []
        out = [None] * len(row)
        pol, kls = [None] * len(row), [None] * len(row)
        for t, p in zip(ts, pg):
            factor = 1
            if keep_seq is not None and not keep_seq(i, t):
                factor = 0
            elif keep_tok is not None and not keep_tok[i][t]:
                factor = 0
            elif w_is is not None:
                factor = w_is(i, t)
            term = p if factor == 1 else (mpf(0) if factor == 0 else p * factor)
            pol[t] = term
            if kl is not None:
                kls[t] = kl(i, t)
                term = term + kls[t] * beta
            out[t] = term
        terms.append(out)
        policy_terms.append(pol)
        kl_terms.append(kls)
    if separate_kl:  # loss = Agg(M sg[w] pg) + beta * agg.<kl_aggregation>(kl)
        kl_agg = _agg.sample_mean if opts["kl_aggregation"] == "sample_mean" else _agg.token_mean
        return {"loss": aggregate(policy_terms, mask) + kl_agg(kl_terms, mask) * beta, "terms": terms}
    return {"loss": aggregate(terms, mask), "terms": terms}


def _sequence_broadcast(seq_loss):
    """policy_row for a per-sequence loss: the same loss at each unmasked token of the row."""
    return lambda i, ts: [seq_loss(i, ts)] * len(ts)


def _prompt_or_token_mean(aggregation, group_ids):
    if aggregation == "prompt_mean":
        return lambda values, mask: _agg.prompt_mean(values, mask, group_ids)
    return _agg.token_mean


def _opts(kw):
    return {name: kw.pop(name) for name in OPTION_NAMES}


def _ppo_row(logprobs, old_logprobs, advantages, eps_low, eps_high, log_ratio_clamp):
    """policy_row for surrogate.ppo_clip_loss at every token (one ppo_clip_term node each)."""
    lo, hi = 1 - eps_low, 1 + eps_high

    def row(i, ts):
        l_row, old_row, a = logprobs[i], old_logprobs[i], advantages[i]
        if isinstance(a, list):
            return [_ppo_clip_node(l_row[t], old_row[t], a[t], -a[t], eps_low, eps_high, lo, hi, log_ratio_clamp)
                    for t in ts]
        neg_a = -a
        return [_ppo_clip_node(l_row[t], old_row[t], a, neg_a, eps_low, eps_high, lo, hi, log_ratio_clamp) for t in ts]

    return row


def _gspo_seq(logprobs, old_logprobs, advantages, eps_low, eps_high, log_ratio_max, log_ratio_clamp=None):
    """surrogate.gspo's per-sequence loss max(-A s, -A clip(s, 1-eps_low, 1+eps_high)),
    s = exp(min(mean_t clip(l - l_old, -k, k), c)) (ratio.sequence_geometric; the fused mean node
    when there is no per-token clamp k)."""
    def mean(i, ts):
        if log_ratio_clamp is None:
            return mean_log_ratio(logprobs[i], old_logprobs[i], ts)
        return clamped_mean_log_ratio(logprobs[i], old_logprobs[i], ts, log_ratio_clamp)

    return lambda i, ts: ppo_clip_loss(exp(clip(mean(i, ts), None, log_ratio_max)), advantages[i], eps_low, eps_high)


COMMON_INPUTS_TOKEN_ADV = (LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ_OR_TOKEN, SAMPLER_OPTIONAL, REF_OPTIONAL,
                           GROUP_IDS_OPTIONAL, ENTROPY_OPTIONAL)
COMMON_INPUTS_SEQ_ADV = (LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ, SAMPLER_OPTIONAL, REF_OPTIONAL,
                         GROUP_IDS_OPTIONAL, ENTROPY_OPTIONAL)


# The recipes -------------------------------------------------------------------------------------

@formula(
    "loss.grpo",
    title="GRPO: PPO clip per token, KL (k3) inside the per-sequence token mean, mean over sequences",
    inputs=COMMON_INPUTS_TOKEN_ADV,
    params=(
        _eps("eps_low", 0.2, "lower clip range (the paper gives no value; 0.2 as every framework)", hi=1),
        _eps("eps_high", 0.2, "upper clip range (the paper gives no value; 0.2 as every framework)"),
        _clamp_param(),
    ) + _option_params(beta=0.04),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS,
    references=(GRPO, DEEPSEEK_V32, TRL + " loss_type='grpo' (beta default 0.0)", LIGER + " loss_type='grpo' (beta 0.04)",
                VERL + " loss_agg_mode='seq-mean-token-mean'"),
)
def grpo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
         eps_low, eps_high, log_ratio_clamp, **options):
    """loss.grpo:  loss = S(term),  S = agg.sample_mean (1/N) sum_i (1/L_i) sum_t,
    term = M sg[w] max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) + beta k3(l^ref - l),  r = exp(l - l_old)."""
    return compose("loss.grpo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options),
                   policy_row=_ppo_row(logprobs, old_logprobs, advantages, eps_low, eps_high, log_ratio_clamp),
                   aggregate=_agg.sample_mean)


@formula(
    "loss.dapo",
    title="DAPO: clip-higher PPO per token, token-level aggregation per prompt group (or batch-pooled)",
    inputs=COMMON_INPUTS_TOKEN_ADV,
    params=(
        _eps("eps_low", 0.2, "lower clip range (DAPO section 4.1: 0.2)", hi=1),
        _eps("eps_high", 0.28, "upper clip range, clip-higher (DAPO section 4.1: 0.28)"),
        _clamp_param(),
        _aggregation_param("prompt_mean",
                           "prompt_mean: the paper's Eq. 8, 1/sum_{i in group} L_i per prompt, then the mean over "
                           "prompts (agg.prompt_mean, needs group_ids); token_mean: the batch-pooled token mean of "
                           "verl token-mean and TRL loss_type='dapo' (agg.token_mean)"),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS,
    references=(DAPO, "Khatri et al. 2025, ScaleRL, arXiv:2510.13786, App. A.2 ('prompt average' = DAPO Eq. 8)",
                TRL + " loss_type='dapo' (num_items_in_batch)", VERL + " loss_agg_mode='token-mean'"),
)
def dapo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
         eps_low, eps_high, log_ratio_clamp, aggregation, **options):
    """loss.dapo:  loss = P(term) (prompt_mean) or T(term) (token_mean),
    term = M sg[w] max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) + beta kl."""
    return compose("loss.dapo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options),
                   policy_row=_ppo_row(logprobs, old_logprobs, advantages, eps_low, eps_high, log_ratio_clamp),
                   aggregate=_prompt_or_token_mean(aggregation, group_ids),
                   needs_groups=aggregation == "prompt_mean")


@formula(
    "loss.dr_grpo",
    title="Dr.GRPO: PPO clip per token, token sums divided by a constant K (times the sequence count N)",
    inputs=COMMON_INPUTS_TOKEN_ADV,
    params=(
        _eps("eps_low", 0.2, "lower clip range (Dr.GRPO v2 Table 6: 0.2)", hi=1),
        _eps("eps_high", 0.2, "upper clip range (Dr.GRPO v2 Table 6: 0.2)"),
        _clamp_param(),
        Param("divisor", 3000.0, lo=0, lo_open=True,
              doc="K, the generation budget generate_max_length (the paper's runs: 3000; TRL max_completion_length)"),
        Param("divide_by", "K*N", kind="choice", choices=("K", "K*N"),
              doc="'K*N': sum / (K N), oat's mean over the micro-batch of token sums / K; 'K': sum / K"),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS,
    references=(DRGRPO, OAT, TRL + " loss_type='dr_grpo' (B x max_completion_length)",
                VERL + " loss_agg_mode='seq-mean-token-sum-norm'"),
)
def dr_grpo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
            eps_low, eps_high, log_ratio_clamp, divisor, divide_by, **options):
    """loss.dr_grpo:  loss = C_K(term) = sum_{i,t} m term / (K N)  (or / K),
    term = M sg[w] max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) + beta kl."""
    return compose("loss.dr_grpo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options),
                   policy_row=_ppo_row(logprobs, old_logprobs, advantages, eps_low, eps_high, log_ratio_clamp),
                   aggregate=lambda values, m: _agg.constant(values, m, divisor, divide_by))


@formula(
    "loss.bnpo",
    title="BNPO (TRL): PPO clip per token, token mean over the local batch",
    inputs=COMMON_INPUTS_TOKEN_ADV,
    params=(
        _eps("eps_low", 0.2, "lower clip range (TRL epsilon: 0.2)", hi=1),
        _eps("eps_high", 0.2, "upper clip range (TRL epsilon_high, None => epsilon)"),
        _clamp_param(),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS,
    references=(TRL + " loss_type='bnpo' (sum / max(1, local token count))", LIGER + " loss_type='bnpo'"),
)
def bnpo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
         eps_low, eps_high, log_ratio_clamp, **options):
    """loss.bnpo:  loss = T(term) over this batch (agg.token_mean with the local count),
    term = M sg[w] max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) + beta kl."""
    return compose("loss.bnpo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options),
                   policy_row=_ppo_row(logprobs, old_logprobs, advantages, eps_low, eps_high, log_ratio_clamp),
                   aggregate=_agg.token_mean)


@formula(
    "loss.gspo",
    title="GSPO: PPO clip of the sequence geometric ratio, one loss per sequence, mean over sequences",
    inputs=COMMON_INPUTS_SEQ_ADV,
    params=(
        _eps("eps_low", 3e-4, "left clip range of s_i (GSPO v2 section 5.1: 3e-4)", hi=1),
        _eps("eps_high", 4e-4, "right clip range of s_i (GSPO v2 section 5.1: 4e-4)"),
        Param("log_ratio_max", None, nullable=True,
              doc="placement 'on the mean': if set to c, log s_i is capped from above at c before exp (verl 10; null: no cap)"),
        Param("log_ratio_clamp", None, lo=0, lo_open=True, nullable=True,
              doc="placement 'per token, before the mean': if set to k, each token log-ratio l - l_old is clamped to "
                  "[-k, k] before the sequence mean (Liger-Kernel fork PR #4: 20; null: none)"),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS,
    references=(GSPO, TRL + " importance_sampling_level='sequence', loss_type='grpo'",
                VERL + " compute_policy_loss_gspo, loss_agg_mode='seq-mean-token-mean'"),
)
def gspo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
         eps_low, eps_high, log_ratio_max, log_ratio_clamp, **options):
    """loss.gspo:  loss = S(term),  term_{i,t} = M sg[w] l^GSPO_i + beta kl,
    l^GSPO_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)),  s_i = exp(mean_t (l - l_old));
    with no token factor and beta = 0, loss = (1/N) sum_i l^GSPO_i (GSPO Eq. 5)."""
    return compose("loss.gspo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options),
                   policy_row=_sequence_broadcast(_gspo_seq(logprobs, old_logprobs, advantages, eps_low, eps_high,
                                                            log_ratio_max, log_ratio_clamp)),
                   aggregate=_agg.sample_mean)


@formula(
    "loss.cispo",
    title="CISPO: -sg[w] A l per token, token-level aggregation per prompt group (or batch-pooled)",
    inputs=COMMON_INPUTS_TOKEN_ADV,
    params=(
        Param("cap_form", "relative", kind="choice", choices=("relative", "absolute"),
              doc="relative: w = clip(r, 1 - eps_low, 1 + eps_high) (MiniMax-M1 Eq. 5); absolute: w = min(r, eps_high) "
                  "(ScaleRL, TRL, Liger)"),
        Param("eps_low", None, lo=0, hi=1, nullable=True,
              doc="relative form only: lower bound 1 - eps_low (null: none, MiniMax-M1's 'large' eps_low)"),
        Param("eps_high", 0.2, lo=0, lo_open=True,
              doc="relative: upper bound 1 + eps_high (MiniMax-M1 publishes no value); absolute: the cap (TRL: 5.0)"),
        _clamp_param(),
        _aggregation_param("prompt_mean",
                           "prompt_mean: MiniMax-M1 Eq. 4, 1/sum_{i in group} L_i per prompt (agg.prompt_mean, needs "
                           "group_ids); token_mean: the batch-pooled token mean of TRL loss_type='cispo' and verl"),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS + ("w_{i,t}, CISPO's truncated ratio (the policy gradient is -w A)",),
    references=(CISPO, "Khatri et al. 2025, ScaleRL, arXiv:2510.13786, section 3.2 Eq. 4 (absolute cap, prompt average)",
                TRL + " loss_type='cispo'", VERL + " compute_policy_loss_cispo"),
)
def cispo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
          cap_form, eps_low, eps_high, log_ratio_clamp, aggregation, **options):
    """loss.cispo:  loss = P(term) or T(term),  term = M sg[w^IS] (-sg[w] A l) + beta kl,
    w = clip(r, 1 - eps_low, 1 + eps_high) (relative) or min(r, eps_high) (absolute)."""
    require(cap_form == "relative" or eps_low is None,
            f"loss.cispo: parameter 'eps_low' applies only to cap_form='relative'; it must be null, got {eps_low!r}")

    def row(i, ts):
        return [cispo_loss(cispo_weight(token_ratio(value_of(logprobs[i][t]), old_logprobs[i][t], log_ratio_clamp),
                                        cap_form, eps_low, eps_high),
                           token_adv(advantages, i, t), logprobs[i][t]) for t in ts]

    return compose("loss.cispo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options), policy_row=row, aggregate=_prompt_or_token_mean(aggregation, group_ids),
                   needs_groups=aggregation == "prompt_mean")


@formula(
    "loss.sapo",
    title="SAPO: soft sigmoid gate of the token ratio, sample-mean aggregation",
    inputs=COMMON_INPUTS_TOKEN_ADV,
    params=(
        Param("tau_pos", 1.0, lo=0, lo_open=True, doc="gate temperature where A > 0 (SAPO section 5.1: 1.0)"),
        Param("tau_neg", 1.05, lo=0, lo_open=True, doc="gate temperature where A <= 0 (SAPO section 5.1: 1.05)"),
        _clamp_param(),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS,
    references=(SAPO, TRL + " loss_type='sapo' (grpo aggregation)", VERL + " compute_policy_loss_sapo"),
)
def sapo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
         tau_pos, tau_neg, log_ratio_clamp, **options):
    """loss.sapo:  loss = S(term),  term = M sg[w] (-A (4/tau) sigma(tau (r - 1))) + beta kl."""
    def row(i, ts):
        out = []
        for t in ts:
            a = token_adv(advantages, i, t)
            log_r = clamp_log_ratio(logprobs[i][t] - old_logprobs[i][t], log_ratio_clamp)
            out.append(sapo_gate(log_r, sapo_tau(a, tau_pos, tau_neg)) * -a)
        return out

    return compose("loss.sapo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options), policy_row=row, aggregate=_agg.sample_mean)


@formula(
    "loss.gmpo",
    title="GMPO: -A_i times the geometric mean of the sign-aware clipped token ratios, mean over sequences",
    inputs=COMMON_INPUTS_SEQ_ADV,
    params=(
        Param("eps_low", 0.4, lo=0, doc="log-space lower bound delta (GMPO: 0.4)"),
        Param("eps_high", 0.4, lo=0, doc="log-space upper bound delta (GMPO: 0.4)"),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS,
    references=(GMPO, "callsys/GMPO 205b2bf train_zero_math_gmpo.py", VERL + " compute_policy_loss_geo_mean",
                "trl experimental trl/experimental/gmpo/gmpo_trainer.py"),
)
def gmpo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
         eps_low, eps_high, **options):
    """loss.gmpo:  loss = S(term),  term_{i,t} = M sg[w] l^GMPO_i + beta kl,
    l^GMPO_i = -A_i exp((1/L_i) sum_t d~_{i,t}) (surrogate.gmpo)."""
    def seq_loss(i, ts):
        a = advantages[i]
        logs = [gmpo_clipped_log_ratio(logprobs[i][t] - old_logprobs[i][t], a, eps_low, eps_high) for t in ts]
        return exp(total(logs) / len(ts)) * -a

    return compose("loss.gmpo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options), policy_row=_sequence_broadcast(seq_loss), aggregate=_agg.sample_mean)


@formula(
    "loss.luspo",
    title="LUSPO: GSPO's per-sequence loss weighted by the sequence length (token sums, mean over sequences)",
    inputs=COMMON_INPUTS_SEQ_ADV,
    params=(
        Param("ratio_level", "sequence", kind="choice", choices=("sequence", "token"),
              doc="sequence: the GSPO sequence loss at every token (the LUSPO paper; TRL importance_sampling_level="
                  "'sequence'); token: the PPO clip loss of the token ratio (TRL's default importance_sampling_level)"),
        _eps("eps_low", 3e-4, "lower clip range (GSPO v2's 3e-4, which LUSPO builds on)", hi=1),
        _eps("eps_high", 4e-4, "upper clip range (GSPO v2's 4e-4)"),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS,
    references=(LUSPO, TRL + " loss_type='luspo' ((1/B) sum_i sum_t m loss; trl PR #6654)",
                LIGER + " loss_type='luspo' (unmasked sum ell L_i / (B T_ell): equal only for sequence-level ell)"),
)
def luspo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
          ratio_level, eps_low, eps_high, **options):
    """loss.luspo:  loss = (1/N) sum_i sum_t m term_{i,t} (agg.seq_mean_token_sum),
    term_{i,t} = M sg[w] l^GSPO_i + beta kl (ratio_level sequence: loss = (1/N) sum_i L_i l^GSPO_i)
    or M sg[w] max(-A r, -A clip(r, ...)) + beta kl (ratio_level token)."""
    if ratio_level == "sequence":
        row = _sequence_broadcast(_gspo_seq(logprobs, old_logprobs, advantages, eps_low, eps_high, None))
    else:
        row = _ppo_row(logprobs, old_logprobs, advantages, eps_low, eps_high, None)
    return compose("loss.luspo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options), policy_row=row, aggregate=_agg.seq_mean_token_sum)


@formula(
    "loss.vespo",
    title="VESPO: -sg[phi_i] A_i l per token, token mean over the batch (TRL's dapo normalizer)",
    inputs=COMMON_INPUTS_SEQ_ADV,
    params=(
        Param("k_pos", 2.0, lo=0, doc="shape k where A >= 0 (TRL vespo_k_pos)"),
        Param("lambda_pos", 3.0, lo=0, doc="rate lambda where A >= 0 (TRL vespo_lambda_pos)"),
        Param("k_neg", 3.0, lo=0, doc="shape k where A < 0 (TRL vespo_k_neg)"),
        Param("lambda_neg", 2.0, lo=0, doc="rate lambda where A < 0 (TRL vespo_lambda_neg)"),
        Param("lambda_min", 1e-4, lo=0, doc="lambda is floored at lambda_min"),
        Param("log_ratio_clamp", 20.0, lo=0, lo_open=True, nullable=True,
              doc="token log-ratio l - l_old clamped to [-c, c] before summing (TRL: 20; null: none)"),
        Param("min_weight", 1e-8, lo=0, hi=1, lo_open=True, hi_open=True,
              doc="floor of w and of each token IS ratio (log-space bound log(min_weight))"),
        Param("max_log_weight", 20.0, lo=0, lo_open=True, doc="upper bound of log w and of each token log IS ratio"),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS + ("phi_i, VESPO's sequence weight (the policy gradient is -phi_i A_i)",),
    references=(VESPO, TRL + " loss_type='vespo' (dapo normalizer num_items_in_batch)", LIGER + " loss_type='vespo'"),
)
def vespo(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
          k_pos, lambda_pos, k_neg, lambda_neg, lambda_min, log_ratio_clamp, min_weight, max_log_weight, **options):
    """loss.vespo:  loss = T(term),  term = M sg[w] (-sg[phi_i] A_i l) + beta kl,
    phi_i of surrogate.vespo; sampler_logprobs, when given, are folded into phi_i (TRL), never as w^IS."""
    opts = _opts(options)
    require(opts["is_level"] == "none",
            f"loss.vespo: parameter 'is_level' must be 'none', got {opts['is_level']!r}: VESPO folds the train/inference "
            f"ratio into phi_i when sampler_logprobs is given (TRL never multiplies it in again)")

    def row(i, ts):
        log_is = () if sampler_logprobs is None else [old_logprobs[i][t] - sampler_logprobs[i][t] for t in ts]
        log_w = vespo_log_weight([value_of(logprobs[i][t]) - old_logprobs[i][t] for t in ts], log_is,
                                 log_ratio_clamp=log_ratio_clamp, min_weight=min_weight, max_log_weight=max_log_weight)
        phi = vespo_phi(log_w, advantages[i], k_pos=k_pos, lambda_pos=lambda_pos, k_neg=k_neg,
                        lambda_neg=lambda_neg, lambda_min=lambda_min)
        return [cispo_loss(phi, advantages[i], logprobs[i][t]) for t in ts]

    return compose("loss.vespo", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=opts, policy_row=row, aggregate=_agg.token_mean, sampler_folded=True)


@formula(
    "loss.minirl",
    title="MiniRL: sum_t M_t sg[min(pi/mu_old, C)] A l, decoupled-PPO token mask, mean over sequences of token sums",
    inputs=(LOGPROBS, OLD_LOGPROBS, MASK, ADV_SEQ_OR_TOKEN, SAMPLER_REQUIRED, REF_OPTIONAL, GROUP_IDS_OPTIONAL,
            ENTROPY_OPTIONAL),
    params=(
        _eps("eps_low", 0.2, "decoupled-PPO mask: drop A < 0 tokens with r < 1 - eps_low (MiniRL section 4.2: 0.2)", hi=1),
        _eps("eps_high", 0.27, "decoupled-PPO mask: drop A > 0 tokens with r > 1 + eps_high (MiniRL section 4.2: 0.27)"),
        Param("is_cap", 5.0, lo=0, lo_open=True, nullable=True,
              doc="TIS cap C of the IS weight min(pi_theta / mu_old, C) (MiniRL section 4.2: 5; null: no cap)"),
    ) + _option_params(),
    outputs=OUTPUTS,
    differentiable=("logprobs",),
    grad_of="loss",
    stop_gradients=STOP_GRADIENTS + ("min(exp(l - l^mu), C), MiniRL's IS weight (the policy gradient is -M w A)",),
    references=(MINIRL, "Hilton et al. 2022, Batch size-invariance for policy optimization (decoupled PPO), arXiv:2110.00641"),
)
def minirl(logprobs, old_logprobs, mask, advantages, sampler_logprobs, ref_logprobs, group_ids, entropy, *,
           eps_low, eps_high, is_cap, **options):
    """loss.minirl:  loss = (1/N) sum_i sum_t m term_{i,t} (agg.seq_mean_token_sum),
    term = M^opsm M^ent sg[w^IS] (-M_t sg[min(exp(l - l^mu), C)] A l) + beta kl,
    M_t = 0 iff (A > 0 and r > 1 + eps_high) or (A < 0 and r < 1 - eps_low), r = exp(l - l_old)."""
    def row(i, ts):
        out = []
        for t in ts:
            a = token_adv(advantages, i, t)
            r = token_ratio(value_of(logprobs[i][t]), old_logprobs[i][t])
            if (a > 0 and r > 1 + eps_high) or (a < 0 and r < 1 - eps_low):
                out.append(mpf(0))  # M_t = 0: dropped by the decoupled-PPO mask (kept in the denominator)
                continue
            w = truncate_weight(token_ratio(value_of(logprobs[i][t]), sampler_logprobs[i][t]), None, is_cap)
            out.append(cispo_loss(w, a, logprobs[i][t]))
        return out

    return compose("loss.minirl", logprobs=logprobs, old_logprobs=old_logprobs, mask=mask, advantages=advantages,
                   sampler_logprobs=sampler_logprobs, ref_logprobs=ref_logprobs, group_ids=group_ids, entropy=entropy,
                   opts=_opts(options), policy_row=row, aggregate=_agg.seq_mean_token_sum, sampler_required=True)
