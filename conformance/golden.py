"""The golden corpus: generation from the reference, byte-exact verification, checked loading.

Files: ``conformance/golden/<family>.json`` (one per family), ``schema.json`` (JSON Schema of a
family file) and ``MANIFEST`` (sha256 of each file, pgspec and mpmath versions, precision).
Only ``generate`` writes them.  Format: spec/golden-format.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import mpmath
from mpmath import mp, mpf

from pgspec.reference import REGISTRY, evaluate

from .cases import Case, Generated, all_cases
from .generator import SplitMix64, generate_inputs

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
SCHEMA_PATH = GOLDEN_DIR / "schema.json"
MANIFEST_PATH = GOLDEN_DIR / "MANIFEST"
FORMAT = "pgspec-golden/1"
DPS = 60
DIGITS = 40
SCALE_DIGITS = 6
SAMPLES_PER_END = 8
RANDOM_SAMPLES = 16


class GoldenError(Exception):
    """A golden file that is missing, altered (checksum) or malformed (schema)."""


def pgspec_version() -> str:
    try:
        return metadata.version("pgspec")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


# number formats ---------------------------------------------------------------------------------

def bf16_exact(x: float) -> bool:
    """True when x is exactly representable in bfloat16 (NaN and infinities included)."""
    if math.isnan(x) or math.isinf(x):
        return True
    try:
        bits = struct.unpack(">I", struct.pack(">f", x))[0]
    except OverflowError:
        return False
    return struct.unpack(">f", struct.pack(">I", bits))[0] == x and (bits & 0xFFFF) == 0


def input_str(x, where: str) -> str:
    """Shortest round-trip decimal of a bfloat16-exact real input ("nan", "inf", "-inf" allowed)."""
    v = float(x)
    if isinstance(x, str) and not (math.isnan(v) or math.isinf(v)) and mpf(x) != mpf(v):
        raise ValueError(f"{where}: {x!r} is not exactly a binary floating-point number")
    if not bf16_exact(v):
        raise ValueError(f"{where}: {x!r} is not exactly representable in bfloat16")
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(v)


def output_str(x, digits=DIGITS):
    """A 40-significant-digit decimal of an mpf (bools, ints and nulls pass through)."""
    if x is None or isinstance(x, bool) or isinstance(x, int):
        return x
    if not isinstance(x, mpf):
        raise TypeError(f"output_str takes an mpf, got {x!r}")
    with mp.workdps(DPS):  # never round the value to mpmath's global 15 digits
        return mp.nstr(x, digits)


def _map(x, fn):
    return [_map(i, fn) for i in x] if isinstance(x, list) else fn(x)


# generation -------------------------------------------------------------------------------------

def _encode_inputs(case: Case, f) -> dict:
    out = {}
    for name, value in case.inputs.items():
        spec = f.input(name)
        if spec.kind in ("bool", "int"):
            out[name] = value
        else:
            out[name] = _map_path(value, lambda v, p: input_str(v, f"case {case.id}: input {name}{p}"))
    return out


def _map_path(x, fn, path=""):
    if isinstance(x, list):
        return [_map_path(item, fn, f"{path}[{k}]") for k, item in enumerate(x)]
    return fn(x, path)


def sample_positions(spec: dict, mask) -> list:
    """The positions stored for a scale case: the first and last SAMPLES_PER_END of each sequence's
    unmasked tokens, then RANDOM_SAMPLES positions drawn with SplitMix64(seed XOR 0x5EED) as
    (below(B), below(T)); duplicates removed, in first-seen order."""
    B, T = spec["B"], spec["T"]
    seen = []
    for b in range(B):
        ts = [t for t in range(T) if mask[b][t]]
        for t in ts[:SAMPLES_PER_END] + ts[-SAMPLES_PER_END:]:
            if [b, t] not in seen:
                seen.append([b, t])
    rng = SplitMix64(spec["seed"] ^ 0x5EED)
    for _ in range(RANDOM_SAMPLES):
        p = [rng.below(B), rng.below(T)]
        if p not in seen:
            seen.append(p)
    return seen


def generate_case(case: Case) -> dict:
    f = REGISTRY[case.formula]
    record = {
        "id": case.id,
        "formula": case.formula,
        "category": case.category,
        "description": case.description,
        "links": list(case.links),
        "params": case.params,
    }
    if isinstance(case.inputs, Generated):
        gen = case.inputs.to_json()
        inputs = generate_inputs(gen)
        record["inputs"] = {"$generate": gen}
    else:
        inputs = case.inputs
        record["inputs"] = _encode_inputs(case, f)
    if case.expect_error is not None:
        return _error_record(case, inputs, record)
    result = evaluate(case.formula, inputs, case.params, dps=DPS, with_scale=True)
    scale = result["scale"]
    positions = None
    if isinstance(case.inputs, Generated):
        positions = sample_positions(record["inputs"]["$generate"], inputs["mask"])
        record["positions"] = positions

    def store(value, digits, shape_of):
        if positions is not None and shape_of[:2] == ("B", "T"):
            return [output_str(value[b][t], digits) for b, t in positions]
        return _map(value, lambda v: output_str(v, digits))

    record["outputs"] = {o.name: store(result[o.name], DIGITS, o.shape) for o in f.outputs}
    record["grad"] = {name: store(g, DIGITS, f.input(name).shapes[0]) for name, g in result["grad"].items()}
    scales = {}
    for o in f.outputs:
        scales[o.name] = store(scale[o.name], SCALE_DIGITS, o.shape)
    for name in result["grad"]:
        scales[f"grad.{name}"] = store(scale[f"grad.{name}"], SCALE_DIGITS, f.input(name).shapes[0])
    record["scale"] = scales
    return record


def _error_record(case: Case, inputs: dict, record: dict) -> dict:
    """An expected-error case: the reference must reject it with a SpecError naming the argument."""
    from pgspec.reference import SpecError

    try:
        evaluate(case.formula, inputs, case.params, dps=DPS)
    except SpecError as e:
        message = str(e)
    else:
        raise ValueError(f"case {case.id}: the reference accepts an input the case expects it to reject")
    if case.expect_error["argument"] not in message:
        raise ValueError(f"case {case.id}: the reference's error does not name {case.expect_error['argument']!r}: "
                         f"{message}")
    record["expect_error"] = {**case.expect_error, "message": message}
    record["outputs"], record["grad"], record["scale"] = {}, {}, {}
    return record


def family_of(case: Case) -> str:
    return REGISTRY[case.formula].family


def _jobs() -> int:
    """Worker processes for generation: PGSPEC_JOBS, else the CPU count (at most 8)."""
    import os

    value = os.environ.get("PGSPEC_JOBS")
    if value:
        return max(1, int(value))
    return max(1, min(8, os.cpu_count() or 1))


def _generate_records(cases: list) -> list:
    """generate_case over ``cases`` in worker processes; the result order is the cases' order, and
    each record depends only on its case, so the bytes do not depend on the number of workers."""
    jobs = _jobs()
    if jobs == 1 or len(cases) < 2:
        return [generate_case(c) for c in cases]
    import multiprocessing

    # the long scale cases first, so that both workers stay busy to the end
    order = sorted(range(len(cases)), key=lambda k: -_weight(cases[k]))
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        done = pool.map(generate_case, [cases[k] for k in order], chunksize=1)
    records = [None] * len(cases)
    for k, record in zip(order, done):
        records[k] = record
    return records


def _weight(case: Case) -> int:
    return case.inputs.B * case.inputs.T if isinstance(case.inputs, Generated) else 1


def generate_all(families=None) -> dict[str, bytes]:
    """Every family file's bytes, generated from the case definitions and the reference."""
    by_family: dict[str, list] = {}
    for case in all_cases():
        fam = family_of(case)
        if families is None or fam in families:
            by_family.setdefault(fam, []).append(case)
    ordered = [c for _, cases in sorted(by_family.items()) for c in cases]
    records = iter(_generate_records(ordered))
    files = {}
    for fam, cases in sorted(by_family.items()):
        doc = {
            "format": FORMAT,
            "family": fam,
            "generator": {"pgspec": pgspec_version(), "mpmath": mpmath.__version__, "dps": DPS, "digits": DIGITS},
            "cases": [next(records) for _ in cases],
        }
        files[f"{fam}.json"] = (json.dumps(doc, indent=1, ensure_ascii=True) + "\n").encode()
    return files


def manifest_bytes(files: dict[str, bytes]) -> bytes:
    doc = {
        "format": FORMAT,
        "pgspec": pgspec_version(),
        "mpmath": mpmath.__version__,
        "dps": DPS,
        "digits": DIGITS,
        "files": {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())},
    }
    return (json.dumps(doc, indent=1) + "\n").encode()


def write_all(files: dict[str, bytes], directory: Path = GOLDEN_DIR) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.json"):
        if old.name != "schema.json" and old.name not in files:
            old.unlink()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "MANIFEST").write_bytes(manifest_bytes(files))


def verify(directory: Path = GOLDEN_DIR, families=None) -> list[str]:
    """Regenerate in memory; return one message per difference (empty when byte-identical).

    ``families`` restricts the check to those family files (the MANIFEST is then not compared)."""
    files = generate_all(families)
    problems = []
    on_disk = {p.name for p in directory.glob("*.json") if p.name != "schema.json"}
    if families is not None:
        on_disk &= {f"{fam}.json" for fam in families}
    for name in sorted(on_disk - set(files)):
        problems.append(f"{directory / name}: on disk but no longer generated")
    for name, data in files.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{path}: missing (run `pgspec golden generate`)")
            continue
        disk = path.read_bytes()
        if disk != data:
            problems.append(f"{path}: differs from the generator's output; {_first_difference(disk, data)}")
    manifest = directory / "MANIFEST"
    if families is None and (not manifest.exists() or manifest.read_bytes() != manifest_bytes(files)):
        problems.append(f"{manifest}: differs from the generator's output")
    return problems


def _first_difference(disk: bytes, data: bytes) -> str:
    try:
        a, b = json.loads(disk), json.loads(data)
    except ValueError:
        return "the file on disk is not valid JSON"
    ca = {c["id"]: c for c in a.get("cases", [])}
    cb = {c["id"]: c for c in b.get("cases", [])}
    for cid in cb:
        if cid not in ca:
            return f"case {cid} is missing on disk"
        if ca[cid] != cb[cid]:
            keys = [k for k in cb[cid] if ca[cid].get(k) != cb[cid][k]]
            return f"case {cid} differs in {', '.join(keys)}"
    for cid in ca:
        if cid not in cb:
            return f"case {cid} is on disk but no longer generated"
    return "the header or the formatting differs"


# loading ----------------------------------------------------------------------------------------

@lru_cache(maxsize=1)
def _schema():
    return json.loads(SCHEMA_PATH.read_text())


def load_manifest(directory: Path = GOLDEN_DIR) -> dict:
    path = directory / "MANIFEST"
    if not path.exists():
        raise GoldenError(f"{path}: missing; run `pgspec golden generate`")
    return json.loads(path.read_text())


def load_family(family: str, directory: Path = GOLDEN_DIR) -> dict:
    """Load one family file after checking its sha256 against the MANIFEST and its schema."""
    import jsonschema

    path = directory / f"{family}.json"
    if not path.exists():
        raise GoldenError(f"{path}: no golden file for family {family!r}")
    data = path.read_bytes()
    expected = load_manifest(directory)["files"].get(path.name)
    actual = hashlib.sha256(data).hexdigest()
    if expected != actual:
        raise GoldenError(f"{path}: sha256 {actual} does not match the MANIFEST ({expected}); "
                          "golden files are only written by `pgspec golden generate`")
    doc = json.loads(data)
    marker = _validated_marker(actual)
    if marker is None or not marker.exists():
        try:
            jsonschema.validate(doc, _schema())
        except jsonschema.ValidationError as e:
            where = "/".join(str(p) for p in e.absolute_path)
            raise GoldenError(f"{path}: does not match schema.json at {where or 'the top level'}: {e.message}") from None
        if marker is not None:
            try:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
            except OSError:
                pass  # a read-only cache only costs time
    return doc


def _validated_marker(file_sha: str) -> Path | None:
    """A cache entry saying: bytes with this sha256 were validated against this exact schema.

    Sound because the sha256 identifies the bytes; it only saves re-validating the same file on
    every run.  Kept under $PGSPEC_CACHE (default: $XDG_CACHE_HOME/pgspec or ~/.cache/pgspec);
    PGSPEC_CACHE=off disables it.
    """
    import os

    root = os.environ.get("PGSPEC_CACHE")
    if root == "off":
        return None
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pgspec")
    schema_sha = hashlib.sha256(SCHEMA_PATH.read_bytes()).hexdigest()[:16]
    return Path(root) / "validated" / f"{file_sha}-{schema_sha}"


def load_all(directory: Path = GOLDEN_DIR) -> list[dict]:
    """Every case of every family file, each with its family added."""
    cases = []
    for name in sorted(load_manifest(directory)["files"]):
        doc = load_family(name[:-5], directory)
        for c in doc["cases"]:
            cases.append({**c, "family": doc["family"]})
    return cases


def case_inputs(case: dict) -> dict:
    """The inputs of a loaded case as Python values (floats, bools, ints), generated if need be."""
    raw = case["inputs"]
    if "$generate" in raw:
        return generate_inputs(raw["$generate"])
    f = REGISTRY[case["formula"]]
    out = {}
    for name, value in raw.items():
        kind = f.input(name).kind
        out[name] = value if kind in ("bool", "int") else _map(value, float)
    return out
