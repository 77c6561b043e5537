"""Hypothesis strategies for policy-gradient loss inputs (public API; DESIGN section 8).

Framework authors can reuse these in their own property tests::

    from hypothesis import given
    from pgspec.conformance import strategies as pst

    @given(pst.padded_batches(fields=("logprobs", "old_logprobs", "advantages")))
    def test_my_loss_ignores_padding(batch):
        ...   # batch is a dict of canonical inputs (nested lists; see below)

Every strategy draws plain data: a dict from canonical input names (DESIGN section 7) to nested
Python lists, in the same form as the golden files, so that it can be given to
``pgspec.reference.evaluate`` or turned into tensors with ``pgspec.conformance.run.runner.to_tensors``.
Every real number drawn is exactly representable in bfloat16 (so one example serves float64,
float32 and bfloat16), and positions where the mask is false may hold any value, including NaN and
+-inf (``junk=True``): they must never reach a result.

Each strategy is a thin wrapper around a *builder*, a plain function of a ``Source`` (``integer``,
``choice``, ``boolean``).  ``DrawSource`` drives a builder from hypothesis; ``SeededSource`` from a
seeded ``random.Random``, which is how ``pgspec.conformance.properties`` makes the fixed,
reproducible example sets it runs against adapters.  The builders are public too.

Strategies (all keyword arguments optional):

- ``logprob_values()``: one bf16-exact log-prob -(1 + m/128) 2^-e, e in [0, 10];
- ``ragged_masks(B, T)``: boolean masks with a masked prompt prefix (possibly of length 0), a
  response of any length (0 included: empty sequences), right padding, and optional holes;
- ``padded_batches(fields)``: a ragged batch with any canonical fields (log-probs, advantages
  [B] or [B,T], rewards, group ids, document ids, values, entropy, logits and targets), junk at
  masked positions;
- ``grpo_groups(B)``: rewards and group ids with singleton groups and identical-reward groups,
  labels arbitrary (not 0..G-1, not sorted);
- ``logprob_triples(B, T, mismatch)``: current, old and sampler log-probs whose log-ratios are
  multiples of 1/64 up to ``mismatch`` in size, with some tokens at log-ratios of +-20 and +-200
  when ``extreme=True``;
- ``long_sequences()``: one or two sequences of 1024 to 9216 tokens made by the documented
  SplitMix64 generator (``pgspec-splitmix64/1``) from a drawn seed;
- ``document_packed_rows(B, T)``: packed rows with contiguous documents (ids global across rows);
- ``cp_partitions()``: a context-parallel configuration (cp_size 1 to 4, thd or bshd layout, logit
  or position ownership);
- ``micro_batch_partitions(B)``: the sizes of consecutive micro-batches, summing to B.
"""

from __future__ import annotations

import functools
import math
import random

# bf16-exact junk for masked positions: NaN, both infinities and finite garbage
JUNK = (math.nan, math.inf, -math.inf, 3.0e38, -1.5, 0.0)
# Token log-ratios at common clip bounds: log(1 - 0.2), log(1 + 0.2), log(1 + 0.28) (PPO, DAPO clip
# higher), +-0.4 (GMPO's log-space bounds), log(1/2), log(2) (TIS caps).  ``logprob_triple(...,
# avoid_kinks=True)`` keeps every ordinary log-ratio at least 1/64 away from them, so that a
# bfloat16 implementation, whose ratio is within 2^-8 of the exact one, lands on the same side of
# the bound as the reference (the golden corpus tests the bounds themselves).
KINK_LOG_RATIOS = (math.log(0.8), math.log(1.2), math.log(1.28), -0.4, 0.4, math.log(0.5), math.log(2.0))
EXTREME_LOG_RATIOS = (20.0, -20.0, 200.0, -200.0)


# Sources ---------------------------------------------------------------------------------------
class Source:
    """What a builder draws from: integers in a closed range, an element, a coin flip."""

    def integer(self, lo: int, hi: int) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def choice(self, seq):
        return seq[self.integer(0, len(seq) - 1)]

    def boolean(self, p_true_in: int = 2) -> bool:
        """True with probability 1/p_true_in (1/2 by default)."""
        return self.integer(0, p_true_in - 1) == 0


class DrawSource(Source):
    """A source backed by hypothesis' ``draw`` (shrinks like any hypothesis strategy)."""

    def __init__(self, draw):
        self.draw = draw

    def integer(self, lo, hi):
        from hypothesis import strategies as st

        return self.draw(st.integers(lo, hi))


class SeededSource(Source):
    """A source backed by ``random.Random(seed)``: the same seed gives the same data on every run
    and every platform (``Random.randint`` on an integer seed is stable across CPython versions)."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def integer(self, lo, hi):
        return self.rng.randint(lo, hi)


# Builders --------------------------------------------------------------------------------------
def logprob_value(src: Source, max_exp: int = 10) -> float:
    """-(1 + m/128) 2^-e with e in [0, max_exp], m in [0, 127]: a bf16 number in (-2, 0)."""
    e, m = src.integer(0, max_exp), src.integer(0, 127)
    return -(1.0 + m / 128.0) * 2.0 ** -e


def junk_value(src: Source) -> float:
    return src.choice(JUNK)


def ragged_mask(src: Source, B: int, T: int, *, max_prompt: int = 2, min_prompt: int = 0, empty: bool = True,
                holes: bool = False) -> list:
    """Rows of: a masked prompt of length p in [min_prompt, max_prompt], then a response of L
    tokens (L = 0 allowed when ``empty``), then right padding; ``holes`` masks a few response
    tokens too (as a loss mask that drops tool outputs does)."""
    rows = []
    for _ in range(B):
        p = src.integer(min(min_prompt, T), min(max_prompt, T))
        # drawn as "tokens left out", so that the simplest example (hypothesis shrinks towards 0)
        # is a full response, not an empty one
        L = (T - p) - src.integer(0, T - p if empty else max(T - p - 1, 0))
        row = [p <= t < p + L for t in range(T)]
        if holes and L > 2:
            for t in range(p + 1, p + L - 1):
                if src.boolean(4):
                    row[t] = False
        rows.append(row)
    return rows


def _per_token(src, mask, make, junk):
    return [[make() if m else (junk_value(src) if junk else make()) for m in row] for row in mask]


def grpo_group_data(src: Source, B: int) -> dict:
    """``rewards`` and ``group_ids`` for B sequences: groups of random sizes (singletons included),
    some with identical rewards, labels drawn from a sparse unordered set, members interleaved."""
    sizes = []
    left = B
    while left:
        s = src.integer(1, min(left, 4))
        sizes.append(s)
        left -= s
    labels = []
    for _ in sizes:
        g = src.integer(-3, 40)
        while g in labels:
            g += 7
        labels.append(g)
    members = [labels[k] for k, s in enumerate(sizes) for _ in range(s)]
    order = list(range(B))
    for k in range(B - 1, 0, -1):   # Fisher-Yates with the source, so hypothesis can shrink it
        j = src.integer(0, k)
        order[k], order[j] = order[j], order[k]
    group_ids = [members[k] for k in order]
    rewards_of = {}
    for g in labels:
        if src.boolean(3):   # identical-reward group
            value = src.choice((0.0, 1.0, 0.5))
            rewards_of[g] = lambda value=value: value
        else:
            rewards_of[g] = lambda: src.integer(-16, 16) / 8
    rewards = [rewards_of[g]() for g in group_ids]
    return {"rewards": rewards, "group_ids": group_ids}


def document_ids_for(src: Source, B: int, T: int, max_docs: int = 3) -> list:
    """Contiguous documents per packed row, ids increasing and global across rows."""
    out, next_id = [], 0
    for _ in range(B):
        n = src.integer(1, max(1, min(max_docs, T)))
        cuts = sorted(src.integer(1, max(1, T - 1)) for _ in range(n - 1))
        row = []
        for t in range(T):
            row.append(next_id + sum(1 for c in cuts if t >= c))
        next_id = row[-1] + 1 if row else next_id + 1
        out.append(row)
    return out


def _near_kink(j):
    return any(abs(j / 64 - p) <= 1 / 64 for p in KINK_LOG_RATIOS)


def logprob_triple(src: Source, mask: list, *, mismatch: int = 16, extreme: bool = False, junk: bool = True,
                   fields=("logprobs", "old_logprobs", "sampler_logprobs"), avoid_kinks: bool = True) -> dict:
    """Log-probs for the requested fields (any of logprobs, old_logprobs, sampler_logprobs,
    ref_logprobs).  At each unmasked token, old is -k/64 (k in [1, 255]) and every other field is
    old + j/64 with |j| <= mismatch, kept in (-4, 0]: every value is a multiple of 1/64 below 4 in
    size, hence bf16-exact, and every log-ratio is an exact multiple of 1/64.  With ``extreme`` about
    one token in six instead has old = o, the first other field o + d and each further one o or
    o + d, d in {+-20, +-200}, with (o, o + d) = (-1 - d, -1) or (-1, -1 + d) (all bf16-exact)."""
    out = {name: [] for name in fields}
    others = [n for n in ("logprobs", "sampler_logprobs", "ref_logprobs") if n in fields]
    for row in mask:
        rows = {name: [] for name in fields}
        for m in row:
            if not m:
                for name in fields:
                    rows[name].append(junk_value(src) if junk else -src.integer(1, 255) / 64)
                continue
            if extreme and src.boolean(6):
                d = src.choice(EXTREME_LOG_RATIOS)
                old = -1.0 - d if d > 0 else -1.0
                vals = {"old_logprobs": old}
                for k, n in enumerate(others):   # the first other field always, the rest by a coin flip
                    vals[n] = old + d if k == 0 or src.boolean() else old
            else:
                k = src.integer(1, 255)
                vals = {"old_logprobs": -k / 64}
                for n in others:
                    j = src.integer(-mismatch, mismatch)
                    if avoid_kinks and _near_kink(j):
                        j = 0 if abs(j) < 26 else (j + 4 if j > 0 else j - 4)   # 4/64 moves past any kink band
                    # log-ratio = l_n - l_old = j/64 (old = -k/64); kept in (-4, 0]
                    vals[n] = -(k - j) / 64 if 0 <= k - j <= 255 else -k / 64
            for name in fields:
                rows[name].append(vals[name])
        for name in fields:
            out[name].append(rows[name])
    return out


def padded_batch(src: Source, fields=("logprobs", "old_logprobs", "advantages"), *, B=None, T=None, max_B: int = 4,
                 max_T: int = 8, min_B: int = 2, min_T: int = 3, junk: bool = True, per_token_advantages: bool | None = None, min_prompt: int = 0,
                 max_prompt: int = 2, empty: bool = True, holes: bool = False, mismatch: int = 16,
                 extreme: bool = False, vocab: int = 4) -> dict:
    """A ragged padded batch with the requested canonical fields (see the module docstring)."""
    B = src.integer(min(min_B, max_B), max_B) if B is None else B
    T = src.integer(min(min_T, max_T), max_T) if T is None else T
    mask = ragged_mask(src, B, T, min_prompt=min_prompt, max_prompt=max_prompt, empty=empty, holes=holes)
    out = {"mask": mask}
    lp_fields = [f for f in ("logprobs", "old_logprobs", "sampler_logprobs", "ref_logprobs") if f in fields]
    if lp_fields:
        out.update(logprob_triple(src, mask, mismatch=mismatch, extreme=extreme, junk=junk, fields=tuple(lp_fields)))
    if "advantages" in fields:
        tok = src.boolean(3) if per_token_advantages is None else per_token_advantages
        if tok:
            out["advantages"] = _per_token(src, mask, lambda: src.integer(-16, 16) / 8, junk)
        else:
            out["advantages"] = [src.integer(-16, 16) / 8 for _ in range(B)]
    if "rewards" in fields or "group_ids" in fields:
        groups = grpo_group_data(src, B)
        out.update({k: v for k, v in groups.items() if k in fields})
    if "document_ids" in fields:
        out["document_ids"] = document_ids_for(src, B, T)
    if "values" in fields:
        out["values"] = _per_token(src, mask, lambda: src.integer(-64, 64) / 16, junk)
    if "entropy" in fields:
        out["entropy"] = _per_token(src, mask, lambda: src.integer(0, 96) / 32, junk)
    if "logits" in fields:
        out["logits"] = [[[src.integer(-32, 32) / 8 if m or not junk else junk_value(src) for _ in range(vocab)]
                          for m in row] for row in mask]
    if "targets" in fields:
        out["targets"] = [[src.integer(0, vocab - 1) for _ in row] for row in mask]
    return out


def cp_partition(src: Source) -> dict:
    """A context-parallel configuration (parameters of ``dist.cp_split``/``dist.cp_reduce``)."""
    return {"cp_size": src.choice((1, 2, 2, 3, 4)), "layout": src.choice(("thd", "bshd")),
            "ownership": src.choice(("logit", "position"))}


def micro_batch_sizes(src: Source, B: int) -> list:
    """Sizes of consecutive micro-batches (each >= 1) summing to B."""
    sizes, left = [], B
    while left:
        s = src.integer(1, left)
        sizes.append(s)
        left -= s
    return sizes


def long_sequence_batch(seed: int, lengths, *, fields=("logprobs", "old_logprobs", "sampler_logprobs")) -> dict:
    """Rows of the given lengths (T = max length, right padding) made by ``pgspec-splitmix64/1``."""
    from .generator import generate_inputs

    T = max(lengths)
    spec = {"generator": "pgspec-splitmix64/1", "seed": seed, "B": len(lengths), "T": T,
            "fields": list(fields) + ["mask"], "lengths": list(lengths)}
    return generate_inputs(spec)


# Strategies ------------------------------------------------------------------------------------
# hypothesis is imported by whoever asks for a strategy, not by the seeded sources a `pgspec run`
# uses (it costs a tenth of a second at import)
def _composite(fn):
    """``hypothesis.strategies.composite(fn)``, applied when the strategy is first asked for."""
    built = []

    @functools.wraps(fn)
    def strategy(*args, **kwargs):
        if not built:
            from hypothesis import strategies as st

            built.append(st.composite(fn))
        return built[0](*args, **kwargs)

    return strategy


def logprob_values(max_exp: int = 10):
    """A bf16-exact log-prob in (-2, 0)."""
    from hypothesis import strategies as st

    return st.builds(lambda e, m: -(1.0 + m / 128.0) * 2.0 ** -e, st.integers(0, max_exp), st.integers(0, 127))


@_composite
def ragged_masks(draw, B=None, T=None, max_B: int = 4, max_T: int = 8, **kw):
    """Boolean [B,T] masks: masked prompt prefix (length >= 0), response (length >= 0), padding."""
    src = DrawSource(draw)
    B = src.integer(1, max_B) if B is None else B
    T = src.integer(1, max_T) if T is None else T
    return ragged_mask(src, B, T, **kw)


@_composite
def padded_batches(draw, fields=("logprobs", "old_logprobs", "advantages"), **kw):
    """A ragged padded batch (see ``padded_batch`` for the keyword arguments)."""
    return padded_batch(DrawSource(draw), fields, **kw)


@_composite
def grpo_groups(draw, B=None, max_B: int = 8):
    """``{"rewards", "group_ids"}`` with singleton and identical-reward groups."""
    src = DrawSource(draw)
    return grpo_group_data(src, src.integer(1, max_B) if B is None else B)


@_composite
def logprob_triples(draw, B=None, T=None, max_B: int = 4, max_T: int = 8, mismatch: int = 16, extreme: bool = True,
                    junk: bool = True):
    """``{"mask", "logprobs", "old_logprobs", "sampler_logprobs"}`` with controlled mismatch."""
    src = DrawSource(draw)
    B = src.integer(1, max_B) if B is None else B
    T = src.integer(1, max_T) if T is None else T
    mask = ragged_mask(src, B, T)
    return {"mask": mask, **logprob_triple(src, mask, mismatch=mismatch, extreme=extreme, junk=junk)}


@_composite
def long_sequences(draw, min_len: int = 1024, max_len: int = 9216, max_B: int = 2,
                   fields=("logprobs", "old_logprobs", "sampler_logprobs")):
    """One or two long sequences (up to ~9k tokens, the length of NeMo-RL#2269's collapse)."""
    from hypothesis import strategies as st

    seed = draw(st.integers(0, 2 ** 32 - 1))
    lengths = draw(st.lists(st.integers(min_len, max_len), min_size=1, max_size=max_B))
    return long_sequence_batch(seed, lengths, fields=fields)


@_composite
def document_packed_rows(draw, B=None, T=None, max_B: int = 3, max_T: int = 12, max_docs: int = 3):
    """``{"mask", "values", "document_ids"}``: packed rows of contiguous documents."""
    src = DrawSource(draw)
    B = src.integer(1, max_B) if B is None else B
    T = src.integer(1, max_T) if T is None else T
    mask = ragged_mask(src, B, T, max_prompt=0, holes=True)
    return {"mask": mask, "values": _per_token(src, mask, lambda: src.integer(-64, 64) / 16, True),
            "document_ids": document_ids_for(src, B, T, max_docs)}


@_composite
def cp_partitions(draw):
    """``{"cp_size", "layout", "ownership"}`` for the zig-zag split."""
    return cp_partition(DrawSource(draw))


@_composite
def micro_batch_partitions(draw, B: int):
    """Sizes of consecutive micro-batches summing to ``B``."""
    return micro_batch_sizes(DrawSource(draw), B)


__all__ = [
    "Source", "DrawSource", "SeededSource", "JUNK", "EXTREME_LOG_RATIOS",
    "logprob_value", "junk_value", "ragged_mask", "grpo_group_data", "document_ids_for", "logprob_triple",
    "padded_batch", "cp_partition", "micro_batch_sizes", "long_sequence_batch",
    "logprob_values", "ragged_masks", "padded_batches", "grpo_groups", "logprob_triples", "long_sequences",
    "document_packed_rows", "cp_partitions", "micro_batch_partitions",
]
