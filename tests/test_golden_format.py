"""spec/golden-format.md, read as a reader in another language would read it.

The generator of scale-case inputs and the stored positions are implemented here from the text of
the spec alone, in plain Python (no numpy, nothing from pgspec), and must reproduce the corpus bit
for bit: the inputs the project's generator makes, the stored ``positions`` lists, stored outputs
recomputed from the reproduced inputs, and every stored cotangent (``pgspec-cotangent/1``).  A
version 1 corpus is refused, naming the version. The parameter rule (a JSON number is its binary64
value, a decimal string its decimal) is checked against a stored case.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest
from mpmath import mp, mpf

GOLDEN = Path(__file__).resolve().parents[1] / "conformance" / "golden"
M64 = (1 << 64) - 1


# ---- the spec's pseudo-code, transcribed line by line -------------------------------------------

class Gen:
    def __init__(self, seed):
        self.state = seed & M64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def value(e, m):
    return -(1 + m / 128) * 2.0 ** (-e)


def generate(recipe):
    g = Gen(recipe["seed"])
    B, T, F = recipe["B"], recipe["T"], set(recipe["fields"])
    first = "logprobs" if "logprobs" in F else ("values" if "values" in F else None)
    out = {}
    for name in [first, "old_logprobs", "sampler_logprobs", "ref_logprobs"]:
        if name is not None and name in F:
            out[name] = [[None] * T for _ in range(B)]
    for b in range(B):
        for t in range(T):
            e = g.below(11)
            m = g.below(128)
            if first is not None:
                out[first][b][t] = value(e, m)
            for name, k in (("old_logprobs", 3), ("sampler_logprobs", 3), ("ref_logprobs", 4)):
                if name in F:
                    j = g.below(2 * k + 1) - k
                    out[name][b][t] = value(e, min(max(m + j, 0), 127))
    if "advantages" in F:
        out["advantages"] = [(g.below(17) - 8) / 8 for _ in range(B)]
    if "rewards" in F:
        out["rewards"] = [float(g.below(2)) for _ in range(B)]
    L = recipe["lengths"] if recipe["lengths"] is not None else [T] * B
    if "mask" in F:
        out["mask"] = [[t < L[b] for t in range(T)] for b in range(B)]
    if "group_ids" in F:
        G = recipe["groups"] or 1
        out["group_ids"] = [b % G for b in range(B)]
    if "document_ids" in F:
        D = recipe["documents"] or 1
        out["document_ids"] = [[b * D + (t * D) // T for t in range(T)] for b in range(B)]
    return out


def positions_of(recipe, mask):
    B, T = recipe["B"], recipe["T"]
    positions = []
    for b in range(B):
        U = [t for t in range(T) if mask[b][t]]
        for t in U[0:8] + U[max(0, len(U) - 8):len(U)]:
            if [b, t] not in positions:
                positions.append([b, t])
    h = Gen(recipe["seed"] ^ 0x5EED)
    for _ in range(16):
        p = [h.below(B), h.below(T)]
        if p not in positions:
            positions.append(p)
    return positions


# ---- the corpus -------------------------------------------------------------------------------

def _cases():
    cases = {}
    for path in sorted(GOLDEN.glob("*.json")):
        if path.name == "schema.json":
            continue
        for case in json.loads(path.read_text())["cases"]:
            cases[case["id"]] = case
    return cases


CASES = _cases()
SCALE = sorted(cid for cid, c in CASES.items() if "$generate" in c["inputs"])
# A few recipes covering every stream and structure field, kept small enough for plain Python.
SAMPLE = [
    "ratio.token/scale-8192",           # logprobs, old_logprobs, mask (no lengths)
    "is.token.truncate/scale-8192",     # no first stream: e, m still drawn; lengths
    "loss.grpo/scale-8192",             # logprobs, old, ref, advantages
    "loss.minirl/scale-8192",           # sampler_logprobs
    "agg.prompt_mean/scale-8192",       # values, group_ids
    "agg.document_mean/scale-8192",     # values, document_ids
]


def test_sample_is_in_corpus():
    assert SCALE, "the corpus has scale cases"
    for cid in SAMPLE:
        assert cid in CASES and "$generate" in CASES[cid]["inputs"], cid


def _bits(x):
    if isinstance(x, list):
        return [_bits(v) for v in x]
    return x.hex() if isinstance(x, float) else x


@pytest.mark.parametrize("cid", SAMPLE)
def test_text_reproduces_generator(cid):
    from pgspec.conformance.corpus.generator import generate_inputs

    recipe = CASES[cid]["inputs"]["$generate"]
    mine = generate(recipe)
    theirs = generate_inputs(recipe)
    assert sorted(mine) == sorted(theirs)
    for name in mine:
        assert _bits(mine[name]) == _bits(theirs[name]), (cid, name)


@pytest.mark.parametrize("cid", SCALE)
def test_text_reproduces_stored_positions(cid):
    case = CASES[cid]
    recipe = case["inputs"]["$generate"]
    B, T = recipe["B"], recipe["T"]
    L = recipe["lengths"] if recipe["lengths"] is not None else [T] * B
    mask = [[t < L[b] for t in range(T)] for b in range(B)]
    assert positions_of(recipe, mask) == case["positions"]


def test_stored_ratio_outputs_follow_from_the_text():
    """ratio.token/scale-8192: the stored ratio at every stored position is e^(l - l_old) of the
    inputs the text generates, to all 40 stored digits."""
    case = CASES["ratio.token/scale-8192"]
    x = generate(case["inputs"]["$generate"])
    with mp.workdps(60):
        for (b, t), stored in zip(case["positions"], case["outputs"]["ratio"]):
            got = mp.nstr(mp.exp(mpf(x["logprobs"][b][t]) - mpf(x["old_logprobs"][b][t])), 40)
            assert mpf(got) == mpf(stored), (b, t, got, stored)


def test_stored_aggregate_follows_from_the_text():
    """agg.token_mean/scale-8192: the stored value is the exact token mean of the generated values."""
    case = CASES["agg.token_mean/scale-8192"]
    x = generate(case["inputs"]["$generate"])
    total, count = Fraction(0), 0
    for row, mrow in zip(x["values"], x["mask"]):
        for v, keep in zip(row, mrow):
            if keep:
                total += Fraction(v)
                count += 1
    stored = case["outputs"]["value"]
    with mp.workdps(60):
        exact = mpf(total.numerator) / total.denominator / count
        assert mpf(mp.nstr(exact, 40)) == mpf(stored), stored


class _OldStateGen(Gen):
    """A misreading: mix the state from before the increment."""

    def next(self):
        z = self.state
        self.state = (self.state + 0x9E3779B97F4A7C15) & M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        return z ^ (z >> 31)


def test_other_readings_do_not_reproduce_the_corpus():
    """The comparison above can fail: a generator that mixes the old state, or draws position-major
    (t outer), gives other numbers than the corpus's generator on the same recipe."""
    from pgspec.conformance.corpus.generator import generate_inputs

    recipe = dict(CASES["is.token.truncate/scale-8192"]["inputs"]["$generate"], T=64, lengths=None)
    theirs = generate_inputs(recipe)
    global Gen
    saved = Gen
    try:
        Gen = _OldStateGen
        assert _bits(generate(recipe)["old_logprobs"]) != _bits(theirs["old_logprobs"])
    finally:
        Gen = saved
    assert _bits(generate(recipe)["old_logprobs"]) == _bits(theirs["old_logprobs"])
    swapped = dict(recipe, B=recipe["T"], T=recipe["B"])  # the same draws laid out t-outer
    flat = generate(swapped)["old_logprobs"]
    transposed = [[flat[t][b] for t in range(recipe["T"])] for b in range(recipe["B"])]
    assert _bits(transposed) != _bits(theirs["old_logprobs"])


# ---- parameters: JSON number = binary64, decimal string = decimal ------------------------------

def test_json_number_parameter_is_its_binary64_value():
    case = CASES["is.sequence.truncate/spec-example"]
    c_max = case["params"]["c_max"]
    assert isinstance(c_max, float) and c_max == 1.2
    assert Fraction(c_max) == Fraction("1.1999999999999999555910790149937383830547332763671875")
    stored = case["outputs"]["seq_weight"][0]
    assert stored == "1.199999999999999955591079014993738383055"  # binary64 1.2, not the decimal 1.2
    with mp.workdps(60):
        assert mp.nstr(mpf(c_max), 40) == stored
        assert mp.nstr(mpf("1.2"), 40) != stored


def test_decimal_string_parameter_is_its_decimal():
    from pgspec.reference import evaluate

    case = CASES["is.sequence.truncate/spec-example"]
    inputs = {k: [[float(v) for v in row] if isinstance(row[0], str) else row for row in rows]
              for k, rows in case["inputs"].items()}
    as_float = evaluate(case["formula"], inputs, {"c_max": 1.2})
    as_decimal = evaluate(case["formula"], inputs, {"c_max": "1.2"})
    assert mp.nstr(as_float["seq_weight"][0], 40) == case["outputs"]["seq_weight"][0]
    assert mp.nstr(as_decimal["seq_weight"][0], 40) == "1.2"
    assert not math.isclose(0.0, float(as_float["seq_weight"][0] - as_decimal["seq_weight"][0]))


# ---- the cotangent (pgspec-cotangent/1), transcribed from the spec's text -----------------------

def cot_seed(case_id):
    import hashlib

    return int.from_bytes(hashlib.sha256(case_id.encode("utf-8")).digest()[:8], "big")


def cot_c(v):
    return (1 + v / 8) if v < 8 else -(1 + (v - 8) / 8)


def cotangent(seed, shape):
    g = Gen(seed)

    def build(dims):
        if not dims:
            return cot_c(g.below(16))
        return [build(dims[1:]) for _ in range(dims[0])]

    return build(list(shape))


def _shape(x):
    shape = []
    while isinstance(x, list):
        shape.append(len(x))
        if not x:
            break
        x = x[0]
    return shape


def _as_floats(x):
    return [_as_floats(v) for v in x] if isinstance(x, list) else float(x)


def test_the_text_reproduces_every_stored_cotangent():
    stored = [c for c in CASES.values() if "cotangent" in c]
    assert len(stored) > 1000
    for case in stored:
        c = case["cotangent"]
        if isinstance(c, dict):
            recipe = c["$generate"]
            assert recipe["generator"] == "pgspec-cotangent/1"
            assert int(recipe["seed"], 16) == cot_seed(case["id"]), case["id"]
            assert recipe["seed"] == f"0x{cot_seed(case['id']):016x}"
        else:
            assert _as_floats(c) == cotangent(cot_seed(case["id"]), _shape(c)), case["id"]


def test_the_text_reproduces_the_generator_on_a_scale_recipe():
    from pgspec.conformance.corpus.generator import cotangent_recipe

    case = CASES["ratio.token/scale-8192"]
    recipe = case["cotangent"]["$generate"]
    assert recipe["shape"] == [recipe_B := case["inputs"]["$generate"]["B"], case["inputs"]["$generate"]["T"]]
    assert recipe_B >= 1
    mine = cotangent(int(recipe["seed"], 16), recipe["shape"])
    assert _bits(mine) == _bits(cotangent_recipe(recipe))


def test_the_spec_example_follows_from_the_text():
    """The worked example in spec/golden-format.md ("Cotangent"): the seed, the draws and the lists."""
    import re

    text = (GOLDEN.parents[1] / "spec" / "golden-format.md").read_text()
    section = text[text.index("## Cotangent"):text.index("## Migrating from version 1")]
    seed = cot_seed("ratio.token/two-tokens")
    assert f"seed `0x{seed:016x}`" in section and f"sha256 `{seed:016x}"[:17] in section
    draws = re.search(r"draws `below\(16\)` are ([0-9, ]+),", section).group(1)
    g = Gen(seed)
    assert [int(d) for d in draws.split(",")] == [g.below(16) for _ in draws.split(",")]
    assert _as_floats(CASES["ratio.token/two-tokens"]["cotangent"]) == cotangent(seed, [1, 2])
    assert "`[[-1.125, -1.625, -1.375], [-1.5, 1.75, 1.25]]`" in section
    assert cotangent(seed, [2, 3]) == [[-1.125, -1.625, -1.375], [-1.5, 1.75, 1.25]]


def test_other_readings_of_the_cotangent_do_not_reproduce_the_corpus():
    """The comparison above can fail: a little-endian seed, or the sign from the low bit, give other
    values than the stored ones."""
    case = CASES["ratio.token/two-tokens"]
    stored = _as_floats(case["cotangent"])
    import hashlib

    little = int.from_bytes(hashlib.sha256(case["id"].encode()).digest()[:8], "little")
    assert cotangent(little, [1, 2]) != stored
    g = Gen(cot_seed(case["id"]))
    low_bit_sign = [[(1 + (v >> 1) / 8) * (-1 if v & 1 else 1) for v in (g.below(16), g.below(16))]]
    assert low_bit_sign != stored


# ---- version 1 is refused, naming the version ---------------------------------------------------

def test_a_version_1_corpus_is_refused_naming_the_version(tmp_path):
    import hashlib
    import shutil

    from pgspec.conformance.corpus import golden

    for name in ("MANIFEST", "ratio.json", "schema.json"):
        shutil.copy(GOLDEN / name, tmp_path / name)
    manifest = json.loads((tmp_path / "MANIFEST").read_text())
    manifest["format"] = "pgspec-golden/1"
    (tmp_path / "MANIFEST").write_text(json.dumps(manifest))
    with pytest.raises(golden.GoldenError, match=r"'pgspec-golden/1'.*'pgspec-golden/2'"):
        golden.load_manifest(tmp_path)
    # a family file of version 1 under a version 2 MANIFEST (its checksum right): refused too
    doc = json.loads((GOLDEN / "ratio.json").read_text())
    doc["format"] = "pgspec-golden/1"
    data = json.dumps(doc).encode()
    (tmp_path / "ratio.json").write_bytes(data)
    manifest["format"] = "pgspec-golden/2"
    manifest["files"] = {"ratio.json": hashlib.sha256(data).hexdigest()}
    (tmp_path / "MANIFEST").write_text(json.dumps(manifest))
    golden._PARSED.clear()
    with pytest.raises(golden.GoldenError, match=r"ratio.json: format 'pgspec-golden/1' is not read.*version 1"):
        golden.load_family("ratio", tmp_path)
    golden._PARSED.clear()
    # the file as generated loads
    (tmp_path / "ratio.json").write_bytes((GOLDEN / "ratio.json").read_bytes())
    shutil.copy(GOLDEN / "MANIFEST", tmp_path / "MANIFEST")
    assert golden.load_family("ratio", tmp_path)["format"] == "pgspec-golden/2"
