"""reference._ad's shared fast passes give the plain definition's numbers bit for bit.

``error_scales_of`` (one graph walk and one forward error pass for all the outputs of a formula,
floats converted once per node and edge) and ``backward`` over a shared ``graph_order`` are
optimisations of ``_error_scales_generic`` / the per-output walk: the golden scales are stored with
six digits, so a different float operation order could flip a stored digit.  These tests compare
the two paths exactly (floats, mpfs) on corpus cases of every formula and on graphs that leave the
float range (where the plain definition falls back to mpf)."""

from __future__ import annotations

import pytest
from mpmath import mp, mpf

from pgspec.conformance.corpus.cases.case import Generated
from pgspec.conformance.corpus.cases import all_cases
from pgspec.reference import REGISTRY, _ad, _evaluate


def _same(a, b):
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _graph(case):
    f = REGISTRY[case.formula]
    params = _evaluate.check_params(f, case.params)
    converted, leaves = _evaluate.convert_inputs(f, case.inputs, track_all=True)
    raw = f.func(**converted, **params)
    all_leaves = [leaf for nested in leaves.values() for leaf in _ad._flatten(nested) if leaf is not None]
    return f, raw, all_leaves


def _small_cases():
    seen = {}
    for c in all_cases():
        if c.expect_error is None and not isinstance(c.inputs, Generated):
            seen.setdefault(c.formula, []).append(c)
    return [c for cases in seen.values() for c in cases[:4]]


@pytest.mark.parametrize("case", _small_cases(), ids=lambda c: c.id)
def test_shared_scales_and_gradient_equal_the_plain_passes(case):
    with mp.workdps(60):
        f, raw, leaves = _graph(case)
        requests = [(raw[o.name], leaves if o.name == f.grad_of else []) for o in f.outputs]
        order = _ad.graph_order([raw[o.name] for o in f.outputs])
        fast = _ad.error_scales_of(requests, order)
        plain = [_ad._error_scales_generic(out, lv) for out, lv in requests]
        for (fo, fg), (po, pg) in zip(fast, plain):
            assert _same(fo, po)
            assert fg.keys() == pg.keys() and all(_same(fg[k], pg[k]) for k in fg)
        if f.differentiable:
            shared = _ad.backward(raw[f.grad_of], order=order)
            alone = _ad.backward(raw[f.grad_of])
            assert shared.keys() == alone.keys() and all(_same(shared[k], alone[k]) for k in shared)


def test_outside_the_float_range_each_output_falls_back_as_before():
    with mp.workdps(60):
        x, y = _ad.Var(mpf("1e300")), _ad.Var(mpf(2))
        big = _ad.exp(x * 3)          # e^(3e300): E overflows floats, the plain pass redoes it in mpf
        small = x * y + y             # finite on its own: floats, as error_scales always gave it
        fast = _ad.error_scales_of([(big, [x]), (small, [x, y])])
        plain = [_ad._error_scales_generic(big, [x]), _ad._error_scales_generic(small, [x, y])]
        assert type(fast[1][0]) is mpf and fast[0][0] > mpf(10) ** 400
        for (fo, fg), (po, pg) in zip(fast, plain):
            assert _same(fo, po) and fg.keys() == pg.keys() and all(_same(fg[k], pg[k]) for k in fg)


def test_a_leaf_outside_the_graph_has_scale_zero_even_with_another_graphs_index():
    with mp.workdps(60):
        a, b = _ad.Var(mpf(3)), _ad.Var(mpf(5))
        _ad.error_scales(a * a, [a])      # gives a an index in that graph
        out, grads = _ad.error_scales(b * b + 1, [a, b])
        assert grads[id(a)] == 0.0 and grads[id(b)] == _ad._error_scales_generic(b * b + 1, [b])[1][id(b)]


def test_a_stopped_output_carries_its_sources_error_not_its_magnitude():
    """An output that is sg[x] (no operands, a source) is not an exact input: its scale is x's
    error, as it is inside a graph.  The fuzzer found kl.k3_unbiased's clamped value judged at
    |value| (1.2e-4) instead of the error of the k3 it stops (1.016) with sg_ratio_where_clamped."""
    with mp.workdps(60):
        x = _ad.Var(mpf("0.015625"))
        k3 = _ad.expm1(x) - x                    # cancels: E is that of e^x - 1, far above |k3|
        out_plain = _ad.error_scales_of([(k3, [])])[0][0]
        out_stopped = _ad.error_scales_of([(_ad.sg(k3), [])])[0][0]
        assert out_stopped == out_plain > 100 * abs(float(k3.value))
        assert _ad._error_scales_generic(_ad.sg(k3), [])[0] == out_plain
        assert _ad.error_scales_of([(x, [])])[0][0] == abs(x.value)   # an input is still |value|


def test_k3_unbiased_clamped_value_scale_does_not_depend_on_the_stop_gradient():
    inputs = {"logprobs": [[-1 / 32]], "old_logprobs": [[-1 / 64]], "ref_logprobs": [[0.0]], "mask": [[True]]}
    scales = [_evaluate.evaluate("kl.k3_unbiased", inputs, {"log_ratio_max": 1 / 64, "sg_ratio_where_clamped": sg},
                                 with_scale=True)["scale"]["kl"][0][0] for sg in (True, False)]
    assert scales[0] == scales[1] > 1


@pytest.mark.parametrize("prec", [64, 203, 260])
def test_expm1_equals_mpmaths_bit_for_bit(prec):
    import random

    rng = random.Random(prec)
    with mp.workprec(prec):
        xs = [mpf(0), mpf(1), mpf(-1), mpf("1e-70"), mpf(700), mpf(-700), mpf("inf"), mpf("-inf"), mpf("nan"),
              mpf(2) ** -(prec + 9), mpf(2) ** -(prec + 11), -mpf(2) ** -(prec + 10)]
        for _ in range(3000):
            bits = rng.choice([8, 53, prec])
            scale = mpf(2) ** rng.choice([rng.randint(-80, 8), rng.randint(-300, -190)])
            xs.append(rng.choice([1, -1]) * mpf(rng.getrandbits(bits) + 1) / mpf(2) ** bits * scale)
        for x in xs:
            ours, theirs = _ad._mp_expm1(x), mp.expm1(x)
            assert ours._mpf_ == theirs._mpf_ or (ours != ours and theirs != theirs), x
