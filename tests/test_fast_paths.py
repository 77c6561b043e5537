"""The run loop's shortcuts give what the plain code gives: the per-case input arrays equal the
case's inputs, and the comparison core's low-level exact evaluation equals tolerance.compare."""

from __future__ import annotations

import random

import numpy as np
import pytest
from mpmath import mp, mpf

from pgspec.conformance.judge import compare, tolerance
from pgspec.conformance.judge import prepared
from pgspec.conformance.corpus import golden
from pgspec.conformance.run import runner


def test_case_arrays_hold_the_case_inputs_for_every_case():
    for case in golden.load_all():
        arrays = runner.case_arrays(case)
        inputs = runner.case_inputs(case)
        assert set(arrays) == set(inputs), case["id"]
        for name, value in inputs.items():
            try:
                want = np.array(value)
                if want.dtype == object:   # a null in an integer input (agg.prompt_mean/error-group-ids-null)
                    raise ValueError
            except ValueError:          # ragged, or holding a null: kept as given
                assert arrays[name] is value or arrays[name] == value
                continue
            got = arrays[name]
            assert got.shape == want.shape, (case["id"], name)
            assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), (case["id"], name)
            if got.dtype.kind == "f":       # bit for bit: -0.0 and NaN payloads included
                assert got.dtype == np.float64 and got.tobytes() == want.astype(np.float64).tobytes(), (case["id"], name)
        assert runner.case_arrays(case) is arrays   # built once per case


@pytest.mark.parametrize("make", ["to_tensors", "case_tensors"])
def test_tensors_never_share_memory_with_the_cached_arrays(make):
    import torch

    case = next(c for c in golden.load_all() if c["formula"] == "kl.k3" and not c.get("expect_error"))
    arrays = runner.case_arrays(case)
    before = {k: v.copy() for k, v in arrays.items()}

    def tensors():
        if make == "to_tensors":
            return runner.to_tensors(case["formula"], arrays, "float64", "cpu")
        return runner.case_tensors(case, "float64", "cpu")

    first = tensors()
    with torch.no_grad():
        for t in first.values():
            if t.dtype.is_floating_point:
                t.mul_(3)
            else:
                t.zero_()
    for k, v in arrays.items():
        assert np.array_equal(v, before[k], equal_nan=True)
    again = tensors()           # a second call: fresh copies of the case's values
    for k, t in again.items():
        assert np.array_equal(t.detach().numpy(), before[k], equal_nan=True)
        assert t.data_ptr() != first[k].data_ptr()


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_case_tensors_equal_to_tensors_of_the_case_arrays(dtype):
    import torch

    checked = 0
    for case in golden.load_all():
        try:
            want = runner.to_tensors(case["formula"], runner.case_arrays(case), dtype, "cpu")
        except Exception as e:  # noqa: BLE001 - a ragged input: case_tensors raises the same
            with pytest.raises(type(e)):
                runner.case_tensors(case, dtype, "cpu")
            continue
        for _ in range(2):      # the first call builds the case's CPU tensors, the second reuses them
            got = runner.case_tensors(case, dtype, "cpu")
            assert list(got) == list(want), case["id"]
            for name, t in got.items():
                w = want[name]
                assert (t.dtype, t.shape, t.requires_grad, t.is_leaf) == (w.dtype, w.shape, w.requires_grad, w.is_leaf), \
                    (case["id"], name)
                a, b = t.detach(), w.detach()
                if a.is_floating_point():
                    a, b = a.double().numpy(), b.double().numpy()
                    assert np.array_equal(a, b, equal_nan=True), (case["id"], name)
                else:
                    assert torch.equal(a, b), (case["id"], name)
        checked += 1
    assert checked > 1000


def _values(rng):
    mags = [0.0, 1e-300, 2.0 ** -1070, 1e-30, 1e-8, 0.5, 1.0, 3.0, 1e8, 1e30, 1e300]
    for _ in range(40):
        m = rng.choice(mags)
        ref = m * (1 + rng.uniform(-1, 1) * rng.choice([1e-3, 1e-9, 1e-16, 0])) * rng.choice([1, -1])
        with mp.workdps(60):
            exact = mpf(ref) * (1 + mpf(rng.uniform(-1, 1)) * mpf(10) ** -rng.randint(5, 45))
        yield exact


@pytest.mark.parametrize("dtype", list(tolerance.DTYPES))
def test_low_level_exact_comparison_equals_tolerance_compare(dtype):
    rng = random.Random(12)
    for family in ("kl", "loss"):
        for exact in _values(rng):
            text = mp.nstr(exact, 40, strip_zeros=False) if exact else "0.0"
            for ref in (exact, text):
                for scale in (None, mp.nstr(abs(exact) * 3, 6), exact * 0, "1e-40"):
                    u = float(tolerance.UNIT_ROUNDOFF[dtype])
                    base = float(exact)
                    for g in (base, base * (1 + 2 * u), base * (1 - 7 * u), base + 1e-300, -base,
                              np.nextafter(base, np.inf)):
                        prep = compare.prepare([ref], [scale] if scale is not None else None)
                        got = compare._exact(float(g), prep, 0, family, dtype)
                        want = tolerance.compare(float(g), ref, scale, family, dtype)
                        assert got == want, (g, ref, scale, family, dtype)


def _same_prepared(a, b):
    assert a.paths == b.paths and a.refs == b.refs and a.scales == b.scales
    for name in ("kind", "r_hi", "r_lo", "r_exact", "s", "rbool"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    assert (a.index is None) == (b.index is None)
    if a.index is not None:
        assert all(np.array_equal(x, y) for x, y in zip(a.index, b.index)) and len(a.index) == len(b.index)
    assert (a.scalar, a.shape, a.token) == (b.scalar, b.shape, b.token)


def _general(ref, scale, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(prepared, "_prepare_strings", lambda ref, scale: None)
        m.setattr(prepared, "_PREPARED", {})
        return compare.prepare(ref, scale)


def test_numpy_walk_prepares_what_the_general_path_prepares(monkeypatch):
    prepared._PREPARED.clear()
    n = 0
    for case in golden.load_all()[::7]:
        if case.get("positions") is not None:
            continue
        for key, ref in list(case["outputs"].items()) + [(f"grad.{k}", v) for k, v in case["grad"].items()]:
            scale = case["scale"].get(key)
            fast = prepared._prepare_strings(ref, scale)
            n += fast is not None
            assert fast is None or compare.prepare(ref, scale) is not _general(ref, scale, monkeypatch)
            _same_prepared(compare.prepare(ref, scale), _general(ref, scale, monkeypatch))
    assert n > 100
    rng = random.Random(3)
    with mp.workdps(60):
        for _ in range(200):
            B, T = rng.randint(1, 4), rng.randint(0, 5)
            ref = [[None if rng.random() < 0.2 else mpf(rng.uniform(-9, 9)) * mpf(10) ** rng.randint(-320, 320) / 7
                    for _ in range(T)] for _ in range(B)]
            scale = rng.choice([None, [[abs(x) * 2 if x is not None else mpf(1) for x in row] for row in ref],
                                [[mp.nstr(abs(x) if x is not None else mpf(1), 6) for x in row] for row in ref]])
            _same_prepared(compare.prepare(ref, scale), _general(ref, scale, monkeypatch))


def test_case_result_json_is_what_asdict_gives():
    import dataclasses
    import math

    r = runner.CaseResult("a", "v", "cpu", "float32", "id", "f", "fam", "cat", "fail", error=math.inf, bound=1.0,
                          error_ratio=float("nan"), compared=3, first_failure={"output": "x", "index": [1, 2]},
                          message="m", declaration={"kind": "bug", "cause": "wrong-formula", "nested": {"x": [1]}}, repro="r")
    for result in (r, runner.CaseResult("a", "v", "cpu", "float64", "id", "f", "fam", "cat", "pass")):
        want = dataclasses.asdict(result)
        for k in ("error", "bound", "error_ratio"):
            if want[k] is not None and not math.isfinite(want[k]):
                want[k] = str(want[k])
        got = result.to_json()
        assert got == want and list(got) == list(want)
        if result.first_failure is not None:     # a copy: the report never shares the result's dicts
            assert got["first_failure"] is not result.first_failure
            assert got["declaration"]["nested"] is not result.declaration["nested"]


def test_property_result_json_is_what_asdict_gives():
    import dataclasses
    import math

    from pgspec.conformance.run.properties import PropertyResult

    failing = PropertyResult("prop.clamp", "kl.k3", "float32", "cpu", "fail", message="m",
                             example={"inputs": {"x": [[1.0, "nan"]]}, "params": {"c": 2}}, repro="r",
                             error_ratio=math.inf, examples=3)
    for result in (failing, PropertyResult("prop.padding", "kl.k1", "float64", "cpu", "pass", error_ratio=0.25)):
        want = dataclasses.asdict(result)
        if want["error_ratio"] is not None and not math.isfinite(want["error_ratio"]):
            want["error_ratio"] = str(want["error_ratio"])
        got = result.to_json()
        assert got == want and list(got) == list(want)
        if result.example is not None:      # a copy: the report never shares the result's example
            assert got["example"]["inputs"]["x"] is not result.example["inputs"]["x"]
