"""Gradients are judged as VJPs with a seeded, non-uniform cotangent per case (spec/golden-format.md,
"Cotangent"; issue 36 item 2).

A Jacobian that is wrong per token but right in its column sums passes every case under a cotangent of
ones; with the case's cotangent it fails.  An adapter's own gradient of a per-token output must read the
cotangent (``current_cotangent``) or the case is an error; of a scalar output it is multiplied by c.
"""

from __future__ import annotations

import pytest
import torch

from pgspec.adapters.base import Adapter, current_cotangent
from pgspec.conformance.corpus import golden
from pgspec.conformance.judge import compare
from pgspec.conformance.run import runner

PER_TOKEN = ["ratio.token", "kl.k3", "surrogate.ppo_clip", "ratio.gspo_token"]


def _wrap(name, formulas, transform):
    """The built-in backend with ``transform(out, mask)`` applied to each formula's grad_of output."""
    t = runner.load_adapter("torch")

    def call(fid, inputs, params):
        out = dict(t.implementations[fid](inputs, params))
        key = runner.REGISTRY[fid].grad_of
        out[key] = transform(out[key], inputs["mask"])
        return out

    return Adapter(name=name, framework=name, version="0", dtypes=("float64", "float32"),
                   implementations={fid: (lambda inputs, params, fid=fid: call(fid, inputs, params))
                                    for fid in formulas})


def _permuted(y, mask):
    """The same values, each token's gradient taken from the next unmasked token of its row (cyclic):
    y'_t = sg(y_t) + (y_p(t) - sg(y_p(t))).  The Jacobian's rows are permuted, its column sums kept."""
    rows = []
    for b in range(y.shape[0]):
        keep = torch.nonzero(mask[b]).flatten().tolist()
        perm = list(range(y.shape[1]))
        for i, t in enumerate(keep):
            perm[t] = keep[(i + 1) % len(keep)]
        src = y[b, perm]
        rows.append(y[b].detach() + (src - src.detach()))
    return torch.stack(rows) if rows else y


def _spread(y, mask):
    """The same values, the row's gradient spread evenly over its unmasked tokens:
    y'_t = sg(y_t) + mean_u (y_u - sg(y_u)); column sums kept."""
    z = torch.where(mask, y, torch.zeros((), dtype=y.dtype))
    d = z - z.detach()
    n = mask.sum(dim=1, keepdim=True).clamp(min=1)
    return torch.where(mask, y.detach() + (d.sum(dim=1, keepdim=True) / n), y.detach())


def _cases(fid):
    return [c for c in runner.select_cases(fid) if not c.get("expect_error") and c.get("grad")
            and "$generate" not in c["inputs"]]


@pytest.mark.parametrize("transform", [_permuted, _spread], ids=["permuted", "spread"])
def test_a_jacobian_right_in_its_column_sums_fails_with_the_cotangent(transform):
    adapter = _wrap(transform.__name__, PER_TOKEN, transform)
    torch_adapter = runner.load_adapter("torch")
    failed, invisible_with_ones = [], 0
    for fid in PER_TOKEN:
        for case in _cases(fid):
            # under a cotangent of ones (version 1's judge) the wrong Jacobian gives the right gradient
            t_ok = runner.case_tensors(case, "float64", "cpu")
            t_bad = runner.case_tensors(case, "float64", "cpu")
            params = runner.adapter_params(fid, case["params"])
            _, g_ok = compare.call(torch_adapter, fid, t_ok, params)
            _, g_bad = compare.call(adapter, fid, t_bad, params)
            assert all(torch.allclose(g_ok[n], g_bad[n], rtol=1e-12, atol=1e-300, equal_nan=True) for n in g_ok), case["id"]
            invisible_with_ones += 1
            result = runner.run_case(adapter, case, "float64", "cpu")
            if result.outcome == "fail":
                assert any(k.startswith("grad.") for k in result.failed_outputs), (case["id"], result.message)
                failed.append(case["id"])
        assert any(c.startswith(fid + "/") for c in failed), f"{fid}: no case catches the {transform.__name__} Jacobian"
    assert invisible_with_ones > 20 and len(failed) > 10, (invisible_with_ones, failed)


def test_the_builtin_backend_passes_the_same_cases():
    adapter = runner.load_adapter("torch")
    for fid in PER_TOKEN:
        for case in _cases(fid):
            assert runner.run_case(adapter, case, "float64", "cpu").outcome == "pass", case["id"]


# ---- the adapter protocol: own gradients ------------------------------------------------------

def _own(fid, reads: bool, scale=1.0):
    """The built-in backend returning its own gradient (autograd inside the adapter), reading the
    cotangent or not."""
    t = runner.load_adapter("torch")
    f = runner.REGISTRY[fid]

    def call(inputs, params):
        out = dict(t.implementations[fid](inputs, params))
        y = out[f.grad_of]
        c = current_cotangent(like=y) if reads else torch.ones_like(y)
        names = [n for n in f.differentiable if n in inputs]
        got = torch.autograd.grad(compare.objective(y, inputs.get("mask"), c), [inputs[n] for n in names],
                                  allow_unused=True)
        out["grad"] = {n: (g if g is not None else torch.zeros_like(inputs[n])) * scale for n, g in zip(names, got)}
        out[f.grad_of] = y.detach()
        return out

    return Adapter(name="own", framework="own", version="0", dtypes=("float64",), implementations={fid: call})


def test_an_own_gradient_of_a_per_token_output_must_read_the_cotangent():
    case = _cases("ratio.token")[0]
    silent = runner.run_case(_own("ratio.token", reads=False), case, "float64", "cpu")
    assert silent.outcome == "error" and "current_cotangent" in silent.message, silent.message
    assert runner.run_case(_own("ratio.token", reads=True), case, "float64", "cpu").outcome == "pass"


def test_an_own_gradient_of_a_scalar_output_is_multiplied_by_c():
    cases = _cases("loss.grpo")
    assert any(float(c["cotangent"]) != 1 for c in cases)
    for case in cases:
        assert runner.run_case(_own("loss.grpo", reads=False), case, "float64", "cpu").outcome == "pass", case["id"]
        assert runner.run_case(_own("loss.grpo", reads=True), case, "float64", "cpu").outcome == "pass", case["id"]
    # and the multiplication is what is judged: a gradient off by a factor fails
    wrong = [runner.run_case(_own("loss.grpo", reads=False, scale=1.125), c, "float64", "cpu").outcome for c in cases]
    assert "fail" in wrong


def test_current_cotangent_outside_a_call_is_ones_like_the_output():
    y = torch.zeros(2, 3, dtype=torch.float32)
    assert torch.equal(current_cotangent(like=y), torch.ones_like(y))
    assert current_cotangent() is None
    from pgspec.conformance.judge.call import cotangent_context

    c = torch.tensor([[1.0, -1.5, 1.875], [-1.0, 1.25, 1.125]], dtype=torch.float64)
    with cotangent_context(c) as state:
        got = current_cotangent(like=y)
    assert state.read and got.dtype == torch.float32 and torch.equal(got.double(), c)
    with cotangent_context(c), pytest.raises(ValueError, match="shape"):
        current_cotangent(like=torch.zeros(3, 2))


# ---- the reference -----------------------------------------------------------------------------

def test_the_reference_vjp_is_linear_in_the_cotangent():
    """d(sum c_i y_i)/dx = sum_i c_i dy_i/dx: the VJP with c equals the c-weighted sum of the VJPs with
    each unit vector, and differs from the VJP with ones."""
    from mpmath import mp, mpf

    from pgspec.reference import evaluate

    inputs = {"logprobs": [[-1.0, -0.5, -2.0]], "old_logprobs": [[-1.25, -0.5, -1.0]], "mask": [[True, True, False]]}
    c = [[1.5, -1.125, 1.875]]
    r = evaluate("ratio.gspo_token", inputs, cotangent=c, with_scale=True)
    units = [evaluate("ratio.gspo_token", inputs, cotangent=[[1.0 if j == i else 0.0 for j in range(3)]])
             for i in range(3)]
    with mp.workdps(60):
        for t in range(3):
            want = sum(mpf(c[0][i]) * units[i]["grad"]["logprobs"][0][t] for i in range(3))
            assert abs(r["grad"]["logprobs"][0][t] - want) <= abs(want) * mpf(10) ** -50
    ones = evaluate("ratio.gspo_token", inputs)
    assert r["grad"]["logprobs"] != ones["grad"]["logprobs"]
    # the masked position's cotangent takes no part; a cotangent of the wrong shape is refused
    from pgspec.reference import SpecError

    with pytest.raises(SpecError, match="cotangent"):
        evaluate("ratio.gspo_token", inputs, cotangent=[[1.0, 1.0]])
    with pytest.raises(SpecError, match="cotangent"):
        evaluate("ratio.gspo_token", inputs, cotangent=[[1.0, float("nan"), 1.0]])


def test_every_differentiable_case_has_its_cotangent():
    cases = golden.load_all()
    for case in cases:
        f = runner.REGISTRY[case["formula"]]
        if case.get("expect_error"):
            assert "cotangent" not in case, case["id"]
            continue
        assert ("cotangent" in case) == bool(f.differentiable), case["id"]
    values = {v for c in cases if isinstance(c.get("cotangent"), list) for v in _leaves(c["cotangent"])}
    assert values == {f"{s}{1 + k / 8!r}" for s in ("", "-") for k in range(8)}


def _leaves(x):
    if isinstance(x, list):
        for v in x:
            yield from _leaves(v)
    else:
        yield x
