"""agg: aggregation of a per-token quantity into a scalar, with explicit global denominators (spec/agg.md).

Every aggregator here is a *linear* function of the per-token values ``q_{i,t}``: a masked sum
divided by denominators that depend only on the mask (and on group or document ids), never on the
values.  Each denominator is a nullable parameter: null means "count it in the batch given to the
formula", a number means "this is the count over the larger scope the batch is a shard of"
(micro-batch accumulation window, DP group, DP x CP).  Passing the global counts is what makes a
sum of shard-local results equal the unsharded result (``dist.*``).

The plain functions (``token_mean``, ``sample_mean``, ``seq_mean_token_sum``, ``constant``,
``prompt_mean``, ``document_mean``) take ``values`` (nested lists of mpf or ``_ad.Var``, ``None``
at masked positions) and ``mask`` and return the scalar; ``loss.*`` recipes and ``dist.*`` call
them directly.  The registered formulas wrap them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mpmath import mpf

from ._ad import total
from ._common import MASK, VALUES, GROUP_IDS, positions, scalar_output
from ._errors import SpecError
from ._registry import Input, Param, formula

DOCUMENT_IDS = Input("document_ids", (("B", "T"),), kind="int")

GRPO = "Shao et al. 2024, DeepSeekMath (GRPO), arXiv:2402.03300, Sec. 4.1.1 Eq. 3"
DAPO = "Yu et al. 2025, DAPO, arXiv:2503.14476, Eq. 8"
DRGRPO = "Liu et al. 2025, Understanding R1-Zero-Like Training (Dr.GRPO), arXiv:2503.20783, Eq. 2 and Listing 1"
SCALERL = "Khatri et al. 2025, The Art of Scaling RL Compute for LLMs (ScaleRL), arXiv:2510.13786, Sec. 3.2 and App. A.2"

__all__ = [
    "token_mean", "sample_mean", "seq_mean_token_sum", "constant", "prompt_mean", "document_mean",
    "sequence_lengths", "IntListParam", "DOCUMENT_IDS",
]


# A list-valued parameter (per-sequence or per-token global counts) --------------------------------
@dataclass(frozen=True)
class IntListParam(Param):
    """A nullable list of integers >= ``lo`` (0 when ``lo`` is None): ``depth`` 1 is one entry per
    sequence ``[B]`` (or per ``length``, e.g. ``[M]`` micro-batches), depth 2 one entry per token
    ``[B,T]`` (``None`` allowed there at masked positions).

    The registry's checks cover the element type and its least value; the function checks the length
    against the batch, which the parameter cannot see.
    """

    depth: int = 1
    length: str = "[B]"

    def floor(self) -> int:
        return 0 if self.lo is None else self.lo

    def range_text(self) -> str:
        shape = self.length if self.depth == 1 else "[B,T] (null allowed at masked positions)"
        return f"a list {shape} of integers >= {self.floor()}, or null"

    def check(self, formula_id: str, value):
        where = f"{formula_id}: parameter {self.name!r}"
        if value is None:
            return None
        rows = value if self.depth == 1 else None
        if not isinstance(value, (list, tuple)):
            raise SpecError(f"{where} must be {self.range_text()}, got {value!r}")
        if self.depth == 2:
            rows = []
            for k, row in enumerate(value):
                if not isinstance(row, (list, tuple)):
                    raise SpecError(f"{where}[{k}] must be a list (one entry per token), got {row!r}")
                rows.extend((f"[{k}][{t}]", x) for t, x in enumerate(row) if x is not None)
        else:
            rows = [(f"[{k}]", x) for k, x in enumerate(value)]
        for label, x in rows:
            if isinstance(x, bool) or not isinstance(x, int) or x < self.floor():
                raise SpecError(f"{where}{label} must be an integer >= {self.floor()}, got {x!r}")
        return [list(r) for r in value] if self.depth == 2 else list(value)


# Shared pieces ------------------------------------------------------------------------------------
def sequence_lengths(mask):
    """L_i = sum_t m_{i,t} for every row."""
    return [sum(1 for m in row if m) for row in mask]


def _fid(name):
    return f"agg.{name}"


def _global_count(fid, pname, given, local, what):
    """The denominator count: ``given`` (a global count over a larger scope) or the local one.

    A global count smaller than the count in the batch at hand cannot be right: error.
    """
    if given is None:
        return local
    if given < local:
        raise SpecError(
            f"{fid}: parameter {pname!r} = {given} is smaller than the {what} in this batch ({local}); "
            f"a global count covers this batch and more"
        )
    return given


def _per_sequence_counts(fid, pname, given, mask, what="tokens"):
    """D_i: the global token count of sequence i (``given[i]``) or its local length L_i."""
    L = sequence_lengths(mask)
    if given is None:
        return L
    if len(given) != len(mask):
        raise SpecError(f"{fid}: parameter {pname!r} must have one entry per sequence (B={len(mask)}), got {len(given)}")
    for i, (d, li) in enumerate(zip(given, L)):
        if d < li:
            raise SpecError(
                f"{fid}: parameter {pname!r}[{i}] = {d} is smaller than the {li} unmasked {what} of sequence {i} in this batch"
            )
    return list(given)


def _masked_row_sum(values, mask_row, i):
    """sum_t m_{i,t} q_{i,t} as one node."""
    return total(values[i][t] for t in positions(mask_row))


def _divide(numerator, denominator):
    """numerator / denominator, with the convention 0 / 0 = 0 (value 0, zero gradient)."""
    if denominator == 0:
        return mpf(0)
    return numerator / denominator


def _check_eps(fid, name, eps):
    if eps is None or eps < 0:
        raise SpecError(f"{fid}: parameter {name!r} must be a real >= 0, got {eps!r}")


def _num_sequences(fid, num_sequences, counts, count_empty_sequences):
    """N: ``num_sequences`` or the number of sequences in the batch (all of them, or those with D_i > 0)."""
    local = len(counts) if count_empty_sequences else sum(1 for d in counts if d > 0)
    return _global_count(fid, "num_sequences", num_sequences, local, "number of counted sequences")


# The aggregators (plain functions) ----------------------------------------------------------------
def token_mean(values, mask, num_tokens=None, eps=0):
    """agg.token_mean:  T(q) = sum_{i,t} m_{i,t} q_{i,t} / (N_tok + eps),
    N_tok = ``num_tokens`` (global) or sum_{i,t} m_{i,t} (this batch).  N_tok + eps = 0 gives 0."""
    fid = _fid("token_mean")
    _check_eps(fid, "eps", eps)
    n_tok = _global_count(fid, "num_tokens", num_tokens, sum(sequence_lengths(mask)), "number of unmasked tokens")
    numerator = total(_masked_row_sum(values, row, i) for i, row in enumerate(mask))
    return _divide(numerator, n_tok + eps)


def sample_mean(values, mask, num_sequences=None, sequence_token_counts=None, count_empty_sequences=False,
                eps_length=0, eps_count=0):
    """agg.sample_mean:  S(q) = 1/(N + eps_count) * sum_i [ sum_t m_{i,t} q_{i,t} / (D_i + eps_length) ],
    D_i = ``sequence_token_counts[i]`` (global) or L_i;  N = ``num_sequences`` (global) or the number of
    sequences with D_i > 0 (all B when ``count_empty_sequences``).  A zero denominator gives 0."""
    fid = _fid("sample_mean")
    _check_eps(fid, "eps_length", eps_length)
    _check_eps(fid, "eps_count", eps_count)
    D = _per_sequence_counts(fid, "sequence_token_counts", sequence_token_counts, mask)
    n = _num_sequences(fid, num_sequences, D, count_empty_sequences)
    per_sequence = total(_divide(_masked_row_sum(values, row, i), D[i] + eps_length) for i, row in enumerate(mask))
    return _divide(per_sequence, n + eps_count)


def seq_mean_token_sum(values, mask, num_sequences=None, count_empty_sequences=False):
    """agg.seq_mean_token_sum:  (1/N) sum_i sum_t m_{i,t} q_{i,t},
    N = ``num_sequences`` (global) or the number of sequences with L_i > 0 (all B when
    ``count_empty_sequences``).  N = 0 gives 0."""
    fid = _fid("seq_mean_token_sum")
    n = _num_sequences(fid, num_sequences, sequence_lengths(mask), count_empty_sequences)
    return _divide(total(_masked_row_sum(values, row, i) for i, row in enumerate(mask)), n)


def constant(values, mask, divisor, divide_by="K*N", num_sequences=None, count_empty_sequences=True):
    """agg.constant (Dr.GRPO):  C_K(q) = sum_{i,t} m_{i,t} q_{i,t} / (K * N)   (``divide_by`` = "K*N")
    or  sum_{i,t} m_{i,t} q_{i,t} / K   (``divide_by`` = "K"),
    K = ``divisor`` > 0 (the generation budget), N = ``num_sequences`` (global) or the number of
    sequences in the batch (all B by default).  N = 0 gives 0."""
    fid = _fid("constant")
    if divisor is None:
        raise SpecError(f"{fid}: parameter 'divisor' is required (the constant K > 0, e.g. the generation budget "
                        f"max_completion_length; the Dr.GRPO paper's runs use 3000)")
    if divisor <= 0:
        raise SpecError(f"{fid}: parameter 'divisor' must be a real > 0, got {divisor!r}")
    if divide_by not in ("K", "K*N"):
        raise SpecError(f"{fid}: parameter 'divide_by' must be one of 'K', 'K*N', got {divide_by!r}")
    numerator = total(_masked_row_sum(values, row, i) for i, row in enumerate(mask))
    if divide_by == "K":
        return numerator / divisor
    n = _num_sequences(fid, num_sequences, sequence_lengths(mask), count_empty_sequences)
    return _divide(numerator, divisor * n)


def prompt_mean(values, mask, group_ids, num_groups=None, group_token_counts=None, count_empty_groups=False,
                step_divisor="groups", num_sequences=None):
    """agg.prompt_mean (ScaleRL "prompt average", DAPO Eq. 8 per group):
    P(q) = (1/Z) sum_g [ sum_{i in g} sum_t m_{i,t} q_{i,t} / D_g ],
    D_g = ``group_token_counts[i]`` for any i in g (global) or sum_{i in g} L_i;
    Z = N_grp when ``step_divisor`` is 'groups' (the default): N_grp = ``num_groups`` (global) or the
    number of groups with D_g > 0 (all groups present when ``count_empty_groups``);
    Z = N_seq when ``step_divisor`` is 'sequences' (slime #2090's step_global_batch_size, which makes
    the value N_grp/N_seq times the 'groups' value): N_seq = ``num_sequences`` (global) or B, every
    sequence of the batch, empty or not.  A zero denominator gives 0."""
    fid = _fid("prompt_mean")
    if group_ids is None:
        raise SpecError(f"{fid}: missing input 'group_ids' (expected shape [B])")
    L = sequence_lengths(mask)
    members: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    if group_token_counts is not None and len(group_token_counts) != len(mask):
        raise SpecError(f"{fid}: parameter 'group_token_counts' must have one entry per sequence (B={len(mask)}), "
                        f"got {len(group_token_counts)}")
    D = {}
    for g, rows in members.items():
        local = sum(L[i] for i in rows)
        if group_token_counts is None:
            D[g] = local
            continue
        given = {group_token_counts[i] for i in rows}
        if len(given) != 1:
            raise SpecError(f"{fid}: parameter 'group_token_counts' must be the same for every sequence of a group; "
                            f"group {g} (rows {rows}) has {sorted(given)}")
        D[g] = given.pop()
        if D[g] < local:
            raise SpecError(f"{fid}: parameter 'group_token_counts' gives group {g} {D[g]} tokens, fewer than the "
                            f"{local} unmasked tokens it has in this batch")
    per_group = total(
        _divide(total(_masked_row_sum(values, mask[i], i) for i in rows), D[g]) for g, rows in members.items()
    )
    if step_divisor == "sequences":
        if num_groups is not None:
            raise SpecError(f"{fid}: parameter 'num_groups' has no meaning with step_divisor='sequences' (the step sum "
                            f"is divided by the sequence count num_sequences); it must be null")
        n_seq = _global_count(fid, "num_sequences", num_sequences, len(mask), "number of sequences")
        return _divide(per_group, n_seq)
    if num_sequences is not None:
        raise SpecError(f"{fid}: parameter 'num_sequences' applies only to step_divisor='sequences'; it must be null")
    local_groups = len(D) if count_empty_groups else sum(1 for d in D.values() if d > 0)
    n_grp = _global_count(fid, "num_groups", num_groups, local_groups, "number of counted groups")
    return _divide(per_group, n_grp)


def document_mean(values, mask, document_ids, num_documents=None, document_token_counts=None):
    """agg.document_mean (Fast-LLM):  (1/N_doc) sum_d [ sum_{(i,t): d_{i,t} = d} m_{i,t} q_{i,t} / N_d ]
    = (1/N_doc) sum_{i,t} m_{i,t} q_{i,t} / N_{d_{i,t}},
    N_d = ``document_token_counts[i][t]`` at any unmasked token of d (global) or the number of unmasked
    tokens with id d in the batch; N_doc = ``num_documents`` (global) or the number of documents with
    an unmasked token in the batch.  Document ids are global across rows.  A zero N_doc gives 0."""
    fid = _fid("document_mean")
    if document_ids is None:
        raise SpecError(f"{fid}: missing input 'document_ids' (expected shape [B,T])")
    tokens: dict[int, list[tuple[int, int]]] = {}
    for i, row in enumerate(mask):
        for t in positions(row):
            tokens.setdefault(document_ids[i][t], []).append((i, t))
    if document_token_counts is not None:
        if len(document_token_counts) != len(mask) or any(
            len(c) != len(r) for c, r in zip(document_token_counts, mask)
        ):
            raise SpecError(f"{fid}: parameter 'document_token_counts' must have the shape of 'mask' "
                            f"[{len(mask)},{len(mask[0]) if mask else 0}]")
    N = {}
    for d, where in tokens.items():
        if document_token_counts is None:
            N[d] = len(where)
            continue
        given = {document_token_counts[i][t] for i, t in where}
        if None in given or len(given) != 1:
            raise SpecError(f"{fid}: parameter 'document_token_counts' must hold the same integer at every unmasked "
                            f"token of a document; document {d} has {sorted(given, key=str)}")
        N[d] = given.pop()
        if N[d] < len(where):
            raise SpecError(f"{fid}: parameter 'document_token_counts' gives document {d} {N[d]} tokens, fewer than "
                            f"the {len(where)} unmasked tokens it has in this batch")
    n_doc = _global_count(fid, "num_documents", num_documents, len(tokens), "number of documents")
    per_document = total(total(values[i][t] for i, t in where) / N[d] for d, where in tokens.items())
    return _divide(per_document, n_doc)


# Registered formulas ------------------------------------------------------------------------------
def _count_param(name, doc):
    return Param(name, None, kind="int", lo=0, nullable=True, doc=doc)


def _eps_param(name, doc):
    return Param(name, 0, lo=0, doc=doc)


@dataclass(frozen=True)
class RequiredRealParam(Param):
    """A real parameter with no default: null is refused with a message saying it is required."""

    def range_text(self) -> str:
        return super().range_text().replace(" or null", "") + " (required)"

    def check(self, formula_id: str, value):
        if value is None:
            raise SpecError(f"{formula_id}: parameter {self.name!r} is required: {self.doc}")
        return super().check(formula_id, value)


OUT = (scalar_output("value", "the aggregate (a loss when values are per-token losses)"),)

COUNT_EMPTY_SEQ_DOC = ("whether sequences with no unmasked token count in the local sequence count N "
                       "(ignored when num_sequences is given)")


@formula(
    "agg.token_mean",
    title="Token mean: masked sum over the batch divided by the (global) token count",
    inputs=(VALUES, MASK),
    params=(
        _count_param("num_tokens", "N_tok, the number of unmasked tokens over the whole scope the loss is "
                                   "normalized over (accumulation window x DP x CP); null: count this batch"),
        _eps_param("eps", "added to the denominator N_tok (NeMo-RL adds 1e-8; 0: exact)"),
    ),
    outputs=OUT,
    differentiable=("values",),
    grad_of="value",
    references=(
        SCALERL + ": \"token average\" (DAPO Eq. 8 is agg.prompt_mean, not this formula)",
        "verl 0.9.1 verl/trainer/ppo/core_algos.py agg_loss loss_agg_mode='token-mean' (batch_num_tokens)",
        "trl 1.16.0 GRPOTrainer._compute_loss loss_type='dapo' (num_items_in_batch) and 'bnpo' (local)",
        "NeMo-RL nemo_rl/algorithms/loss/loss_functions.py ClippedPGLossFn token_level_loss=True (global_valid_toks + 1e-8)",
    ),
)
def token_mean_formula(values, mask, *, num_tokens, eps):
    """agg.token_mean: see ``token_mean``."""
    return {"value": token_mean(values, mask, num_tokens, eps)}


@formula(
    "agg.sample_mean",
    title="Sample mean: mean over sequences of per-sequence token means",
    inputs=(VALUES, MASK),
    params=(
        _count_param("num_sequences", "N, the number of sequences over the whole scope (accumulation window x DP); "
                                      "null: count this batch"),
        IntListParam("sequence_token_counts", None, kind="int_list", nullable=True,
                     doc="D_i, the unmasked-token count of each whole sequence when the batch holds only part of it "
                         "(context parallelism); null: L_i from this batch"),
        Param("count_empty_sequences", False, kind="bool", doc=COUNT_EMPTY_SEQ_DOC),
        _eps_param("eps_length", "added to each D_i (verl, OpenRLHF, NeMo-RL: 1e-8; 0: exact)"),
        _eps_param("eps_count", "added to N (NeMo-RL: 1e-8; 0: exact)"),
    ),
    outputs=OUT,
    differentiable=("values",),
    grad_of="value",
    references=(
        GRPO,
        "verl 0.9.1 core_algos.agg_loss loss_agg_mode='seq-mean-token-mean'",
        "trl 1.16.0 GRPOTrainer._compute_loss loss_type='grpo'",
        "skyrl-train 0.3.1 skyrl_train/utils/ppo_utils.py reduce_loss 'sequence_mean' (counts empty rows)",
        "slime 624b824 slime/backends/megatron_utils/cp_utils.py get_sum_of_sample_mean (sample_denoms)",
    ),
)
def sample_mean_formula(values, mask, *, num_sequences, sequence_token_counts, count_empty_sequences,
                        eps_length, eps_count):
    """agg.sample_mean: see ``sample_mean``."""
    return {"value": sample_mean(values, mask, num_sequences, sequence_token_counts, count_empty_sequences,
                                 eps_length, eps_count)}


@formula(
    "agg.seq_mean_token_sum",
    title="Sequence mean of token sums",
    inputs=(VALUES, MASK),
    params=(
        _count_param("num_sequences", "N, the number of sequences over the whole scope; null: count this batch"),
        Param("count_empty_sequences", False, kind="bool", doc=COUNT_EMPTY_SEQ_DOC),
    ),
    outputs=OUT,
    differentiable=("values",),
    grad_of="value",
    references=(
        "verl 0.9.1 core_algos.agg_loss loss_agg_mode='seq-mean-token-sum' (global_batch_size)",
        "Zheng et al. 2025, Stabilizing RL with LLMs (MiniRL), arXiv:2512.01374, Eq. 7 (per-response token sum)",
    ),
)
def seq_mean_token_sum_formula(values, mask, *, num_sequences, count_empty_sequences):
    """agg.seq_mean_token_sum: see ``seq_mean_token_sum``."""
    return {"value": seq_mean_token_sum(values, mask, num_sequences, count_empty_sequences)}


@formula(
    "agg.constant",
    title="Constant divisor (Dr.GRPO): masked sum / (K * N) or / K",
    inputs=(VALUES, MASK),
    params=(
        RequiredRealParam("divisor", None, lo=0, lo_open=True, nullable=True,
                          doc="K > 0, the constant divisor: the generation budget (max generated tokens); "
                              "the Dr.GRPO paper's runs use 3000"),
        Param("divide_by", "K*N", kind="choice", choices=("K", "K*N"),
              doc="'K*N': sum / (K N), the mean over sequences of token sums / K (Dr.GRPO); 'K': sum / K"),
        _count_param("num_sequences", "N, the number of sequences over the whole scope; null: count this batch "
                                      "(only with divide_by='K*N')"),
        Param("count_empty_sequences", True, kind="bool", doc=COUNT_EMPTY_SEQ_DOC),
    ),
    outputs=OUT,
    differentiable=("values",),
    grad_of="value",
    references=(
        DRGRPO,
        "sail-sg/oat oat/algorithms/ppo.py PPOLearner critic_type='drgrpo' (constant_normalizer = generate_max_length)",
        "trl 1.16.0 GRPOTrainer._compute_loss loss_type='dr_grpo' (B x max_completion_length)",
        "verl 0.9.1 core_algos.agg_loss loss_agg_mode='seq-mean-token-sum-norm' (loss_scale_factor, default mask width T)",
        "skyrl-train 0.3.1 reduce_loss 'seq_mean_token_sum_norm' (max_seq_len)",
    ),
)
def constant_formula(values, mask, *, divisor, divide_by, num_sequences, count_empty_sequences):
    """agg.constant: see ``constant``."""
    return {"value": constant(values, mask, divisor, divide_by, num_sequences, count_empty_sequences)}


@formula(
    "agg.prompt_mean",
    title="Prompt mean (ScaleRL prompt average, DAPO Eq. 8): token mean within each group, mean over groups",
    inputs=(VALUES, MASK, GROUP_IDS),
    params=(
        _count_param("num_groups", "N_grp, the number of prompt groups over the whole scope; null: count this batch"),
        IntListParam("group_token_counts", None, kind="int_list", nullable=True,
                     doc="D_g per sequence: entry i is the unmasked-token count of the whole group of sequence i "
                         "(all shards); null: count this batch"),
        Param("count_empty_groups", False, kind="bool",
              doc="whether groups with no unmasked token count in the local group count (ignored when num_groups is given)"),
        Param("step_divisor", "groups", kind="choice", choices=("groups", "sequences"),
              doc="what the sum of the per-group token means is divided by: groups: N_grp (DAPO Eq. 8, ScaleRL, the "
                  "final slime #2090 text); sequences: the sequence count N_seq (slime #2090's commits: "
                  "step_global_batch_size, i.e. N_grp/N_seq times the 'groups' value)"),
        _count_param("num_sequences", "N_seq for step_divisor='sequences': the number of sequences (samples) over the "
                                      "whole step (slime step_global_batch_size); null: B, every sequence of this batch"),
    ),
    outputs=OUT,
    differentiable=("values",),
    grad_of="value",
    references=(
        DAPO + " (1/sum_{i in group} |o_i| inside the expectation over prompts)",
        SCALERL + " ('prompt average')",
        "MiniMax 2025, MiniMax-M1, arXiv:2506.13585, Eq. 4 (CISPO)",
        "slime PR #2090 (unmerged) --loss-aggregation prompt_mean (prompt_mask_sums)",
    ),
)
def prompt_mean_formula(values, mask, group_ids, *, num_groups, group_token_counts, count_empty_groups,
                        step_divisor, num_sequences):
    """agg.prompt_mean: see ``prompt_mean``."""
    return {"value": prompt_mean(values, mask, group_ids, num_groups, group_token_counts, count_empty_groups,
                                 step_divisor, num_sequences)}


@formula(
    "agg.document_mean",
    title="Document mean (Fast-LLM): token mean within each packed document, mean over documents",
    inputs=(VALUES, MASK, DOCUMENT_IDS),
    params=(
        _count_param("num_documents", "N_doc, the number of documents over the whole scope "
                                      "(Fast-LLM num_documents_in_batch); null: count this batch"),
        IntListParam("document_token_counts", None, kind="int_list", depth=2, nullable=True,
                     doc="N_d broadcast to the tokens of document d (Fast-LLM label_counts): its unmasked-token count "
                         "over all shards; null: count this batch"),
    ),
    outputs=OUT,
    differentiable=("values",),
    grad_of="value",
    references=(
        "Fast-LLM 7d61a1b fast_llm/layers/language_model/loss/policy_gradient.py compute_grpo_metrics "
        "(document weight m_t / max(N_d, 1), divided by num_documents_in_batch)",
    ),
)
def document_mean_formula(values, mask, document_ids, *, num_documents, document_token_counts):
    """agg.document_mean: see ``document_mean``."""
    return {"value": document_mean(values, mask, document_ids, num_documents, document_token_counts)}


AGGREGATORS = {
    "agg.token_mean": token_mean_formula,
    "agg.sample_mean": sample_mean_formula,
    "agg.seq_mean_token_sum": seq_mean_token_sum_formula,
    "agg.constant": constant_formula,
    "agg.prompt_mean": prompt_mean_formula,
    "agg.document_mean": document_mean_formula,
}


# Denominators of the whole batch, for sharded evaluation (dist.*) ---------------------------------
def full_denominators(aggregator, mask, group_ids, document_ids, params):
    """The parameters of ``aggregator`` with every null denominator replaced by its count over
    ``mask`` (the whole, unsharded batch): what each shard must be given so that the sum of the
    shards' results equals the unsharded aggregate.  Counts given in ``params`` are kept."""
    p = dict(params)
    L = sequence_lengths(mask)
    if aggregator == "agg.token_mean":
        if p["num_tokens"] is None:
            p["num_tokens"] = sum(L)
    elif aggregator == "agg.sample_mean":
        D = _per_sequence_counts(_fid("sample_mean"), "sequence_token_counts", p["sequence_token_counts"], mask)
        p["sequence_token_counts"] = D
        if p["num_sequences"] is None:
            p["num_sequences"] = _num_sequences(_fid("sample_mean"), None, D, p["count_empty_sequences"])
    elif aggregator in ("agg.seq_mean_token_sum", "agg.constant"):
        if p["num_sequences"] is None:
            p["num_sequences"] = _num_sequences(aggregator, None, L, p["count_empty_sequences"])
    elif aggregator == "agg.prompt_mean":
        if group_ids is None:
            raise SpecError(f"{aggregator}: missing input 'group_ids' (expected shape [B])")
        if p["group_token_counts"] is None:
            sums: dict[int, int] = {}
            for g, li in zip(group_ids, L):
                sums[g] = sums.get(g, 0) + li
            p["group_token_counts"] = [sums[g] for g in group_ids]
        if p["step_divisor"] == "sequences":
            if p["num_sequences"] is None:
                p["num_sequences"] = len(mask)
        elif p["num_groups"] is None:
            counts = {g: c for g, c in zip(group_ids, p["group_token_counts"])}
            p["num_groups"] = len(counts) if p["count_empty_groups"] else sum(1 for c in counts.values() if c > 0)
    elif aggregator == "agg.document_mean":
        if document_ids is None:
            raise SpecError(f"{aggregator}: missing input 'document_ids' (expected shape [B,T])")
        if p["document_token_counts"] is None:
            counts: dict[int, int] = {}
            for i, row in enumerate(mask):
                for t in positions(row):
                    counts[document_ids[i][t]] = counts.get(document_ids[i][t], 0) + 1
            p["document_token_counts"] = [
                [counts[document_ids[i][t]] if m else None for t, m in enumerate(row)] for i, row in enumerate(mask)
            ]
        if p["num_documents"] is None:
            p["num_documents"] = len({document_ids[i][t] for i, row in enumerate(mask) for t in positions(row)})
    else:
        raise SpecError(f"unknown aggregator {aggregator!r}; aggregators are: {', '.join(AGGREGATORS)}")
    return p


def apply(aggregator, values, mask, group_ids, document_ids, params):
    """The value of ``aggregator`` (an agg.* ID) with validated ``params``."""
    inputs = {"values": values, "mask": mask}
    if aggregator == "agg.prompt_mean":
        inputs["group_ids"] = group_ids
    if aggregator == "agg.document_mean":
        inputs["document_ids"] = document_ids
    return AGGREGATORS[aggregator](**inputs, **params)["value"]


# Parameters that are denominators, per aggregator (set to null for a "local" evaluation).
DENOMINATOR_PARAMS = {
    "agg.token_mean": ("num_tokens",),
    "agg.sample_mean": ("num_sequences", "sequence_token_counts"),
    "agg.seq_mean_token_sum": ("num_sequences",),
    "agg.constant": ("num_sequences",),
    "agg.prompt_mean": ("num_groups", "group_token_counts", "num_sequences"),
    "agg.document_mean": ("num_documents", "document_token_counts"),
}
