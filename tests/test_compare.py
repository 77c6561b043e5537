"""The vectorized comparison core (conformance/judge/compare.py) decides every element exactly as the
exact comparison (tolerance.compare, mpmath) does, and reports the same worst error ratio and
first failure: over the golden corpus for the torch backend and the deliberately wrong adapters,
and on elements built to sit at the bound (where the fast path must fall back)."""

from __future__ import annotations

import math
import random
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from mpmath import mp, mpf

from pgspec.conformance.judge import compare, tolerance
from pgspec.conformance.judge import prepared_cache
from pgspec.conformance.corpus import golden
from pgspec.conformance.run import runner
from pgspec.reference import REGISTRY

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import wrong_adapters  # noqa: E402


def _sequential(case, key, ref, got, family, dtype):
    """The runner's element loop before the comparison core: tolerance.compare on each element."""
    worst = first = None
    n = 0
    for path, value, r, s in runner._elements(case, key, ref, got):
        c = tolerance.compare(value, r, s, family, dtype)
        n += 1
        if worst is None or c.ratio > worst[0].ratio:
            worst = (c, path)
        if not c.passed and first is None:
            first = (c, path, repr(value), r)       # the runner reports repr(got) (NaN != NaN)
    return n, worst, first


def _same(res, seq):
    n, worst, first = seq
    assert res.compared == n
    assert (res.worst, res.worst_path) == (worst if worst else (None, None))
    got_first = (res.failure, res.failure_path, repr(res.failure_got), res.failure_ref) if res.failure else None
    assert got_first == first


@lru_cache(maxsize=1)
def _corpus():
    return golden.load_all()


def _check_adapter_on_corpus(adapter, dtype, formulas=None):
    checked = 0
    for case in _corpus():
        if case["formula"] not in adapter.capabilities() or (formulas and case["formula"] not in formulas):
            continue
        f = REGISTRY[case["formula"]]
        try:
            tensors = runner.to_tensors(case["formula"], runner.case_inputs(case), dtype, "cpu")
            out, grads = compare.call(adapter, case["formula"], tensors,
                                      runner.adapter_params(case["formula"], case["params"]))
        except Exception:  # noqa: BLE001 - an error outcome compares nothing
            continue
        checks = [(n, case["outputs"][n], out.get(n)) for n in case["outputs"]]
        checks += [(f"grad.{n}", case["grad"][n], grads.get(n)) for n in case["grad"]]
        for key, ref, got in checks:
            if got is None:
                continue
            res = compare.compare_output(case, key, ref, got, f.family, dtype)
            _same(res, _sequential(case, key, ref, got, f.family, dtype))
            checked += res.compared
    return checked


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_fast_and_exact_agree_on_the_corpus_for_the_torch_backend(dtype):
    compare.STATS.reset()
    n = _check_adapter_on_corpus(runner.load_adapter("torch"), dtype)
    assert n > 30000
    # the fast path decides nearly everything (the proof's slack is tiny next to the bounds); the
    # rest are non-finite elements and outputs of one or two elements, compared exactly
    s = compare.STATS
    assert s.fast + s.small >= 0.95 * s.elements and s.fast >= 0.8 * s.elements
    assert s.fast + s.small + s.fallbacks + s.special == s.elements


@pytest.mark.parametrize("wrong", wrong_adapters.WRONG_ADAPTERS, ids=[w.name for w in wrong_adapters.WRONG_ADAPTERS])
def test_fast_and_exact_agree_on_the_corpus_for_the_wrong_adapters(wrong):
    # every case of every formula the wrong adapter implements (the others it does not have)
    assert _check_adapter_on_corpus(wrong.adapter(), "float32") > 0


def test_run_case_results_are_identical_in_both_modes():
    adapter = runner.load_adapter("torch")
    wrong = wrong_adapters.BY_NAME["masked-inf-times-zero"].adapter()
    cases = [c for c in _corpus() if c["formula"] in ("agg.token_mean", "ratio.token", "logprob.token")]
    for a in (adapter, wrong):
        for case in cases:
            if case["formula"] not in a.capabilities():
                continue
            old = compare.set_mode("exact")
            try:
                exact = runner.run_case(a, case, "bfloat16", "cpu").to_json()
            finally:
                compare.set_mode(old)
            assert runner.run_case(a, case, "bfloat16", "cpu").to_json() == exact


def _decimal(x, digits=40):
    with mp.workdps(60):
        return mp.nstr(x, digits)


def _at_the_bound(dtype, family="ratio", seed=12):
    """(references, scales, results): results within a few ulps of ref +- bound, many of them
    with margins below the fast path's float64 slack."""
    rng = random.Random(seed)
    refs, scales, gots = [], [], []
    with mp.workdps(60):
        for _ in range(600):
            r = mpf(rng.uniform(-4, 4)) * mpf(10) ** rng.randint(-30, 30) * (1 + mpf(rng.random()) * mpf(10) ** -25)
            s = abs(r) * (1 + rng.randint(0, 3))
            r_s, s_s = _decimal(r), _decimal(s, 6)
            b = tolerance.bound(family, dtype, s_s)
            edge = mpf(r_s) + rng.choice((-1, 1)) * b
            g = float(edge)
            for k in range(rng.randint(0, 3)):        # walk a few ulps across the bound
                g = float(np.nextafter(g, rng.choice((-np.inf, np.inf))))
            refs.append(r_s)
            scales.append(s_s)
            gots.append(g)
        for _ in range(200):
            # exactly at the bound: binary reference and scale, error = K u S exactly, so the
            # margin is the floor (or one ulp past it): below the float64 slack of the fast path
            r = rng.randint(1, 255) * 2.0 ** rng.randint(-40, 40) * rng.choice((-1, 1))
            s = abs(r) * rng.randint(1, 4)
            g = r + rng.choice((-1, 1)) * float(tolerance.K[family] * tolerance.UNIT_ROUNDOFF[dtype]) * s
            g = float(np.nextafter(g, rng.choice((-np.inf, np.inf, g)))) if rng.random() < 0.3 else g
            refs.append(repr(r))
            scales.append(repr(s))
            gots.append(g)
    return refs, scales, gots


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
def test_elements_at_the_bound_fall_back_and_agree(dtype):
    """Results placed within a few ulps of ref +- bound: the fast path must not decide those
    whose margin it cannot resolve, and the decisions equal tolerance.compare's."""
    family = "ratio"
    refs, scales, gots = _at_the_bound(dtype, family)
    prep = compare.prepare(refs, scales)
    compare.STATS.reset()
    res = compare.compare_prepared(np.array(gots), prep, family, dtype)
    exact = [tolerance.compare(g, r, s, family, dtype) for g, r, s in zip(gots, refs, scales)]
    assert res.passed.tolist() == [c.passed for c in exact]
    assert any(c.passed for c in exact) and not all(c.passed for c in exact)
    assert compare.STATS.fallbacks > 0               # some margins are below the float64 slack
    ratios = [c.ratio for c in exact]
    assert res.worst.ratio == max(ratios) and res.worst_path == (ratios.index(max(ratios)),)
    k = [c.passed for c in exact].index(False)
    assert res.failure == exact[k] and res.failure_path == (k,)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_cases_compared_together_equal_each_case_alone_at_the_bound(dtype):
    """compare_cases (one float64 pass for many cases, then each case's first failure and worst
    ratio found for all cases at once) against compare_prepared on each case alone, on cases cut
    from results at the bound (exact fall-backs in many cases), of sizes 1 to 40, two families,
    some with a non-finite result, some passing everywhere."""
    rng = random.Random(5)
    items, alone = [], []
    for family in ("ratio", "loss"):
        refs, scales, gots = _at_the_bound(dtype, family, seed=7 if family == "ratio" else 8)
        k = 0
        while k < len(refs):
            n = rng.choice((1, 2, 3, 5, 17, 40))
            r, s, g = refs[k:k + n], scales[k:k + n], list(gots[k:k + n])
            k += n
            if rng.random() < 0.15:
                g[rng.randrange(len(g))] = rng.choice((math.inf, -math.inf, math.nan))
            if rng.random() < 0.15:
                g = [float(mpf(x)) for x in r]                     # within float64 rounding: passes
            prep = compare.prepare(r, s)
            g = np.array(g)
            checks = [("out", r, None)]
            items.append(((compare._Joined([prep]), g), checks, family))
            alone.append((g, compare.prepare(r, s), family))
    compare.STATS.reset()
    together = compare.compare_cases(items, dtype)
    assert compare.STATS.fallbacks > 0
    assert any(o.failure is None for o in together) and any(o.failure is not None for o in together)
    for out, (g, prep, family) in zip(together, alone):
        one = compare.compare_prepared(g, prep, family, dtype)
        assert out.compared == one.compared
        assert (out.worst, out.worst_path[1]) == (one.worst, one.worst_path)
        if one.failure is None:
            assert out.failure is None
        else:
            assert (out.failure, out.failure_path[1], repr(out.failure_got)) == (one.failure, one.failure_path,
                                                                        repr(one.failure_got))
        assert out.passed.tolist() == one.passed.tolist()


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_the_list_float64_pass_is_the_vectorized_one_bit_for_bit(dtype):
    """compare._float64_pass_list (outputs of a few elements, in Python floats) gives the same
    (passed, decided, lb, ub) as the numpy pass, element by element, at the bound and away from it."""
    refs, scales, gots = _at_the_bound(dtype, "loss", seed=3)
    rng = random.Random(4)
    refs += [repr(rng.uniform(-1, 1) * 10.0 ** rng.randint(-300, 300)) for _ in range(200)] + ["0.0", "1e-320"]
    scales += [None] * 202
    gots += [float(r) * (1 + rng.choice((0, 1e-3, -2e-7, 1e-16))) for r in refs[len(gots):]]
    prep = compare.prepare(refs, scales)
    ku = tolerance.K["loss"] * float(tolerance.UNIT_ROUNDOFF[dtype])
    floor = float(tolerance.FLOOR[dtype])
    vec = compare._float64_pass(np.array(gots), prep.r_hi, prep.r_lo, prep.s, prep.r_exact, ku, floor)
    one = compare._float64_pass_list(gots, *prep.lists(), ku, floor)
    for col, (a, b) in enumerate(zip(vec, one)):
        assert np.array_equal(a, np.array(b)), col
    assert not vec[1].all() and vec[1].any() and not vec[0].all()     # undecided and failing elements too


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("n", [1, 3, 8, 40])
def test_the_largest_ratio_deferred_is_the_largest_worst_ratio(dtype, n):
    """compare_deferred and largest_ratio (the property checks: one largest ratio over many
    outputs, evaluated exactly at the end) against compare_prepared on each output: the same first
    failure, and, over outputs that pass, the largest of their worst ratios, exactly."""
    refs, scales, gots = _at_the_bound(dtype, "ratio", seed=9)
    rng = random.Random(n)
    outputs = []
    for k in range(0, len(refs), n):
        r, sc, g = refs[k:k + n], scales[k:k + n], gots[k:k + n]
        if rng.random() < 0.7:
            g = [float(mpf(x)) * (1 + rng.choice((0.0, 2.0 ** -56, 2.0 ** -53))) for x in r]    # well inside
        outputs.append((compare.prepare(r, sc), np.array(g)))
    compare.STATS.reset()
    deferred, exact_worst, failures = [], [], 0
    for prep, g in outputs:
        res, d = compare.compare_deferred(g, prep, "ratio", dtype)
        one = compare.compare_prepared(g, prep, "ratio", dtype, stop_at_failure=True)
        assert (res.failure, res.failure_path) == (one.failure, one.failure_path)
        if one.failure is None:
            assert d is not None
            deferred.append(d)
            exact_worst.append(one.worst.ratio)
        else:
            failures += 1
            assert d is None
    assert failures and deferred
    assert compare.largest_ratio(deferred) == max(exact_worst)
    # with a ratio already known: the larger of the two
    assert compare.largest_ratio(deferred, 1e6) == 1e6
    for part in (deferred[:1], deferred[-3:]):
        assert compare.largest_ratio(part) == max(exact_worst[deferred.index(d)] for d in part)


def test_property_results_are_identical_in_both_modes():
    """The property checks (their outcomes, messages and largest error ratios) in fast mode, where
    each check's largest ratio is evaluated once at the end, equal those in exact mode."""
    from pgspec.conformance.run import properties

    adapters = [runner.load_adapter("torch")] + [w.adapter() for w in wrong_adapters.WRONG_ADAPTERS]
    for a in adapters:
        for dtype in ("float64", "bfloat16"):
            fast = [r.to_json() for r in properties.run_properties(a, dtype, "cpu", "*")]
            old = compare.set_mode("exact")
            try:
                exact = [r.to_json() for r in properties.run_properties(a, dtype, "cpu", "*")]
            finally:
                compare.set_mode(old)
            assert fast == exact, (a.name, dtype)
            if a.name == "torch":
                assert any(r["error_ratio"] for r in fast if r["outcome"] == "pass")


def test_special_values_and_mpf_references():
    """NaN/inf results and references, booleans, ints, mpf references (properties) and a
    reference beyond float64's exponent range: all as tolerance.compare decides."""
    with mp.workdps(60):
        big = mpf(10) ** 400
        refs = ["nan", "inf", "-inf", "1.5", "1.5", "2.0", True, False, 3, mpf(1) / 3, big, -big, "0.0", "1e-400"]
        gots = [np.nan, np.inf, np.inf, np.nan, np.inf, 2.0, 1.0, 1.0, 3.0, 1 / 3, np.inf, -np.inf, 0.0, 0.0]
    scales = [None] * len(refs)
    for dtype in ("float64", "float32"):
        prep = compare.prepare(refs, scales)
        res = compare.compare_prepared(np.array(gots, dtype=np.float64), prep, "kl", dtype)
        exact = [tolerance.compare(g, r, s, "kl", dtype) for g, r, s in zip(gots, refs, scales)]
        assert res.passed.tolist() == [c.passed for c in exact]
        k = [c.passed for c in exact].index(False)
        assert (res.failure, res.failure_path) == (exact[k], (k,))
        assert res.worst == max(exact, key=lambda c: c.ratio)


# ------------------------------------------------------------------------------------------------
# A whole case in one pass, and the preparation kept on disk
# ------------------------------------------------------------------------------------------------
def _run_all(adapter, dtype, mode, together=False):
    """Every case of the corpus the adapter implements, case by case (run_case) or, with
    ``together``, the way `pgspec run` does (run_cases: the comparisons of all cases at once)."""
    old = compare.set_mode(mode)
    cases = [case for case in _corpus() if case["formula"] in adapter.capabilities()]
    try:
        if together:
            def crash(case, e):
                raise e
            return [r.to_json() for r in runner.run_cases(adapter, cases, dtype, "cpu", on_error=crash)]
        return [runner.run_case(adapter, case, dtype, "cpu").to_json() for case in cases]
    finally:
        compare.set_mode(old)


def _all_equal(*runs):
    first = runs[0]
    for other in runs[1:]:
        assert len(other) == len(first)
        for a, b in zip(first, other):
            assert a == b, a["case_id"]


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_whole_case_comparison_equals_the_exact_loop_over_the_corpus(dtype):
    # the runner compares a case's outputs in one pass, and `pgspec run` the outputs of all cases
    # of a dtype in one pass (run_cases); in exact mode it runs tolerance.compare on every element,
    # output by output: every field of every result agrees
    adapter = runner.load_adapter("torch")
    together = _run_all(adapter, dtype, "fast", together=True)
    assert len(together) > 1500
    _all_equal(_run_all(adapter, dtype, "exact"), _run_all(adapter, dtype, "fast"), together)


@pytest.mark.parametrize("wrong", wrong_adapters.WRONG_ADAPTERS, ids=[w.name for w in wrong_adapters.WRONG_ADAPTERS])
def test_whole_case_comparison_equals_the_exact_loop_for_the_wrong_adapters(wrong):
    adapter = wrong.adapter()
    together = _run_all(adapter, "float32", "fast", together=True)
    assert any(r["outcome"] == "fail" for r in together)      # the comparison has failures to find
    _all_equal(_run_all(adapter, "float32", "exact"), _run_all(adapter, "float32", "fast"), together)


def _same_arrays(a, b):
    for name in ("kind", "r_hi", "r_lo", "r_exact", "s", "rbool"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    assert (a.index is None) == (b.index is None)
    if a.index is not None:
        assert len(a.index) == len(b.index) and all(np.array_equal(x, y) for x, y in zip(a.index, b.index))
    assert (a.scalar, a.shape, a.token, a.plain) == (b.scalar, b.shape, b.token, b.plain)
    assert a.paths == b.paths and a.refs == b.refs and a.scales == b.scales
    for k in range(len(a)):
        assert (a.path_at(k), a.ref_at(k), a.scale_at(k)) == (b.path_at(k), b.ref_at(k), b.scale_at(k))


def test_prepared_read_back_from_disk_equals_a_fresh_preparation(tmp_path, monkeypatch):
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(prepared_cache, "_FAMILIES", {})
    cases = golden.load_all()
    n = 0
    for written in (True, False):       # the first pass writes the files, the second reads them back
        prepared_cache._FAMILIES.clear()
        for case in cases[::3]:
            if case.get("expect_error"):
                continue
            for key, ref in list(case["outputs"].items()) + [(f"grad.{k}", v) for k, v in case["grad"].items()]:
                token = prepared_cache._stored_at_positions(case, key, ref)
                got = prepared_cache._loaded_entry(case, key, token)
                if got is None:          # a ragged reference is not kept
                    continue
                if not written:
                    assert got._refs is None        # read back from the file (its values found in the case)
                want = compare.prepare(ref, case["scale"].get(key), case["positions"] if token else None)
                _same_arrays(got, want)
                n += 1
        assert sorted(p.name for p in prepared_cache._prepared_dir().glob("*.npz"))   # one file per family
    assert n > 2000      # both passes, every third case


def test_a_case_not_read_from_its_file_is_prepared_afresh(tmp_path, monkeypatch):
    # a copy of a case whose reference differs from the file's must never be judged with the
    # file's prepared arrays
    monkeypatch.setenv("PGSPEC_CACHE", str(tmp_path))
    case = next(c for c in golden.load_all() if c["formula"] == "kl.k3" and not c.get("expect_error"))
    key = next(iter(case["outputs"]))
    assert prepared_cache._loaded_entry(case, key, False) is not None
    changed = dict(case, outputs={key: [["0.5" if x is not None else None for x in row]
                                        for row in case["outputs"][key]]})
    assert prepared_cache._loaded_entry(changed, key, False) is None
    prep = compare.prepare_output(changed, key, changed["outputs"][key], None)
    assert all(r == "0.5" for r in prep.refs)
