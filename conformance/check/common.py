"""What every part of `pgspec check` shares: the formulas with an oracle, the check's results
(``CheckResult``, ``OutputCheck``) and its usage error (``CheckError``: exit status 2)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from pgspec.adapters.base import HEAD_LOSS_FORMULAS as _HEAD_LOSS_FORMULAS


U64 = 2.0 ** -53


ORACLE_FORMULAS = ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.constant", "agg.prompt_mean",
                   "agg.document_mean",
                   "loss.grpo", "loss.bnpo", "loss.dr_grpo", "loss.dapo", "loss.cispo", "loss.gspo", "loss.sapo",
                   "loss.luspo", "loss.vespo", "loss.gmpo", "loss.minirl", "logprob.token")


VOCAB_FORMULAS = ("logprob.token",)      # need --vocab (check_logprob.py: a linear head of exact logits)


# with --vocab: from hidden states and an LM head (check_head_loss.py)
HEAD_LOSS_FORMULAS = _HEAD_LOSS_FORMULAS


# the token losses with a clip or a truncation: old log-probs off its kinks, per token (check_inputs)
TOKEN_LOSSES = ("loss.grpo", "loss.bnpo", "loss.dr_grpo", "loss.dapo", "loss.cispo", "loss.minirl")


# Each token loss's aggregator (pgspec.reference.loss): loss.dapo's and loss.cispo's are their parameter `aggregation`
LOSS_AGGREGATION = {"loss.grpo": "agg.sample_mean", "loss.bnpo": "agg.token_mean", "loss.dr_grpo": "agg.constant",
                    "loss.gspo": "agg.sample_mean", "loss.sapo": "agg.sample_mean",
                    "loss.luspo": "agg.seq_mean_token_sum", "loss.vespo": "agg.token_mean",
                    "loss.gmpo": "agg.sample_mean", "loss.minirl": "agg.seq_mean_token_sum"}


# The parameters an aggregator's oracle takes at any value; the others at their defaults only
AGG_FREE_PARAMS = {"agg.token_mean": ("num_tokens", "eps"),
                   "agg.sample_mean": ("num_sequences", "sequence_token_counts", "count_empty_sequences", "eps_length",
                                       "eps_count"),
                   "agg.seq_mean_token_sum": ("num_sequences", "count_empty_sequences"),
                   "agg.constant": ("divisor", "divide_by", "num_sequences", "count_empty_sequences"),
                   "agg.prompt_mean": ("num_groups", "group_token_counts", "count_empty_groups", "step_divisor",
                                       "num_sequences"),
                   "agg.document_mean": ("num_documents", "document_token_counts")}


class CheckError(Exception):
    """A usage error of `pgspec check` (unknown formula, no oracle scale, bad shape): exit code 2."""


@dataclass
class OutputCheck:
    output: str
    compared: int
    failures: int
    worst_ratio: float
    worst_index: list | None = None
    first_failure: dict | None = None


@dataclass
class CheckResult:
    adapter: str
    formula: str
    dtype: str
    device: str
    shape: list
    seed: int
    outcome: str                      # pass | fail | error | unsupported | bug | convention (a declared fail)
    outputs: list = field(default_factory=list)
    adapter_seconds: float = 0.0
    oracle_seconds: float = 0.0
    message: str = ""
    vocab: int | None = None
    hidden: int | None = None
    path: str = ""                    # how the adapter was called (log-prob checks: "head" or "logits")
    declaration: dict | None = None   # the adapter's rule that matches the check (Declaration.summary())
    # the formula's decisions and the count of tokens or rows on each side (check_branches.py), and
    # the sides none takes: not judged by this check
    branches: list = field(default_factory=list)
    unreached: list = field(default_factory=list)

    def to_json(self):
        d = asdict(self)
        for o in d["outputs"]:
            if not math.isfinite(o["worst_ratio"]):
                o["worst_ratio"] = str(o["worst_ratio"])
        return d


def parse_shape(text: str) -> tuple[int, int]:
    try:
        b, t = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise CheckError(f"--shape must be BxT (e.g. 64x32768), got {text!r}") from None
    if b < 1 or t < 1:
        raise CheckError(f"--shape must be positive, got {text!r}")
    return b, t


def unravel(k, t):
    shape = tuple(t.shape) if hasattr(t, "shape") else ()
    return [int(i) for i in np.unravel_index(k, shape)] if shape else []
