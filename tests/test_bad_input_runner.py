"""Bad adapter results and adapter loading (issue 11): every malformed output or gradient is that
case's ``error`` naming the output, the expected and the actual shape or dtype; a case that raises
or exits is one case's error; a bad adapter spec is one RunError line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pgspec.conformance.corpus import golden
from pgspec.conformance.run import runner
from pgspec.conformance.run.runner import RunError, load_adapter, run_case

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import bad_input_adapters as bad  # noqa: E402

CASES = {c["id"]: c for c in golden.load_all()}
# a kl.k1 case with B = 2 sequences of 3 tokens
K1 = next(c for c in CASES.values() if c["formula"] == "kl.k1" and "$generate" not in c["inputs"] and not c.get("expect_error")
          and len(c["inputs"]["logprobs"]) >= 2 and len(c["inputs"]["logprobs"][0]) >= 2)
B, T = len(K1["inputs"]["logprobs"]), len(K1["inputs"]["logprobs"][0])
K2 = next(c for c in CASES.values() if c["formula"] == "kl.k2" and "$generate" not in c["inputs"] and not c.get("expect_error"))


def error_of(adapter, case=K1, dtype="float64"):
    r = run_case(adapter, case, dtype, "cpu")
    assert r.outcome == "error", (r.outcome, r.message)
    return r.message


SHAPE_EXPECTED = f"must have shape [{B}, {T}]"


@pytest.mark.parametrize("kind", ["extra-column", "extra-row", "B1", "B", "1BT", "scalar", "transposed", "flat"])
def test_output_of_the_wrong_shape_is_the_case_error(kind):
    msg = error_of(bad.spoiled_output(kind))
    assert msg.startswith(f"output 'kl' {SHAPE_EXPECTED}, got shape [")
    assert msg.endswith(f"(spec shape [B,T] with B={B}, T={T})")


@pytest.mark.parametrize("kind,got", [("int64", "int64"), ("bool", "bool"), ("complex", "complex128")])
def test_output_of_the_wrong_dtype_is_the_case_error(kind, got):
    msg = error_of(bad.spoiled_output(kind))
    assert msg.startswith("output 'kl' must be a floating tensor of dtype float64 or float32 or bfloat16 or float16 "
                          f"(the run's dtype is float64), got dtype {got}")


@pytest.mark.parametrize("kind", ["float32-in-float64", "float16-in-float64"])
def test_a_lower_precision_output_is_judged_by_its_numbers(kind):
    """A framework that computes in float32 whatever its inputs: compared, not refused (and in float64 the
    float16 rounding of k1 shows as a fail, which such a framework declares)."""
    r = run_case(bad.spoiled_output(kind), K1, "float64", "cpu")
    assert r.outcome in ("pass", "fail") and r.compared > 0


@pytest.mark.parametrize("kind,got", [("python-float", "float"), ("list", "list"), ("numpy", "ndarray"), ("string", "str")])
def test_output_that_is_not_a_tensor_is_the_case_error(kind, got):
    msg = error_of(bad.spoiled_output(kind))
    assert msg.startswith(f"output 'kl' must be a torch.Tensor of shape [{B}, {T}], got {got} ")


def test_float32_output_is_accepted_in_a_bfloat16_run():
    """The spec computes 16-bit storage dtypes in float32: a float32 output there is allowed."""
    adapter = bad.spoiled_output("float32-in-float64")  # .float() of a bfloat16 result is float32
    assert run_case(adapter, K1, "bfloat16", "cpu").outcome == "pass"


def test_float64_output_is_refused_in_a_float32_run():
    adapter = bad.Adapter("f64", "test", "0", implementations={
        "kl.k1": lambda i, p: {"kl": bad._torch().implementations["kl.k1"](i, p)["kl"].double()}})
    msg = error_of(adapter, dtype="float32")
    assert msg.startswith("output 'kl' must be a floating tensor of dtype float32 or bfloat16 or float16 (the run's dtype is float32), got dtype float64")


@pytest.mark.parametrize("kind", ["extra-column", "extra-row", "B", "scalar"])
def test_gradient_of_the_wrong_shape_is_the_case_error(kind):
    msg = error_of(bad.spoiled_grad(kind))
    assert msg.startswith(f"gradient 'grad.logprobs' must have shape [{B}, {T}], got shape [")
    assert msg.endswith("(the shape of input 'logprobs')")


@pytest.mark.parametrize("kind,got", [("int64", "int64")])
def test_gradient_of_the_wrong_dtype_is_the_case_error(kind, got):
    msg = error_of(bad.spoiled_grad(kind))
    assert msg.startswith(f"gradient 'grad.logprobs' must be a floating tensor of dtype float64 or float32 or bfloat16 "
                          f"or float16 (the run's dtype is float64), got dtype {got}")


def test_gradient_that_is_not_a_tensor_is_the_case_error():
    assert error_of(bad.spoiled_grad("list")).startswith(f"gradient 'grad.logprobs' must be a torch.Tensor of shape [{B}, {T}], got list")


def test_a_correct_own_gradient_passes():
    """The control: the same adapter with an unspoiled gradient passes (the checks are not too strict)."""
    bad.GRAD_SPOILERS["identity"] = lambda g: g
    try:
        assert run_case(bad.spoiled_grad("identity"), K1, "float64", "cpu").outcome == "pass"
    finally:
        del bad.GRAD_SPOILERS["identity"]


@pytest.mark.parametrize("kind,expected", [
    ("none", "the adapter returned NoneType None; expected a dict of output name -> tensor (kl)"),
    ("list", "the adapter returned list "),
    ("tensor", "the adapter returned Tensor "),
    ("grad-not-a-dict", "the adapter's 'grad' must be a dict of input name -> tensor, got list [1.0]"),
])
def test_a_result_that_is_not_a_dict_of_tensors(kind, expected):
    assert error_of(bad.spoiled_result(kind)).startswith(expected)


@pytest.mark.parametrize("kind,last", [
    ("sys-exit-0", "SystemExit: 0"), ("sys-exit-3", "SystemExit: 3"), ("sys-exit-msg", "SystemExit: adapter gave up"),
    ("runtime-error", "RuntimeError: boom"), ("custom", "bad_input_adapters.Boom: custom boom"), ("generator-exit", "GeneratorExit"),
    ("memory-error", "MemoryError"), ("recursion", "RecursionError: maximum recursion depth exceeded"),
])
def test_a_raising_or_exiting_case_is_one_error_and_the_next_case_runs(kind, last):
    adapter = bad.raising(kind)
    results = [run_case(adapter, c, "float64", "cpu") for c in (K1, K2)]
    assert results[0].outcome == "error" and results[0].message.strip().splitlines()[-1] == last
    assert results[1].outcome == "pass"


def test_keyboard_interrupt_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        run_case(bad.interrupting(), K1, "float64", "cpu")


# float16: bfloat16-exact inputs that float16 cannot hold -----------------------------------------

@pytest.mark.parametrize("case_id,element,became", [
    ("kl.k1/tiny-log-ratio", "logprobs[0][2] = -9.313225746154785e-10", "-0.0"),
    ("agg.token_mean/tiny-and-huge", "values[0][0] = 1.2676506002282294e+30", "inf"),
    ("adv.group_normalized/large-rewards", "rewards[3] = 65536.0", "inf"),
])
def test_float16_cases_float16_cannot_hold_are_not_applicable(case_id, element, became):
    adapter = load_adapter("torch")
    r = run_case(adapter, CASES[case_id], "float16", "cpu")
    assert r.outcome == "not-applicable"
    assert r.message == (f"not applicable to float16: input {element} is exact in bfloat16 but not in float16 "
                         f"(it becomes {became}); float16's exponent range is narrower than bfloat16's")
    assert run_case(adapter, CASES[case_id], "bfloat16", "cpu").outcome != "not-applicable"


def test_float16_ignores_masked_positions_and_keeps_exact_cases():
    case = dict(K1, inputs={k: [list(row) for row in v] for k, v in K1["inputs"].items()})
    assert runner.float16_inexact(case) == ""
    b, t = next((b, t) for b, row in enumerate(case["inputs"]["mask"]) for t, m in enumerate(row) if not m)
    case["inputs"]["logprobs"][b][t] = "1.2676506002282294e+30"  # masked: never read
    assert runner.float16_inexact(case) == ""
    b, t = next((b, t) for b, row in enumerate(case["inputs"]["mask"]) for t, m in enumerate(row) if m)
    case["inputs"]["logprobs"][b][t] = "1.2676506002282294e+30"
    assert runner.float16_inexact(case).startswith(f"not applicable to float16: input logprobs[{b}][{t}] = 1.2676506002282294e+30")


# adapter loading -------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,expected", [
    (":", "adapter ':': expected module:object with both parts"),
    ("bad_input_adapters:", "adapter 'bad_input_adapters:': expected module:object with both parts"),
    (":make_adapter", "adapter ':make_adapter': expected module:object with both parts"),
    ("", "--adapter must be a built-in adapter name or module:object, got ''"),
    ("   ", "--adapter must be a built-in adapter name or module:object, got '   '"),
    ("tensorflow", "unknown adapter 'tensorflow'; built-in adapters: areal, fast_llm, liger, megatron"),
    ("no_such_module_xyz:make", "adapter 'no_such_module_xyz:make': cannot import 'no_such_module_xyz': No module named"),
    ("bad_input_adapters:nothing_here", "adapter 'bad_input_adapters:nothing_here': module 'bad_input_adapters' has no attribute 'nothing_here'"),
    ("bad_input_adapters:raising_factory", "adapter 'bad_input_adapters:raising_factory': the factory raising_factory() raised "
                                           "ValueError: the config file adapter.yaml is missing"),
    ("bad_input_adapters:exiting_factory", "adapter 'bad_input_adapters:exiting_factory': the factory exiting_factory() raised "
                                           "SystemExit (sys.exit(4))"),
    ("bad_input_adapters:none_factory", "adapter 'bad_input_adapters:none_factory': bad_input_adapters:none_factory gave NoneType, "
                                        "which is not an adapter"),
    ("bad_input_adapters:int_factory", "gave int, which is not an adapter (pgspec.adapters.base.Adapter): it lacks name"),
    ("bad_input_adapters:not_callable", "gave int, which is not an adapter"),
    ("bad_input_adapters:half_adapter", "gave Half, which is not an adapter (pgspec.adapters.base.Adapter): it lacks name, framework"),
])
def test_bad_adapter_spec_is_one_run_error(spec, expected):
    with pytest.raises(RunError) as e:
        load_adapter(spec)
    msg = str(e.value)
    assert expected in msg and "\n" not in msg


@pytest.mark.parametrize("source,expected", [
    ("def make(:\n    pass\n", "syntax error in "),
    ("raise ImportError('needs the foo package')\n", "cannot import 'badmod_{n}': needs the foo package"),
    ("raise RuntimeError('cuda init failed')\n", "importing 'badmod_{n}' raised RuntimeError: cuda init failed"),
    ("import sys\nsys.exit(3)\n", "importing 'badmod_{n}' raised SystemExit (sys.exit(3))"),
    ("1/0\n", "importing 'badmod_{n}' raised ZeroDivisionError: division by zero"),
], ids=["syntax", "import-error", "runtime-error", "sys-exit", "zero-division"])
def test_a_module_that_does_not_import_is_one_run_error(tmp_path, monkeypatch, source, expected):
    n = abs(hash(source)) % 10**8
    (tmp_path / f"badmod_{n}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RunError) as e:
        load_adapter(f"badmod_{n}:make")
    msg = str(e.value)
    assert msg.startswith(f"adapter 'badmod_{n}:make': ") and expected.format(n=n) in msg and "\n" not in msg
    if "syntax" in expected:
        assert f"badmod_{n}.py, line 1" in msg


@pytest.mark.parametrize("formulas,expected", [
    ("", "--formulas: no glob given (got ''); e.g. --formulas 'kl.*'"),
    (" , ", "--formulas: no glob given (got ' , ')"),
    ("kl.k9", "no formula or case matches 'kl.k9'; formula IDs: adv.batch_normalized"),
    ("kl.k1/no-such-case", "no formula or case matches 'kl.k1/no-such-case'"),
])
def test_bad_selection_is_one_run_error(formulas, expected):
    with pytest.raises(RunError) as e:
        runner.select_cases(formulas)
    assert str(e.value).startswith(expected)
