"""Named predicates over a golden case's inputs, for declarations (spec/verdicts.md).

A capability or a rule names input forms by these predicates (``inputs = ["empty_row"]``, or ``"not
per_token_advantages"``).  Each function's docstring is its definition.  ``case`` is a golden case; its inputs
are read through :func:`inputs_of` (generated scale-case inputs included), real values as Python floats, masks
as bools.  A predicate that concerns an input the case does not have is false.
"""

from __future__ import annotations

import math


def inputs_of(case: dict) -> dict:
    values = case.get("$input_values")      # a production-size check's inputs, decoded (conformance/check/)
    if values is not None:
        return values
    from ..corpus.inputs import case_inputs

    return case_inputs(case)


def _rows(x):
    return x if isinstance(x, list) else []


def _mask(case):
    return inputs_of(case).get("mask")


def _real_inputs(case):
    from pgspec.reference import REGISTRY

    f = REGISTRY[case["formula"]]
    ins = inputs_of(case)
    for name, value in ins.items():
        try:
            kind = f.input(name).kind
        except Exception:  # noqa: BLE001 - an input the registry does not know is not real
            continue
        if kind == "real":
            yield name, value


def _nonfinite(x) -> bool:
    if isinstance(x, list):
        return any(_nonfinite(v) for v in x)
    return isinstance(x, float) and not math.isfinite(x)


def nonfinite_masked(case: dict) -> bool:
    """Some real [B,T] (or [B,T,V]) input holds NaN or an infinity at a position whose mask is false."""
    mask = _mask(case)
    if mask is None:
        return False
    for _, value in _real_inputs(case):
        if not isinstance(value, list) or len(value) != len(mask) or not value or not isinstance(value[0], list):
            continue
        for row, mrow in zip(value, mask):
            if len(row) != len(mrow):
                continue
            if any(not m and _nonfinite(v) for v, m in zip(row, mrow)):
                return True
    return False


def empty_row(case: dict) -> bool:
    """Some sequence (row of ``mask``) has no unmasked token, while some other row has one."""
    mask = _mask(case)
    if not mask:
        return False
    counts = [sum(1 for m in row if m) for row in mask]
    return any(c == 0 for c in counts) and any(c > 0 for c in counts)


def all_masked(case: dict) -> bool:
    """No token of the batch is unmasked (``mask`` is false everywhere)."""
    mask = _mask(case)
    return mask is not None and not any(m for row in mask for m in row)


def per_token_advantages(case: dict) -> bool:
    """``advantages`` is given per token, shape [B,T], rather than per sequence [B]."""
    adv = inputs_of(case).get("advantages")
    return isinstance(adv, list) and bool(adv) and isinstance(adv[0], list)


def _groups(case):
    g = inputs_of(case).get("group_ids")
    if not isinstance(g, list):
        return None
    sizes = {}
    for x in g:
        sizes[x] = sizes.get(x, 0) + 1
    return sizes


def singleton_group(case: dict) -> bool:
    """Some prompt group (value of ``group_ids``) holds exactly one sequence."""
    sizes = _groups(case)
    return bool(sizes) and any(n == 1 for n in sizes.values())


def unequal_groups(case: dict) -> bool:
    """The prompt groups (values of ``group_ids``) do not all hold the same number of sequences,
    or the sequences of one group are not contiguous in the batch."""
    g = inputs_of(case).get("group_ids")
    if not isinstance(g, list) or not g:
        return False
    sizes = _groups(case)
    if len(set(sizes.values())) > 1:
        return True
    seen, prev = set(), object()
    for x in g:
        if x != prev and x in seen:
            return True
        seen.add(x)
        prev = x
    return False


def packed_documents(case: dict) -> bool:
    """``document_ids`` is given and some row holds more than one document."""
    d = inputs_of(case).get("document_ids")
    if not isinstance(d, list):
        return False
    return any(len(set(row)) > 1 for row in d if isinstance(row, list))


def predicates() -> dict:
    """{name: function} for every public predicate of this module, predicates_precision and predicates_clamps."""
    import inspect
    import sys

    from . import predicates_clamps as pc, predicates_precision as pp
    return {n: fn for m in (sys.modules[__name__], pp, pc) for n, fn in inspect.getmembers(m, inspect.isfunction)
            if not n.startswith("_") and fn.__module__ == m.__name__ and n not in ("inputs_of", "predicates")}


def _params(case: dict) -> dict:
    from ..corpus.inputs import resolved_params

    return resolved_params(case)


def reject_seq_max_k1(case: dict) -> bool:
    """The case is an ``is.reject`` case that rejects by the k1 statistic at level ``seq_max``."""
    if case.get("formula") != "is.reject":
        return False
    p = _params(case)
    return p.get("estimator") == "k1" and p.get("level") == "seq_max"


def reject_lower_bound_k2_k3(case: dict) -> bool:
    """The case is an ``is.reject`` case with the k2 or k3 estimator and a lower bound (``lower`` not null)."""
    if case.get("formula") != "is.reject":
        return False
    p = _params(case)
    return p.get("estimator") in ("k2", "k3") and p.get("lower") is not None


def reject_upper_not_positive_k2_k3(case: dict) -> bool:
    """The case is an ``is.reject`` case with the k2 or k3 estimator and an ``upper`` bound that is a
    number <= 0."""
    if case.get("formula") != "is.reject":
        return False
    p = _params(case)
    return p.get("estimator") in ("k2", "k3") and p.get("upper") is not None and _real(p["upper"]) <= 0


def truncated_is_lower_bound(case: dict) -> bool:
    """The case's importance-sampling correction truncates (``is_level`` not ``"none"``, ``is_mode`` =
    ``"truncate"``) and has a lower bound (``is_c_min`` not null)."""
    p = _params(case)
    return (p.get("is_level", "none") != "none" and p.get("is_mode") == "truncate"
            and p.get("is_c_min") is not None)


def clamped_kl_k1_k2_abs(case: dict) -> bool:
    """The case has a KL term (``beta`` > 0) with the k1, k2 or abs estimator and sets one of its clamps
    (``kl_log_ratio_min``, ``kl_log_ratio_max``, ``kl_output_min`` or ``kl_output_max`` not null)."""
    p = _params(case)
    beta = p.get("beta")
    try:
        beta = float(beta) if beta is not None else 0.0
    except (TypeError, ValueError):
        return False
    if not beta > 0 or p.get("kl_estimator") not in ("k1", "k2", "abs"):
        return False
    return any(p.get(k) is not None for k in ("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max"))
# --- added for the trl, liger and areal declarations -------------------------------------------------


def _real(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def large_log_ratio(case: dict) -> bool:
    """At some unmasked position, |logprobs - old_logprobs| >= 20 or |ref_logprobs - logprobs| >= 20
    (for the inputs the case gives): exp of such a log-ratio is beyond e^20 = 4.9e8 (float32's exp
    overflows past 88.7)."""
    from .predicates_precision import _largest_unmasked_log_ratio

    return _largest_unmasked_log_ratio(case) >= 20


def prompt_mean_over_groups(case: dict) -> bool:
    """The parameter ``aggregation`` is ``prompt_mean`` and more than one prompt group (value of
    ``group_ids``) holds an unmasked token (with one such group the prompt mean is the pooled token
    mean)."""
    from ..corpus.inputs import resolved_params

    if resolved_params(case).get("aggregation") != "prompt_mean":
        return False
    ins = inputs_of(case)
    g, mask = ins.get("group_ids"), ins.get("mask")
    if not isinstance(g, list) or not isinstance(mask, list):
        return False
    return len({str(x) for x, row in zip(g, mask) if any(row)}) > 1


def sampler_logprobs_given(case: dict) -> bool:
    """The input ``sampler_logprobs`` (the behaviour policy's log-probs) is given."""
    return isinstance(inputs_of(case).get("sampler_logprobs"), list)


def some_row_empty(case: dict) -> bool:
    """Some sequence (row of ``mask``) has no unmasked token; an all-masked batch counts too (unlike
    ``empty_row``)."""
    mask = _mask(case)
    return bool(mask) and any(not any(row) for row in mask)


def group_sizes_differ(case: dict) -> bool:
    """The prompt groups (values of ``group_ids``) do not all hold the same number of sequences
    (whether a group's rows are contiguous is not considered; ``unequal_groups`` also counts that)."""
    sizes = _groups(case)
    return bool(sizes) and len(set(sizes.values())) > 1


def c_max_at_most_one(case: dict) -> bool:
    """The parameter ``c_max`` (``is_c_max`` of a loss recipe) is a number <= 1: a ratio band whose
    upper bound does not exceed 1."""
    from ..corpus.inputs import resolved_params

    p = resolved_params(case)
    for name in ("c_max", "is_c_max"):
        v = p.get(name)
        if v is not None and not isinstance(v, bool) and _real(v) <= 1:
            return True
    return False


def c_min_not_positive(case: dict) -> bool:
    """The parameter ``c_min`` (``is_c_min`` of a loss recipe) is a number <= 0: a ratio band whose
    lower bound admits every ratio."""
    p = _params(case)
    for name in ("c_min", "is_c_min"):
        v = p.get(name)
        if v is not None and not isinstance(v, bool) and _real(v) <= 0:
            return True
    return False


def one_sided_output_clamp(case: dict) -> bool:
    """The case sets exactly one of the two KL value clamps (``output_min`` / ``output_max`` of a
    kl.* case, ``kl_output_min`` / ``kl_output_max`` of a loss recipe with a KL term)."""
    p = _params(case)
    for lo, hi in (("output_min", "output_max"), ("kl_output_min", "kl_output_max")):
        if lo in p or hi in p:
            if (p.get(lo) is None) != (p.get(hi) is None):
                return True
    return False


def kl_log_ratio_clamp_without_k3(case: dict) -> bool:
    """The case has a KL term (``beta`` > 0) whose ``kl_estimator`` is not k3 and sets a log-ratio
    clamp of it (``kl_log_ratio_min`` or ``kl_log_ratio_max`` not null)."""
    p = _params(case)
    if not _real(p.get("beta") if p.get("beta") is not None else 0) > 0 or p.get("kl_estimator") == "k3":
        return False
    return p.get("kl_log_ratio_min") is not None or p.get("kl_log_ratio_max") is not None


def zero_std_group(case: dict) -> bool:
    """Some prompt group (value of ``group_ids``) has all its ``rewards`` equal (a group of one
    included), so that group's standard deviation is 0."""
    ins = inputs_of(case)
    g, r = ins.get("group_ids"), ins.get("rewards")
    if not isinstance(g, list) or not isinstance(r, list):
        return False
    by: dict = {}
    for x, v in zip(g, r):
        by.setdefault(str(x), []).append(_real(v))
    return any(len(set(vs)) == 1 for vs in by.values())


def zero_logprob(case: dict) -> bool:
    """Some unmasked ``logprobs`` entry is 0 or positive (probability 1): a framework fed through
    logits cannot carry the gradient of such a log-prob back through a two-class softmax."""
    x, m = inputs_of(case).get("logprobs"), _mask(case)
    if not isinstance(x, list) or m is None:
        return False
    for row, mrow in zip(x, m):
        for v, keep in zip(row, mrow):
            if keep and float(v) >= 0:
                return True
    return False


# the sequence-level formulas whose clip compares a row's geometric ratio exp(mean(l - l_old))
_SEQUENCE_CLIPPED = ("surrogate.gspo", "loss.gspo")


def ratio_near_clip_bound(case: dict) -> bool:
    """The case's formula clips a ratio (it has ``eps_low`` or ``eps_high``) and some ratio it clips
    lies within a relative 2^-7 (bfloat16's spacing just above 1; float16's is finer) of a clip bound
    1 - eps_low or 1 + eps_high: a token's ratio exp(logprobs - old_logprobs) at an unmasked position,
    or, for GSPO and sequence-level LUSPO, a row's geometric ratio exp(mean of its unmasked
    log-ratios).  Rounding the ratio or the bound to a 16-bit dtype can put it on the other side.
    A log-ratio of exactly 0 at a bound of exactly 1 (eps = 0) is left out: exp(0) = 1 and the bound are
    exact in every dtype, so neither rounds to the other side."""
    params = _params(case)
    lo, hi = params.get("eps_low"), params.get("eps_high")
    bounds = [1 - _real(lo)] if lo is not None else []
    bounds += [1 + _real(hi)] if hi is not None else []
    bounds = [b for b in bounds if math.isfinite(b)]
    ins = inputs_of(case)
    mask, lp, old = ins.get("mask"), ins.get("logprobs"), ins.get("old_logprobs")
    if not bounds or not all(isinstance(x, list) for x in (mask, lp, old)):
        return False
    sequence = case["formula"] in _SEQUENCE_CLIPPED or (case["formula"] == "loss.luspo"
                                                         and params.get("ratio_level") == "sequence")
    ratios = []
    for r1, r2, mrow in zip(lp, old, mask):
        if not (isinstance(r1, list) and isinstance(r2, list)):
            continue
        logs = [_real(a) - _real(b) for a, b, m in zip(r1, r2, mrow) if m]
        logs = [x for x in logs if math.isfinite(x)]
        if sequence:
            ratios += [sum(logs) / len(logs)] if logs else []
        else:
            ratios += logs
    return any(abs(math.exp(min(x, 700.0)) - b) <= 2.0 ** -7 * b and not (x == 0 and b == 1)
               for x in ratios for b in bounds)


# the aggregator of each loss recipe's policy term (reference/loss.py): what kl_aggregation = "policy"
# aggregates the KL term with; loss.dapo and loss.cispo by their ``aggregation`` parameter
_RECIPE_AGGREGATOR = {
    "loss.grpo": "sample_mean", "loss.sapo": "sample_mean", "loss.gspo": "sample_mean", "loss.gmpo": "sample_mean",
    "loss.bnpo": "token_mean", "loss.vespo": "token_mean", "loss.dr_grpo": "constant",
    "loss.luspo": "seq_mean_token_sum", "loss.minirl": "seq_mean_token_sum",
}


def _kl_aggregator(case: dict):
    """How the case's KL term is aggregated: None without one (beta 0), else the agg.* name."""
    params = _params(case)
    if not _real(params.get("beta") or 0) > 0:
        return None
    if params.get("kl_aggregation", "policy") != "policy":
        return params["kl_aggregation"]
    if case["formula"] in ("loss.dapo", "loss.cispo"):
        return params.get("aggregation")
    return _RECIPE_AGGREGATOR.get(case["formula"], "other")


def kl_term_token_mean(case: dict) -> bool:
    """The case has no KL term (``beta`` = 0), or its KL term is aggregated as the batch's token
    mean: ``kl_aggregation = token_mean``, or ``policy`` in a recipe whose policy term is a token
    mean (``loss.bnpo``, ``loss.vespo``; ``loss.dapo`` and ``loss.cispo`` with ``aggregation =
    token_mean``)."""
    return _kl_aggregator(case) in (None, "token_mean")


def kl_term_sample_mean(case: dict) -> bool:
    """The case has no KL term (``beta`` = 0), or its KL term is aggregated as a mean of the
    sequences' token means: ``kl_aggregation = sample_mean``, or ``policy`` in a recipe whose policy
    term is a sample mean (``loss.grpo``, ``loss.sapo``, ``loss.gspo``, ``loss.gmpo``)."""
    return _kl_aggregator(case) in (None, "sample_mean")


def opsm_sequence_gate_on_token_advantages(case: dict) -> bool:
    """The case sets OPSM (a ``loss.*`` case with ``opsm_delta`` not null, or a ``mask.opsm`` case),
    gives per-token advantages ([B,T]) and gates a sequence by its mean advantage
    (``opsm_advantage_gate``, for ``mask.opsm`` ``advantage_gate``, = ``sequence_mean``): an
    implementation that gates each token by its own advantage (``token``) reads the same inputs
    another way."""
    params = _params(case)
    if case.get("formula") == "mask.opsm":
        return params.get("advantage_gate") == "sequence_mean" and per_token_advantages(case)
    return (params.get("opsm_delta") is not None and params.get("opsm_advantage_gate") == "sequence_mean"
            and per_token_advantages(case))


def mask_gaps(case: dict) -> bool:
    """Some row of ``mask`` has a masked token between two unmasked ones (its unmasked tokens are not
    one contiguous run)."""
    for row in _rows(_mask(case)):
        on = [t for t, m in enumerate(row) if m]
        if on and on[-1] - on[0] + 1 != len(on):
            return True
    return False


def eps_asymmetric(case: dict) -> bool:
    """The case's formula has both ``eps_low`` and ``eps_high`` and their values (registry defaults
    where unset) differ."""
    from ..corpus.inputs import resolved_params

    p = resolved_params(case)
    if "eps_low" not in p or "eps_high" not in p:
        return False
    lo, hi = p["eps_low"], p["eps_high"]
    if lo is None or hi is None:
        return lo is not hi
    return _real(lo) != _real(hi)


def _transformed_rows(case: dict):
    """The transformed logits z'_v = softcap_c(s z_v) / tau (logprob.*'s logit_scale, softcap and
    temperature) of every unmasked position of a case with ``logits`` [B,T,V], as float lists."""
    ins = inputs_of(case)
    logits, mask = ins.get("logits"), ins.get("mask")
    if not isinstance(logits, list) or not isinstance(mask, list):
        return
    p = _params(case)
    s, tau, c = _real(p.get("logit_scale", 1)), _real(p.get("temperature", 1)), p.get("softcap")
    c = None if c is None else _real(c)
    if not (tau > 0 and math.isfinite(tau) and math.isfinite(s)) or (c is not None and not c > 0):
        return      # parameters the spec rejects (an expected-error case): no transformed logits
    for row, mrow in zip(logits, mask):
        for z, m in zip(_rows(row), _rows(mrow)):
            if m and isinstance(z, list) and z:
                yield [(c * math.tanh(s * _real(v) / c) if c is not None else s * _real(v)) / tau for v in z]


def logits_exceed_entropy(case: dict) -> bool:
    """At some unmasked position the largest magnitude of the transformed logits z' (``logit_scale``,
    ``softcap``, then ``temperature``, as logprob.* has them) exceeds the entropy H of their softmax
    (max_v |z'_v| > H): a near-deterministic row (H small), or large logits.  There an entropy formed
    as log Z - sum_v p_v z'_v subtracts two numbers of size about max |z'| to get H, and loses
    max |z'| / H of its relative accuracy."""
    for z in _transformed_rows(case):
        if not all(math.isfinite(v) for v in z):
            continue
        top = max(z)
        e = [math.exp(v - top) for v in z]
        total = sum(e)
        entropy = math.log(total) - sum(w * (v - top) for w, v in zip(e, z)) / total
        if max(abs(v) for v in z) > entropy:
            return True
    return False


def is_mask_keeps_nothing(case: dict) -> bool:
    """An IcePop mask rejects every token while some position is unmasked: an ``is.*.mask`` case whose
    expected ``keep`` (the reference's) is false at every unmasked position (a case that stores its
    outputs at sampled positions only, as the generated scale cases, is read from its inputs), or a ``loss.*`` case with
    ``is_level`` token, sequence or geometric and ``is_mode`` mask, whose every IS ratio rho (the
    token's e^(l_old - l_mu), the sequence's product or geometric mean over its unmasked tokens, the
    log-ratio clamped by the log-ratio clamp where set) lies outside the kept band."""
    f = str(case.get("formula", ""))
    if f.startswith("loss."):
        p = _params(case)
        if p.get("is_level", "none") == "none" or p.get("is_mode") != "mask":
            return False
        return _icepop_rejects_all(case, p["is_level"], p.get("is_c_min"), p.get("is_c_max"),
                                   p.get("is_log_ratio_clamp"))
    if not f.startswith("is.") or not f.endswith(".mask"):
        return False
    keep = (case.get("outputs") or {}).get("keep")
    mask = _mask(case)
    if not isinstance(mask, list):
        return False
    if not isinstance(keep, list) or case.get("positions") is not None:
        # no keep per token: a generated scale case stores its outputs at sampled positions only
        p = _params(case)
        return _icepop_rejects_all(case, f.split(".")[1], p.get("c_min"), p.get("c_max"), p.get("log_ratio_clamp"))
    seen = False
    for krow, mrow in zip(keep, mask):
        for k, m in zip(_rows(krow), _rows(mrow)):
            if m:
                seen = True
                if k not in (False, 0, "0", "false", "False", 0.0):
                    return False
    return seen


def _icepop_rejects_all(case: dict, level: str, lo, hi, clamp) -> bool:
    """Every IS ratio of ``level`` (token, sequence, geometric) outside [lo, hi] (None: unbounded),
    and at least one ratio (some token unmasked)."""
    ins = inputs_of(case)
    old, sampler, mask = ins.get("old_logprobs"), ins.get("sampler_logprobs"), ins.get("mask")
    if not (isinstance(old, list) and isinstance(sampler, list) and isinstance(mask, list)):
        return False
    logs = []          # log rho of every unmasked token (token level) or every non-empty sequence
    for orow, srow, mrow in zip(old, sampler, mask):
        d = [_real(o) - _real(q) for o, q, m in zip(_rows(orow), _rows(srow), _rows(mrow)) if m]
        if level == "token":
            logs += d
        elif d:
            logs.append(math.fsum(d) / (len(d) if level == "geometric" else 1))
    if not logs:
        return False
    for x in logs:
        if clamp is not None:
            x = min(max(x, -_real(clamp)), _real(clamp))
        rho = math.exp(x) if x < 709 else math.inf
        if (lo is None or rho >= _real(lo)) and (hi is None or rho <= _real(hi)):
            return False   # kept
    return True


def _k3_estimate(case: dict):
    """The name of the upper value clamp and its value, when the case computes k3 (kl.k3,
    kl.k3_straight_through, or a loss.* KL term of kl_estimator k3 or k3_straight_through with
    beta > 0); else None."""
    f = str(case.get("formula", ""))
    p = _params(case)
    if f in ("kl.k3", "kl.k3_straight_through"):
        return "output_max", p.get("output_max")
    if f.startswith("loss.") and p.get("kl_estimator") in ("k3", "k3_straight_through") and \
            _real(p.get("beta", 0)) > 0:
        return "kl_output_max", p.get("kl_output_max")
    return None


def k3_above_10_unclamped(case: dict) -> bool:
    """The case computes k3 (kl.k3, kl.k3_straight_through, or a loss.* KL term with kl_estimator
    k3 or k3_straight_through and beta > 0) with no upper value clamp (``output_max`` /
    ``kl_output_max`` null), and at some unmasked position k3(x) = e^x - 1 - x of x = ref_logprobs -
    logprobs exceeds 10 (every |x| > 20 does)."""
    est = _k3_estimate(case)
    if est is None or est[1] is not None:
        return False
    ins = inputs_of(case)
    lp, ref, mask = ins.get("logprobs"), ins.get("ref_logprobs"), ins.get("mask")
    if not isinstance(lp, list) or not isinstance(ref, list) or not isinstance(mask, list):
        return False
    for r1, r2, mrow in zip(lp, ref, mask):
        for a, b, m in zip(_rows(r1), _rows(r2), _rows(mrow)):
            x = _real(b) - _real(a)
            if m and math.isfinite(x) and (abs(x) > 20 or math.expm1(x) - x > 10):
                return True
    return False


def rollout_log_ratio_beyond_20(case: dict) -> bool:
    """The case sets no clamp of the rollout log-ratio (an is.* ``log_ratio_clamp``; a loss.* recipe with
    ``is_level`` set and no ``is_log_ratio_clamp``), and old_logprobs - sampler_logprobs (logprobs where
    old_logprobs is not given) exceeds 20 in magnitude at some unmasked position, or its sum over a row does."""
    p, recipe = _params(case), str(case.get("formula", "")).startswith("loss.")
    if p.get("is_log_ratio_clamp" if recipe else "log_ratio_clamp") is not None or recipe and \
            p.get("is_level", "none") == "none":
        return False
    ins = inputs_of(case)
    num = ins.get("old_logprobs") if isinstance(ins.get("old_logprobs"), list) else ins.get("logprobs")
    mu, mask = ins.get("sampler_logprobs"), ins.get("mask")
    if not isinstance(num, list) or not isinstance(mu, list) or not isinstance(mask, list):
        return False
    for r1, r2, mrow in zip(num, mu, mask):
        xs = [_real(a) - _real(b) for a, b, m in zip(_rows(r1), _rows(r2), _rows(mrow)) if m]
        if any(abs(x) > 20 for x in xs) or abs(math.fsum(xs)) > 20:
            return True
    return False


_KL_ESTIMATES = {"k1": lambda x: -x, "k2": lambda x: 0.5 * x * x, "abs": abs,
                 "k3": lambda x: math.expm1(x) - x if x < 700 else math.inf,
                 "k3_straight_through": lambda x: math.expm1(x) - x if x < 700 else math.inf}


def kl_estimate_beyond_10_unclamped(case: dict) -> bool:
    """The case computes a KL estimate (kl.k1, kl.k2, kl.k3, kl.abs or kl.k3_straight_through, or a
    loss.* KL term with beta > 0 and one of those as ``kl_estimator``), and at some unmasked position
    the estimate of x = ref_logprobs - logprobs, after the case's own log-ratio clamp, is above 10
    where the case sets no upper value clamp or below -10 where it sets no lower one."""
    f = str(case.get("formula", ""))
    p = _params(case)
    if f.startswith("kl.") and f[3:] in _KL_ESTIMATES:
        est, pre = f[3:], ""
    elif f.startswith("loss.") and p.get("kl_estimator") in _KL_ESTIMATES and \
            _real(p.get("beta") if p.get("beta") is not None else 0) > 0:
        est, pre = p["kl_estimator"], "kl_"
    else:
        return False
    lo, hi = p.get(pre + "log_ratio_min"), p.get(pre + "log_ratio_max")
    omin, omax = p.get(pre + "output_min"), p.get(pre + "output_max")
    from .predicates_clamps import _clamped_kl_log_ratios

    values = [_KL_ESTIMATES[est](x) for x in _clamped_kl_log_ratios(case, lo, hi)]
    return any((v > 10 and omax is None) or (v < -10 and omin is None) for v in values)


def policy_log_ratio_beyond_20(case: dict) -> bool:
    """The case sets no ``log_ratio_clamp`` and at some unmasked position the policy log-ratio
    |logprobs - old_logprobs| exceeds 20."""
    if _params(case).get("log_ratio_clamp") is not None:
        return False
    ins = inputs_of(case)
    lp, old, mask = ins.get("logprobs"), ins.get("old_logprobs"), ins.get("mask")
    if not isinstance(lp, list) or not isinstance(old, list) or not isinstance(mask, list):
        return False
    for r1, r2, mrow in zip(lp, old, mask):
        for a, b, m in zip(_rows(r1), _rows(r2), _rows(mrow)):
            if m and abs(_real(a) - _real(b)) > 20:
                return True
    return False


def masked_log_ratio_overflows(case: dict) -> bool:
    """At some position whose mask is false, two of the log-prob inputs the case gives (logprobs,
    old_logprobs, ref_logprobs, sampler_logprobs) are finite and differ by more than 88.7: e^ of
    their difference overflows float32 there (past 709.8, float64 too)."""
    ins = inputs_of(case)
    mask = ins.get("mask")
    rows = [ins[k] for k in ("logprobs", "old_logprobs", "ref_logprobs", "sampler_logprobs")
            if isinstance(ins.get(k), list)]
    if not isinstance(mask, list) or len(rows) < 2:
        return False
    for b, mrow in enumerate(mask):
        for t, m in enumerate(_rows(mrow)):
            if m:
                continue
            vals = [_real(_rows(r[b])[t]) for r in rows if b < len(r) and t < len(_rows(r[b]))]
            vals = [v for v in vals if math.isfinite(v)]
            if len(vals) >= 2 and max(vals) - min(vals) > 88.7:
                return True
    return False


def _huge_masked(case: dict, names=None) -> bool:
    mask = _mask(case)
    if not isinstance(mask, list):
        return False
    for _, value in ((n, v) for n, v in _real_inputs(case) if names is None or n in names):
        for row, mrow in zip(_rows(value), mask):
            for v, m in zip(_rows(row), _rows(mrow)):
                if not m and not isinstance(v, list) and math.isfinite(_real(v)) and abs(_real(v)) > 1e30:
                    return True
    return False


def nonfinite_or_overflowing_masked(case: dict) -> bool:
    """NaN or an infinity at a masked position (``nonfinite_masked``), finite log-probs there differing by more than
    88.7 (``masked_log_ratio_overflows``), a finite real value above 1e30 (a product overflows float32), or a [B,T,V]
    logit overflowing float32 once transformed: junk computed at every position turns into inf, inf * 0 into NaN."""
    from .predicates_precision import masked_logits_overflow_float32 as logits_overflow
    return nonfinite_masked(case) or masked_log_ratio_overflows(case) or _huge_masked(case) or logits_overflow(case)


def k3_unbiased_gradient_cancels(case: dict) -> bool:
    """The case computes the importance-weighted k3 (kl.k3_unbiased, or a loss.* KL term with
    ``kl_estimator`` k3_unbiased and beta > 0), and at some unmasked position x = ref_logprobs -
    logprobs is not 0, lies inside the case's KL input clamp (a clamped x has the gradient w k3(bound)
    or 0), gives a weighted value w k3(x), w = e^(logprobs - old_logprobs), inside the case's value
    clamp (a clamped value has gradient 0), and e^x > 16 |x| (|x| below about 1/16, or x above 4.2).
    There the gradient -w x = w (logprobs - ref_logprobs), formed by autograd as the sum of its two
    paths w k3(x) - w (e^x - 1), takes e^x (or e^x - 1 from it) in terms of size about w e^x and
    keeps only a fraction |x| / e^x of their relative accuracy: more error than the tolerance (K = 4
    times a scale of about 5 |w x|) admits, for a worst-case rounding, once e^x / |x| passes 16."""
    return _k3_unbiased_cancels(case, 16.0)


def k3_unbiased_gradient_cancels_beyond_float32(case: dict) -> bool:
    """``k3_unbiased_gradient_cancels`` with e^x > 2^33 |x| (x above about 26.1) in place of 16 |x|: the
    accuracy a float64 computation of that gradient loses, e^x / |x| times float64's unit roundoff,
    exceeds what float32's tolerance admits (2^33 = 16 times float32's unit roundoff over float64's,
    2^29): a float64 result that a framework's float32 convention (``within = "float32"``) can no
    longer absorb."""
    return _k3_unbiased_cancels(case, 2.0 ** 33)


def _k3_unbiased_params(case: dict):
    """(the prefix of the KL's parameter names, the resolved parameters) when the case computes the
    importance-weighted k3: kl.k3_unbiased (""), or a loss.* KL term with ``kl_estimator``
    k3_unbiased and beta > 0 ("kl_"); else (None, None)."""
    f = str(case.get("formula", ""))
    p = _params(case)
    if f == "kl.k3_unbiased":
        return "", p
    if f.startswith("loss.") and p.get("kl_estimator") == "k3_unbiased" and \
            _real(p.get("beta") if p.get("beta") is not None else 0) > 0:
        return "kl_", p
    return None, None


def _k3_unbiased_tokens(case: dict):
    """(x = ref_logprobs - logprobs, log w = logprobs - old_logprobs) at every unmasked position."""
    ins = inputs_of(case)
    lp, old, ref, mask = (ins.get(k) for k in ("logprobs", "old_logprobs", "ref_logprobs", "mask"))
    if not all(isinstance(v, list) for v in (lp, old, ref, mask)):
        return
    for r1, r0, r2, mrow in zip(lp, old, ref, mask):
        for a, o, b, m in zip(_rows(r1), _rows(r0), _rows(r2), _rows(mrow)):
            if m:
                yield _real(b) - _real(a), _real(a) - _real(o)


def _log_k3(x: float) -> float:
    """log k3(x) = log(e^x - 1 - x) for x != 0, without overflow (its series near 0)."""
    k3 = x * x / 2 * (1 + x / 3) if abs(x) < 1e-4 else (math.expm1(x) - x if x < 700 else math.inf)
    return math.log(k3) if k3 < math.inf else x


def _k3_unbiased_cancels(case: dict, factor: float) -> bool:
    pre, p = _k3_unbiased_params(case)
    if pre is None:
        return False
    lo, hi = p.get(pre + "log_ratio_min"), p.get(pre + "log_ratio_max")
    omin, omax = p.get(pre + "output_min"), p.get(pre + "output_max")
    for x, lw in _k3_unbiased_tokens(case):
        if not math.isfinite(x) or not math.isfinite(lw) or x == 0:
            continue
        if (lo is not None and x < _real(lo)) or (hi is not None and x > _real(hi)):
            continue
        if x - math.log(abs(x)) <= math.log(factor):     # e^x / |x| <= factor
            continue
        if omin is not None or omax is not None:
            log_v = lw + _log_k3(x)                       # w k3(x) > 0, in log space
            v = math.exp(log_v) if log_v < 700 else math.inf
            if (omax is not None and v > _real(omax)) or (omin is not None and v < _real(omin)):
                continue
        return True
    return False


def k3_unbiased_beyond_20_or_10_unclamped(case: dict) -> bool:
    """The case computes the importance-weighted k3 (kl.k3_unbiased, or a loss.* KL term with
    ``kl_estimator`` k3_unbiased and beta > 0), and at some unmasked position x = ref_logprobs -
    logprobs lies beyond 20 in magnitude on a side the case's KL input clamp leaves open, or the
    weighted value w k3(x) (x after the case's input clamp, w = e^(logprobs - old_logprobs)) exceeds
    10 where the case sets no upper value clamp: where a framework's always-on clamps of x to
    [-20, 20] and of the value to [-10, 10] bind."""
    pre, p = _k3_unbiased_params(case)
    if pre is None:
        return False
    lo, hi, omax = p.get(pre + "log_ratio_min"), p.get(pre + "log_ratio_max"), p.get(pre + "output_max")
    for x, lw in _k3_unbiased_tokens(case):
        if math.isnan(x) or math.isnan(lw):
            continue
        if (x > 20 and hi is None) or (x < -20 and lo is None):
            return True
        x = max(x, _real(lo)) if lo is not None else x
        x = min(x, _real(hi)) if hi is not None else x
        if omax is not None or x == 0:
            continue
        if lw + _log_k3(x) > math.log(10):       # w k3(x) > 10
            return True
    return False


def k2_score_nonfinite_or_overflowing_masked(case: dict) -> bool:
    """The case computes the k2 score (x^2)/2 (kl.k2, kl.k3_straight_through's gradient, a loss.* KL term
    with beta > 0 and kl_estimator k2 or k3_straight_through) and ``nonfinite_or_overflowing_masked`` holds."""
    f, p = str(case.get("formula", "")), _params(case)
    k2 = f in ("kl.k2", "kl.k3_straight_through") or f.startswith("loss.") and _real(p.get("beta") or 0) > 0 \
        and p.get("kl_estimator") in ("k2", "k3_straight_through")
    return k2 and nonfinite_or_overflowing_masked(case)


def kl_term_with_is_weight(case: dict) -> bool:
    """The case is a loss.* recipe with a KL term (beta > 0) and an importance-sampling correction
    (``is_level`` not ``"none"``), where a framework may weight the KL term by w^IS too."""
    p = _params(case)
    return str(case.get("formula", "")).startswith("loss.") and _real(p.get("beta") or 0) > 0 \
        and p.get("is_level") not in (None, "none")


def nonfinite_or_huge_masked(case: dict) -> bool:
    """``nonfinite_masked``, or a finite advantage or value above 1e30 at a masked position (its product with a
    ratio or bound above 1 overflows float32), or such a log-prob where the per-token loss has it as a factor
    (the REINFORCE forms -w A l of CISPO, VESPO and MiniRL); not a huge log-prob whose exp or square overflows
    (nonfinite_or_overflowing_masked has those)."""
    reinforce = str(case.get("formula", "")) in ("surrogate.cispo", "surrogate.vespo", "loss.cispo", "loss.vespo",
                                                 "loss.minirl")
    return nonfinite_masked(case) or _huge_masked(case, ("advantages", "values") + (("logprobs",) if reinforce else ()))
