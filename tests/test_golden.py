"""The golden corpus: byte-exact regeneration, checksums, schema, precision, bf16 inputs, coverage."""

from __future__ import annotations

import json
import shutil

import pytest
from mpmath import mp, mpf

from pgspec.conformance.corpus import golden
from pgspec.conformance.corpus.cases import all_cases
from pgspec.reference import SpecError
from pgspec.reference import REGISTRY, evaluate


def test_golden_files_are_byte_identical_to_the_generator():
    """`pgspec golden verify`: regenerate every file in memory and require byte equality."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "golden", "verify"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "byte-identical" in r.stdout


def test_every_file_loads_with_checksum_and_schema():
    cases = golden.load_all()
    assert {c["formula"] for c in cases} == {c.formula for c in all_cases()}


def test_altered_file_is_rejected_naming_it(tmp_path):
    directory = tmp_path / "golden"
    shutil.copytree(golden.GOLDEN_DIR, directory)
    path = directory / "ratio.json"
    doc = json.loads(path.read_text())
    first = next(c for c in doc["cases"] if c["outputs"].get("ratio"))
    first["outputs"]["ratio"][0][0] = "1.5"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    with pytest.raises(golden.GoldenError, match="ratio.json: sha256 .* does not match the MANIFEST"):
        golden.load_family("ratio", directory)
    with pytest.raises(golden.GoldenError, match="ratio.json"):
        golden.load_all(directory)
    assert any("ratio.json" in p and first["id"] in p for p in golden.verify(directory, {"ratio"}))


def test_file_failing_the_schema_is_rejected_naming_it(tmp_path):
    directory = tmp_path / "golden"
    shutil.copytree(golden.GOLDEN_DIR, directory)
    path = directory / "ratio.json"
    doc = json.loads(path.read_text())
    del doc["cases"][0]["scale"]
    data = (json.dumps(doc, indent=1) + "\n").encode()
    path.write_bytes(data)
    files = {p.name: p.read_bytes() for p in directory.glob("*.json") if p.name != "schema.json"}
    (directory / "MANIFEST").write_bytes(golden.manifest_bytes(files))
    with pytest.raises(golden.GoldenError, match="ratio.json: does not match schema.json at cases/0"):
        golden.load_family("ratio", directory)


def _flat(x):
    if isinstance(x, list):
        for item in x:
            yield from _flat(item)
    else:
        yield x


def test_stored_outputs_are_correct_to_35_digits_at_higher_precision():
    """Recompute every non-scale case at 100 digits: the stored 40-digit strings must agree."""
    checked = 0
    for case in golden.load_all():
        if case["category"] == "scale":
            continue
        if case["category"] == "error":   # still rejected at 100 digits, naming the argument
            with pytest.raises(SpecError) as rejected:
                evaluate(case["formula"], golden.case_inputs(case), case["params"], dps=100)
            assert case["expect_error"]["argument"] in str(rejected.value), case["id"]
            continue
        hi = evaluate(case["formula"], golden.case_inputs(case), case["params"], dps=100,
                      cotangent=golden.case_cotangent(case))
        with mp.workdps(100):
            pairs = [(case["outputs"][k], hi[k]) for k in case["outputs"]]
            pairs += [(case["grad"][k], hi["grad"][k]) for k in case["grad"]]
            for stored, exact in pairs:
                for s, e in zip(_flat(stored), _flat(exact)):
                    if s is None or isinstance(s, bool) or isinstance(s, int):
                        assert s == e, case["id"]
                        continue
                    v = mpf(s)
                    assert abs(v - e) <= abs(e) * mpf(10) ** -35, f"{case['id']}: {s} vs {mp.nstr(e, 45)}"
                    checked += 1
    assert checked > 100


def test_inputs_are_bfloat16_exact_and_shortest_decimals():
    for case in golden.load_all():
        if "$generate" in case["inputs"]:
            continue
        f = REGISTRY[case["formula"]]
        for name, value in case["inputs"].items():
            if f.input(name).kind != "real":
                continue
            for s in _flat(value):
                x = float(s)
                assert golden.bf16_exact(x), f"{case['id']}: {name} value {s} is not bfloat16-exact"
                if s not in ("nan", "inf", "-inf"):
                    assert s == repr(x), f"{case['id']}: {s} is not the shortest round-trip decimal"


def test_generated_scale_inputs_are_bfloat16_exact():
    from pgspec.conformance.corpus.generator import generate_inputs

    for case in all_cases():
        if case.category == "scale":
            inputs = generate_inputs(case.inputs.to_json())
            for name, value in inputs.items():
                if name in ("mask", "group_ids"):
                    continue
                assert all(golden.bf16_exact(x) for x in _flat(value)), f"{case.id}: {name}"


def test_coverage_per_formula():
    """Each formula: at least 3 examples, and the edge cases its family needs."""
    by_formula = {}
    for case in all_cases():
        by_formula.setdefault(case.formula, []).append(case)
    problems = []
    for fid, f in sorted(REGISTRY.items()):
        cases = by_formula.get(fid, [])
        examples = [c for c in cases if c.category == "example"]
        if len(examples) < 3:
            problems.append(f"{fid}: {len(examples)} example cases (need 3)")
        if not any(c.category == "edge" for c in cases):
            problems.append(f"{fid}: no edge cases")
        if f.family in ("ratio", "is", "agg", "loss"):
            sizes = {c.inputs.T for c in cases if c.category == "scale"}
            if not {8192, 32768} <= sizes:
                problems.append(f"{fid}: scale cases at 8192 and 32768 tokens missing (have {sorted(sizes)})")
    assert not problems, "\n".join(problems)


def test_the_documented_20_line_consumer_reads_the_files():
    """spec/golden-format.md's plain-Python consumer checks a float64 ratio.token against ratio.json."""
    import math
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "spec" / "golden-format.md").read_text()
    code = re.search(r"## A consumer in 20 lines.*?```python\n(.*?)```", text, re.S).group(1)
    assert len(code.strip().splitlines()) <= 22
    namespace = {}
    exec(code, namespace)

    def token_ratio(inputs, params):
        c = params.get("log_ratio_clamp")
        c = None if c is None else float(c)
        out = []
        for lp_row, old_row, m_row in zip(inputs["logprobs"], inputs["old_logprobs"], inputs["mask"]):
            d = [lp - old if m else 0.0 for lp, old, m in zip(lp_row, old_row, m_row)]
            out.append([math.exp(x if c is None else max(-c, min(c, x))) for x in d])
        return {"ratio": out}

    namespace["check"](str(golden.GOLDEN_DIR / "ratio.json"), "ratio.token", token_ratio)

    def wrong(inputs, params):  # the consumer must be able to fail
        good = token_ratio(inputs, params)["ratio"]
        return {"ratio": [[x * (1 + 1e-12) for x in row] for row in good]}

    with pytest.raises(AssertionError):
        namespace["check"](str(golden.GOLDEN_DIR / "ratio.json"), "ratio.token", wrong)


def test_vectorized_generator_reproduces_the_documented_procedure():
    """The numpy generator gives exactly the numbers of the draw-by-draw reference procedure, for
    every field combination the scale cases use and for one spec with every field at once."""
    from pgspec.conformance.corpus.generator import generate_inputs, generate_inputs_reference

    specs = {}
    for case in all_cases():
        if case.category == "scale":
            spec = case.inputs.to_json()
            specs.setdefault(tuple(sorted(spec["fields"])), dict(spec, T=min(spec["T"], 300)))
    specs["all"] = {"generator": "pgspec-splitmix64/1", "seed": 2**64 - 7, "B": 3, "T": 17,
                    "fields": ["logprobs", "old_logprobs", "sampler_logprobs", "ref_logprobs", "advantages",
                               "rewards", "mask", "group_ids", "document_ids"],
                    "lengths": [17, 5, 0], "groups": 2, "documents": 4}
    for key, spec in specs.items():
        assert generate_inputs(spec) == generate_inputs_reference(spec), key


def test_generation_pauses_the_garbage_collector_and_always_resumes_it(monkeypatch):
    import gc

    case = next(c for c in all_cases() if c.expect_error is None)
    seen = []

    def fake(c):
        seen.append(gc.isenabled())
        raise RuntimeError("boom")

    monkeypatch.setattr(golden, "generate_case", fake)
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="boom"):
        golden._without_gc(case)
    assert seen == [False] and gc.isenabled()
    # and the record is generate_case's own
    monkeypatch.undo()
    assert golden._without_gc(case) == golden.generate_case(case)
