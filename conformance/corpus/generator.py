"""``pgspec-splitmix64/1``: the deterministic input generator of scale cases (spec/golden-format.md).

Every value it makes is exactly representable in bfloat16, so one case serves float64, float32 and
bfloat16 runs.  It is specified bit for bit so that a C++ or CUDA test can reproduce it.
"""

from __future__ import annotations

MASK64 = (1 << 64) - 1


class SplitMix64:
    """SplitMix64 (Steele, Lea, Flood 2014), the reference 64-bit version."""

    def __init__(self, seed: int):
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """An integer in [0, n): next() mod n (the bias is irrelevant for test data)."""
        return self.next() % n


def logprob_value(e: int, m: int) -> float:
    """-(1 + m/128) * 2^-e: a bfloat16 number (8 significant bits) in (-2, 0)."""
    return -(1.0 + m / 128.0) * 2.0 ** -e


def generate_inputs(spec: dict) -> dict:
    """Make the inputs a ``Generated`` recipe describes (vectorized; the same numbers as
    ``generate_inputs_reference``, the procedure as documented, which a test checks)."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is a dependency; the reference needs nothing
        return generate_inputs_reference(spec)
    return _generate_numpy(spec, np)


_GAMMA = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB


def _draws(np, seed: int, first: int, count: int):
    """The SplitMix64 outputs number first+1 .. first+count: the state after k calls is
    seed + k * gamma (mod 2^64), so every draw can be computed independently."""
    k = np.arange(first + 1, first + count + 1, dtype=np.uint64)
    z = np.uint64(seed & MASK64) + k * np.uint64(_GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_C1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_C2)
    return z ^ (z >> np.uint64(31))


def generate_arrays(spec: dict) -> dict:
    """``generate_inputs`` as numpy arrays (float64 reals, bool mask, int64 ids): the same numbers,
    for production-size inputs (``pgspec check``) where nested lists would cost more than the check."""
    import numpy as np

    out = _generate_numpy(spec, np, as_lists=False)
    out.update(_structure_arrays(spec, np))
    return out


def _structure_arrays(spec: dict, np) -> dict:
    """mask, group_ids and document_ids (those in ``fields``) as numpy arrays."""
    B, T = spec["B"], spec["T"]
    fields = set(spec["fields"])
    out = {}
    lengths = np.asarray(spec.get("lengths") or [T] * B)
    if "mask" in fields:
        out["mask"] = np.arange(T)[None, :] < lengths[:, None]
    if "group_ids" in fields:
        out["group_ids"] = np.arange(B) % (spec.get("groups") or 1)
    if "document_ids" in fields:
        docs = spec.get("documents") or 1
        out["document_ids"] = np.arange(B)[:, None] * docs + (np.arange(T)[None, :] * docs) // T
    return out


def _generate_numpy(spec: dict, np, as_lists: bool = True) -> dict:
    B, T = spec["B"], spec["T"]
    fields = set(spec["fields"])
    lengths = spec.get("lengths") or [T] * B
    primary = "logprobs" if "logprobs" in fields else "values" if "values" in fields else None
    extra = [(n, w) for n, w in (("old_logprobs", 3), ("sampler_logprobs", 3), ("ref_logprobs", 4)) if n in fields]
    D = 2 + len(extra)
    P = B * T
    with np.errstate(over="ignore"):
        raw = _draws(np, spec["seed"], 0, P * D).reshape(P, D)
        e = (raw[:, 0] % np.uint64(11)).astype(np.int64)
        m = (raw[:, 1] % np.uint64(128)).astype(np.int64)
        scale = np.ldexp(1.0, -e)
        out = {}
        if primary:
            out[primary] = _out((-(1.0 + m / 128.0) * scale).reshape(B, T), as_lists)
        for slot, (name, spread) in enumerate(extra, start=2):
            j = (raw[:, slot] % np.uint64(2 * spread + 1)).astype(np.int64) - spread
            mj = np.clip(m + j, 0, 127)
            out[name] = _out((-(1.0 + mj / 128.0) * scale).reshape(B, T), as_lists)
        used = P * D
        if "advantages" in fields:
            a = (_draws(np, spec["seed"], used, B) % np.uint64(17)).astype(np.int64)
            out["advantages"] = _out((a - 8) / 8.0, as_lists)
            used += B
        if "rewards" in fields:
            r = (_draws(np, spec["seed"], used, B) % np.uint64(2)).astype(np.int64)
            out["rewards"] = _out(r.astype(np.float64), as_lists)
    if as_lists:
        _add_structure(out, spec, fields, B, T, lengths)
    return out


def _out(array, as_lists):
    return array.tolist() if as_lists else array


def _add_structure(out, spec, fields, B, T, lengths):
    import numpy as np

    for name, a in _structure_arrays(spec, np).items():
        out[name] = a.tolist()


def generate_inputs_reference(spec: dict) -> dict:
    """Make the inputs a ``Generated`` recipe (as its JSON dict) describes, draw by draw.

    For each sequence b and position t, in that order (b outer, t inner), the generator draws:
    e = below(11), m = below(128) -> logprobs (or values, for an aggregator) = -(1 + m/128) 2^-e; then for old_logprobs and
    sampler_logprobs (when requested, in that order) j = below(7) - 3 and the value
    -(1 + m'/128) 2^-e with m' = min(max(m + j, 0), 127); then for ref_logprobs j = below(9) - 4
    likewise.  Then per sequence: advantages = (below(17) - 8) / 8, rewards = below(2).
    mask[b][t] = t < lengths[b]; group_ids[b] = b mod groups; document_ids[b][t] =
    b * documents + (t * documents) // T (each row cut into `documents` contiguous spans, ids global
    across the batch).  Positions outside the mask still get values (they are excluded by the mask).
    """
    rng = SplitMix64(spec["seed"])
    B, T = spec["B"], spec["T"]
    fields = set(spec["fields"])
    lengths = spec.get("lengths") or [T] * B
    # the first stream is logprobs, or values for an aggregator's input
    primary = "logprobs" if "logprobs" in fields else "values" if "values" in fields else None
    names = [primary] if primary else []
    names += [n for n in ("old_logprobs", "sampler_logprobs", "ref_logprobs") if n in fields]
    out = {name: [] for name in names}
    for b in range(B):
        rows = {name: [] for name in out}
        for _t in range(T):
            e, m = rng.below(11), rng.below(128)
            if primary:
                rows[primary].append(logprob_value(e, m))
            for name, spread in (("old_logprobs", 3), ("sampler_logprobs", 3), ("ref_logprobs", 4)):
                if name in rows:
                    j = rng.below(2 * spread + 1) - spread
                    rows[name].append(logprob_value(e, min(max(m + j, 0), 127)))
        for name in out:
            out[name].append(rows[name])
    if "advantages" in fields:
        out["advantages"] = [(rng.below(17) - 8) / 8 for _ in range(B)]
    if "rewards" in fields:
        out["rewards"] = [float(rng.below(2)) for _ in range(B)]
    _add_structure(out, spec, fields, B, T, lengths)
    return out


# ---- the cotangent of a case (``pgspec-cotangent/1``, spec/golden-format.md "Cotangent") --------

COTANGENT_GENERATOR = "pgspec-cotangent/1"


def cotangent_seed(case_id: str) -> int:
    """The 64-bit seed of a case's cotangent: the first 8 bytes of sha256(UTF-8 case ID), big-endian."""
    import hashlib

    return int.from_bytes(hashlib.sha256(case_id.encode("utf-8")).digest()[:8], "big")


def seed_hex(seed: int) -> str:
    """A 64-bit seed as the corpus stores it: "0x" and 16 lower-case hex digits (a JSON number above
    2^53 would not survive a reader that parses numbers as doubles)."""
    return f"0x{seed & MASK64:016x}"


def cotangent_value(v: int) -> float:
    """The cotangent of one draw v = below(16): +(1 + v/8) for v < 8, -(1 + (v-8)/8) for v >= 8; values
    +-1, +-1.125, ..., +-1.875, exact in bfloat16, so c * x is exact in float64 for a bfloat16 x."""
    return (1.0 + (v % 8) / 8.0) * (1.0 if v < 8 else -1.0)


def cotangent_reference(seed: int, shape) -> object:
    """The cotangent for an output of ``shape`` (a list of sizes; [] for a scalar): one below(16) draw
    of SplitMix64(seed) per element, in row-major order (the last index fastest), as nested lists of
    floats (a float for a scalar).  Draw by draw, as the spec states it."""
    rng = SplitMix64(seed)

    def build(dims):
        if not dims:
            return cotangent_value(rng.below(16))
        return [build(dims[1:]) for _ in range(dims[0])]

    return build(list(shape))


def cotangent_array(seed: int, shape):
    """``cotangent_reference`` as a float64 numpy array of ``shape`` (vectorized; the same numbers)."""
    import numpy as np

    n = 1
    for d in shape:
        n *= int(d)
    with np.errstate(over="ignore"):
        v = (_draws(np, seed, 0, n) % np.uint64(16)).astype(np.int64)
    c = (1.0 + (v % 8) / 8.0) * np.where(v < 8, 1.0, -1.0)
    return c.reshape(tuple(int(d) for d in shape))


def cotangent_values(seed: int, shape):
    """``cotangent_reference`` (nested lists of floats, a float for a scalar), computed vectorized."""
    a = cotangent_array(seed, shape)
    return a.tolist() if a.ndim else float(a)


def cotangent_recipe(recipe: dict):
    """The cotangent a ``{"generator": "pgspec-cotangent/1", "seed": "0x...", "shape": [...]}`` recipe
    describes (a ValueError naming the field when the recipe is malformed)."""
    if not isinstance(recipe, dict) or recipe.get("generator") != COTANGENT_GENERATOR:
        raise ValueError(f"cotangent recipe: generator must be {COTANGENT_GENERATOR!r}, got {recipe!r}")
    seed, shape = recipe.get("seed"), recipe.get("shape")
    if not (isinstance(seed, str) and seed.startswith("0x") and len(seed) == 18):
        raise ValueError(f"cotangent recipe: seed must be '0x' and 16 hex digits, got {seed!r}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise ValueError(f"cotangent recipe: shape must be a list of sizes, got {shape!r}")
    return cotangent_values(int(seed, 16), shape)
