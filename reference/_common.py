"""Small helpers shared by the formula modules: parameter declarations and masked iteration.

They keep each formula's body down to its equation; none of them computes a formula.
"""

from __future__ import annotations

from mpmath import mpf

from ._errors import SpecError
from ._registry import Input, Output, Param

# Input declarations used by many formulas ----------------------------------------------------
LOGPROBS = Input("logprobs", (("B", "T"),))
OLD_LOGPROBS = Input("old_logprobs", (("B", "T"),))
SAMPLER_LOGPROBS = Input("sampler_logprobs", (("B", "T"),))
REF_LOGPROBS = Input("ref_logprobs", (("B", "T"),))
MASK = Input("mask", (("B", "T"),), kind="bool")
ADV_SEQ = Input("advantages", (("B",),))
ADV_SEQ_OR_TOKEN = Input("advantages", (("B",), ("B", "T")))
VALUES = Input("values", (("B", "T"),))
REWARDS = Input("rewards", (("B",),))
GROUP_IDS = Input("group_ids", (("B",),), kind="int")


def token_output(name, doc):
    return Output(name, ("B", "T"), doc=doc + " (null where the mask is false)")


def seq_output(name, doc):
    return Output(name, ("B",), doc=doc)


def scalar_output(name, doc):
    return Output(name, (), doc=doc)


def log_ratio_clamp_param(name="log_ratio_clamp", doc=None):
    return Param(
        name, None, lo=0, lo_open=True, nullable=True,
        doc=doc or "if set to c, the log-ratio is clamped to [-c, c] before exp (null: no clamp)",
    )


def eps_param(name, default, doc):
    return Param(name, default, lo=0, hi=1, hi_open=True, doc=doc)


# Masked iteration -------------------------------------------------------------------------------
def positions(mask_row):
    """Indices t where the token counts (mask true)."""
    return [t for t, m in enumerate(mask_row) if m]


def token_adv(advantages, i, t):
    """A_{i,t}: the per-token advantage, or the sequence advantage broadcast to its tokens."""
    a = advantages[i]
    return a[t] if isinstance(a, list) else a


def per_token(mask, fn):
    """[[fn(i, t) if mask[i][t] else None for t] for i]: masked positions are never evaluated."""
    return [[fn(i, t) if m else None for t, m in enumerate(row)] for i, row in enumerate(mask)]


def require(condition, message):
    if not condition:
        raise SpecError(message)


ZERO = mpf(0)
ONE = mpf(1)
