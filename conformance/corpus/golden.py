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

from .cases.case import Case, Generated
from .cases import all_cases
from .generator import (COTANGENT_GENERATOR, SplitMix64, cotangent_recipe, cotangent_seed, cotangent_values,
                        generate_inputs, seed_hex)
from ..base.gcpause import gc_paused

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"   # conformance/golden: the published corpus
SCHEMA_PATH = GOLDEN_DIR / "schema.json"
MANIFEST_PATH = GOLDEN_DIR / "MANIFEST"
FORMAT = "pgspec-golden/2"
# the formats this version reads: only its own (spec/golden-format.md, "Migrating from version 1")
OLD_FORMATS = {"pgspec-golden/1": "version 1 judged every gradient with a cotangent of ones and had no "
                                  "'cotangent' field; regenerate with `pgspec golden generate`"}
DPS = 60
DIGITS = 40
SCALE_DIGITS = 6
SAMPLES_PER_END = 8
RANDOM_SAMPLES = 16


class GoldenError(Exception):
    """A golden file that is missing, altered (checksum) or malformed (schema)."""


class CaseDefinitionError(GoldenError, ValueError):
    """A case definition (conformance/corpus/cases/) the corpus cannot hold: a user's error (exit 2)
    naming the case and the input, not pgspec's."""


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
        raise CaseDefinitionError(f"{where}: {x!r} is not exactly a binary floating-point number "
                                  "(spec/golden-format.md: real inputs are bfloat16-exact)")
    if not bf16_exact(v):
        raise CaseDefinitionError(f"{where}: {x!r} is not exactly representable in bfloat16 "
                                  "(spec/golden-format.md: real inputs are bfloat16-exact)")
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
    seed = cotangent_seed(case.id)
    shape_seen = []

    def cotangent(shape):
        shape_seen.append(shape)
        return cotangent_values(seed, shape)

    result = evaluate(case.formula, inputs, case.params, dps=DPS, with_scale=True,
                      cotangent=cotangent if f.differentiable else None)
    scale = result["scale"]
    positions = None
    if shape_seen:
        if isinstance(case.inputs, Generated):  # a recipe, like the inputs, instead of 8192+ numbers
            record["cotangent"] = {"$generate": {"generator": COTANGENT_GENERATOR, "seed": seed_hex(seed),
                                                 "shape": shape_seen[0]}}
        else:
            record["cotangent"] = _map(cotangent_values(seed, shape_seen[0]),
                                       lambda v: input_str(v, f"case {case.id}: cotangent"))
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

    from ..base.settings import VARIABLES, SettingError

    value = os.environ.get("PGSPEC_JOBS")
    if value is not None and value.strip():     # empty: the default
        try:
            return VARIABLES["PGSPEC_JOBS"].check("PGSPEC_JOBS", value)    # 1 to 256, never clipped
        except SettingError as e:
            raise GoldenError(str(e)) from None
    return max(1, min(8, os.cpu_count() or 1))


def _generate_records(cases: list, progress=None, cache: bool = True, reuse: bool = True) -> list:
    """generate_case over ``cases`` in worker processes; the result order is the cases' order, and
    each record depends only on its case, so the bytes do not depend on the number of workers.

    With ``cache``, records found in the record cache (``_record_key``) are taken from it (unless
    ``reuse`` is false: then every case is evaluated) and evaluated ones are stored there.
    ``progress(done, total)`` is called as records complete."""
    jobs = _jobs()      # a bad PGSPEC_JOBS is refused before any work
    total = len(cases)
    records: list = [None] * total
    keys = [_record_key(c) for c in cases] if cache else [None] * total
    for k, key in enumerate(keys):
        if key is not None and reuse:
            records[k] = _cache_get(key)
    todo = [k for k in range(total) if records[k] is None]
    done = total - len(todo)
    if progress:
        progress(done, total)
    # the long scale cases first, so that both workers stay busy to the end
    todo.sort(key=lambda k: -_weight(cases[k]))
    if jobs == 1 or len(todo) < 2:
        results = ((k, _without_gc(cases[k])) for k in todo)
        pool = None
    else:
        import multiprocessing

        # the workers ignore SIGINT: Ctrl-C reaches the whole process group, and a worker's
        # KeyboardInterrupt was a traceback each (about 65 lines) while the pool started new workers
        # and the run went on; the parent alone is interrupted, and ends the pool below
        pool = multiprocessing.get_context("fork").Pool(jobs, initializer=_ignore_sigint)
        results = pool.imap_unordered(_generate_indexed, [(k, cases[k]) for k in todo], chunksize=1)
    try:
        for k, record in results:
            records[k] = record
            if keys[k] is not None:
                _cache_put(keys[k], record)
            done += 1
            if progress:
                progress(done, total)
    except BaseException:   # Ctrl-C (KeyboardInterrupt) or an error: stop the workers now, not after the queue
        if pool is not None:
            pool.terminate()
            pool.join()
        raise
    else:
        if pool is not None:
            pool.close()
            pool.join()
    _STATS["cached"], _STATS["evaluated"] = total - len(todo), len(todo)
    return records


def _ignore_sigint():
    """A pool worker: Ctrl-C is the parent's to act on, and SIGTERM (how the parent's pool ends its
    workers) ends the worker at once, with the default action, not pgspec's handler forked from it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _generate_indexed(item):
    k, case = item
    return k, _without_gc(case)


def _without_gc(case: Case) -> dict:
    """generate_case with Python's cyclic garbage collector paused.

    A long-sequence case builds about twenty graph nodes per token (650,000 for 32,768 tokens),
    and each allocation counts towards the collector's next pass, which walks every live node:
    a third of such a case's time went there (`pgspec golden verify --no-cache`: 100 s of CPU
    with the collector paused, against 127 to 140 s).  The graph has no reference cycles (a node
    refers only to its operands, made before it), so reference counting frees it as it goes; the
    collector is resumed afterwards, whatever happens, and takes any cycle made elsewhere."""
    with gc_paused():
        return generate_case(case)


_STATS = {"cached": 0, "evaluated": 0}


# The record cache: a generated case record is a deterministic function of the case (its ID,
# category, description, links, parameters and encoded inputs) and of the code that evaluates it
# (the reference, the case definitions, this module and the input generator, mpmath's version and
# backend, the precision).  A record is stored under the sha256 of all of these, so a hit is the
# record the generator produces now, byte for byte; anything else in the key changing only costs
# an evaluation.  Under $PGSPEC_CACHE/golden/<version> (the folder of this code, cache.version_dir;
# default ~/.cache/pgspec); PGSPEC_CACHE=off disables it.
def _record_cache_dir():
    from ..base.cache import version_dir

    return version_dir("golden", _code_digest())


@lru_cache(maxsize=1)
def _code_digest() -> str:
    import pgspec.reference as reference_package

    h = hashlib.sha256(f"{FORMAT}|{DPS}|{DIGITS}|{SCALE_DIGITS}|{SAMPLES_PER_END}|{RANDOM_SAMPLES}|"
                       f"{mpmath.__version__}|{mpmath.libmp.BACKEND}".encode())
    here = Path(__file__).resolve().parent
    files = sorted(Path(reference_package.__file__).resolve().parent.rglob("*.py"))
    files += sorted((here / "cases").rglob("*.py")) + [here / "golden.py", here / "generator.py"]
    for path in files:
        h.update(str(path.relative_to(path.parent.parent)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _record_key(case: Case) -> str | None:
    if _record_cache_dir() is None:
        return None
    f = REGISTRY[case.formula]
    ident = {"id": case.id, "formula": case.formula, "category": case.category, "description": case.description,
             "links": list(case.links), "params": case.params,
             "inputs": case.inputs.to_json() if isinstance(case.inputs, Generated) else _encode_inputs(case, f)}
    text = json.dumps(ident, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256((_code_digest() + "\0" + text).encode()).hexdigest()


def _cache_get(key: str):
    d = _record_cache_dir()
    path = d / key[:2] / f"{key}.json" if d is not None else None
    from ..base.files import cache_entry_ok

    if path is None or not cache_entry_ok(path):    # absent, a directory, a FIFO...: a miss
        return None
    try:
        entry = json.loads(path.read_bytes())
        record = entry["record"]
        if entry["sha256"] != hashlib.sha256(json.dumps(record, ensure_ascii=True).encode()).hexdigest():
            return None     # damaged (or written by another layout): evaluated again, never used
        return record
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_put(key: str, record: dict) -> None:
    import os

    d = _record_cache_dir()
    if d is None:
        return
    path = d / key[:2] / f"{key}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        text = json.dumps(record, ensure_ascii=True)
        entry = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "record": record}   # checked by _cache_get
        tmp.write_bytes(json.dumps(entry, ensure_ascii=True).encode())
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs time


def _weight(case: Case) -> int:
    return case.inputs.B * case.inputs.T if isinstance(case.inputs, Generated) else 1


def generate_all(families=None, progress=None, cache: bool = True, reuse: bool = True) -> dict[str, bytes]:
    """Every family file's bytes, generated from the case definitions and the reference
    (``progress``, ``cache`` and ``reuse``: see ``_generate_records``)."""
    by_family: dict[str, list] = {}
    for case in all_cases():
        fam = family_of(case)
        if families is None or fam in families:
            by_family.setdefault(fam, []).append(case)
    ordered = [c for _, cases in sorted(by_family.items()) for c in cases]
    records = iter(_generate_records(ordered, progress, cache, reuse))
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


def verify(directory: Path = GOLDEN_DIR, families=None, progress=None, cache: bool = True) -> list[str]:
    """Regenerate in memory; return one message per difference (empty when byte-identical).

    ``families`` restricts the check to those family files (the MANIFEST is then not compared);
    ``progress(done, total)`` follows the cases; ``cache=False`` evaluates every case afresh."""
    files = generate_all(families, progress, cache)
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
    from ..base.files import FileProblem, read_text

    try:
        doc = json.loads(read_text(path))
    except FileProblem as e:
        raise GoldenError(f"{e}; run `pgspec golden generate`") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise GoldenError(f"{path}: not valid JSON ({e}); golden files are only written by `pgspec golden generate`") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("files"), dict):
        raise GoldenError(f"{path}: field 'files' (file name -> sha256) is missing or not an object")
    _check_format(path, doc.get("format"))
    return doc


def _check_format(path, fmt) -> None:
    """A GoldenError naming the version when a file is of a format this pgspec does not read."""
    if fmt == FORMAT:
        return
    if fmt in OLD_FORMATS:
        raise GoldenError(f"{path}: format {fmt!r} is not read by this pgspec, which reads {FORMAT!r} "
                          f"({OLD_FORMATS[fmt]}; spec/golden-format.md, 'Migrating from version 1')")
    raise GoldenError(f"{path}: field format is {fmt!r}; this pgspec reads {FORMAT!r}")


def _where(doc, path) -> str:
    """A schema error's location as ``case '<id>' field <name>[i]...`` (or the top-level field)."""
    path = list(path)
    if len(path) >= 2 and path[0] == "cases" and isinstance(path[1], int):
        cases = doc.get("cases") if isinstance(doc, dict) else None
        case = cases[path[1]] if isinstance(cases, list) and path[1] < len(cases) else None
        cid = case.get("id") if isinstance(case, dict) else None
        label = f"cases/{path[1]} (case {cid!r})" if isinstance(cid, str) else f"cases/{path[1]}"
        field = _field(path[2:])
        return f"{label} field {field}" if field else label
    return f"field {_field(path)}" if path else "the top level"


def _field(path) -> str:
    text = ""
    for p in path:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text


def _check_cases(path: Path, doc: dict, family: str) -> None:
    """What the schema cannot say: the file's family, and each case's formula, inputs and outputs
    against the registry."""
    if doc["family"] != family:
        raise GoldenError(f"{path}: field family is {doc['family']!r}, expected {family!r} (the file name)")
    for k, c in enumerate(doc["cases"]):
        label = f"{path}: cases/{k} (case {c['id']!r})"
        f = REGISTRY.get(c["formula"])
        if f is None:
            raise GoldenError(f"{label} field formula: unknown formula ID {c['formula']!r}")
        if f.family != family:
            raise GoldenError(f"{label} field formula: {c['formula']!r} belongs to family {f.family!r}, not {family!r}")
        if not c["id"].startswith(c["formula"] + "/"):
            raise GoldenError(f"{label} field id: must start with the formula ID {c['formula']!r} and '/'")
        if c.get("expect_error"):  # its inputs or parameters are wrong on purpose, and it has no outputs
            continue
        names = {i.name for i in f.inputs}
        unknown = sorted(set(c["inputs"]) - names - {"$generate"})
        if unknown:
            raise GoldenError(f"{label} field inputs: unknown input(s) {unknown}; {c['formula']} takes {sorted(names)}")
        outputs = {o.name for o in f.outputs}
        if set(c["outputs"]) != outputs:
            raise GoldenError(f"{label} field outputs: has {sorted(c['outputs'])}, {c['formula']} declares {sorted(outputs)}")
        bad_grad = sorted(set(c["grad"]) - set(f.differentiable))
        if bad_grad:
            raise GoldenError(f"{label} field grad: {bad_grad} are not differentiable inputs of {c['formula']}")
        if bool(f.differentiable) != ("cotangent" in c):
            raise GoldenError(f"{label} field cotangent: " + ("missing: every case of a differentiable formula has one"
                              if f.differentiable else f"{c['formula']} has no gradient, so its cases have none"))


def load_family(family: str, directory: Path = GOLDEN_DIR) -> dict:
    """Load one family file after checking its sha256 against the MANIFEST and its schema."""
    path = directory / f"{family}.json"
    if not path.exists():
        raise GoldenError(f"{path}: no golden file for family {family!r}")
    from ..base.files import MAX_GOLDEN_BYTES, FileProblem, read_bytes

    try:
        data = read_bytes(path, MAX_GOLDEN_BYTES)     # a regular file of bounded size (issue 39)
    except FileProblem as e:
        raise GoldenError(f"{e}; golden files are only written by `pgspec golden generate`") from None
    expected = load_manifest(directory)["files"].get(path.name)
    actual = hashlib.sha256(data).hexdigest()
    if expected != actual:
        import jsonschema       # only where a file must be validated (a second per run otherwise)

        detail = ""
        try:
            jsonschema.validate(json.loads(data), _schema())
        except (ValueError, UnicodeDecodeError) as e:
            detail = f"; it is not valid JSON ({e})"
        except jsonschema.ValidationError as e:
            detail = f"; at {_where(json.loads(data), e.absolute_path)}: {e.message}"
        else:
            detail = "; `pgspec golden verify` names the case and field that differ"
        raise GoldenError(f"{path}: sha256 {actual} does not match the MANIFEST ({expected}){detail}; "
                          "golden files are only written by `pgspec golden generate`")
    parsed = _PARSED.get(family)
    if parsed is not None and parsed[0] == actual and parsed[1] == path:
        return parsed[2]        # these very bytes were parsed and checked before in this process
    try:
        with gc_paused():       # a parsed document holds no reference cycles
            doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise GoldenError(f"{path}: not valid JSON ({e})") from None
    if isinstance(doc, dict):
        _check_format(path, doc.get("format"))
    marker = _validated_marker(actual)
    if marker is None or not marker.exists():
        import jsonschema

        try:
            jsonschema.validate(doc, _schema())
        except jsonschema.ValidationError as e:
            raise GoldenError(f"{path}: does not match schema.json at {_where(doc, e.absolute_path)}: {e.message}") from None
        if marker is not None:
            try:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
            except OSError:
                pass  # a read-only cache only costs time
    _check_cases(path, doc, family)
    LOADED[family] = (actual, {c["id"]: c for c in doc["cases"]})
    _PARSED[family] = (actual, path, doc)
    return doc


# family -> (sha256, path, parsed document) of the last file parsed: a run reads the corpus twice
# (the declarations check and the case selection), the bytes are read and hashed each time
_PARSED: dict = {}


# family -> (sha256 of its file, {case id: the case as parsed}) of every family file loaded in this
# process: lets the comparison core find the case data it prepared from those exact bytes before
# (conformance/judge/compare.py, ``prepare_output``)
LOADED: dict = {}


def _validated_marker(file_sha: str) -> Path | None:
    """A cache entry saying: bytes with this sha256 were validated against this exact schema.

    Sound because the sha256 identifies the bytes; it only saves re-validating the same file on
    every run.  Kept under $PGSPEC_CACHE (default: $XDG_CACHE_HOME/pgspec or ~/.cache/pgspec);
    PGSPEC_CACHE=off disables it.
    """
    from ..base.cache import cache_dir

    root = cache_dir("validated")
    if root is None:
        return None
    schema_sha = hashlib.sha256(SCHEMA_PATH.read_bytes()).hexdigest()[:16]
    return root / f"{file_sha}-{schema_sha}"


def load_all(directory: Path = GOLDEN_DIR, problems: list | None = None) -> list[dict]:
    """Every case of every family file, each with its family added.

    A bad family file raises GoldenError; with ``problems`` (a list) it is appended there instead
    (one message naming the file, and the case and field where they can be told) and the other
    families are still loaded.  A bad MANIFEST always raises."""
    cases = []
    for name in sorted(load_manifest(directory)["files"]):
        try:
            doc = load_family(name[:-5], directory)
        except GoldenError as e:
            if problems is None:
                raise
            problems.append(str(e))
            continue
        for c in doc["cases"]:
            cases.append({**c, "family": doc["family"]})
    return cases


def case_cotangent(case: dict):
    """The cotangent of a loaded case as Python floats (nested like its ``grad_of`` output, a float
    for a scalar one), generated from its recipe if need be; None for a case without one (a formula
    with no gradient, an expected-error case)."""
    c = case.get("cotangent")
    if c is None:
        return None
    if isinstance(c, dict):
        return cotangent_recipe(c["$generate"])
    return _map(c, float)


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
