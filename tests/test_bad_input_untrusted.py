"""Everything that comes from an adapter is untrusted data (issue 39, principle 3), by class:

- what its implementation returns (not a dict, a missing or None primary output, a non-tensor, a
  wrong shape, dtype, device or layout, a detached output with no gradient, a malformed ``grad``),
  in `pgspec run` and `pgspec check` alike: the case's (the check's) ``error``, naming the output
  and what is wrong, never exit 3 and never a pass;
- what it raises (also an exception whose ``str()`` or ``repr()`` raises, ``sys.exit()``, a
  ``BaseException`` of its own): the case's error;
- its worker's start-up (a checkout whose dependency is missing): one line naming the module and the
  pip command, exit 2; its worker's hang inside a case: that case's error, and the run goes on.

Each spoiled adapter wraps the torch backend's correct implementation, so a case passes exactly when
pgspec fails to notice the spoiling."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from pgspec.adapters.base import Adapter
from pgspec.conformance.corpus import golden
from pgspec.conformance.run import untrusted
from pgspec.conformance.cli import main
from pgspec.conformance.run.runner import run_case

FIXTURES = str(Path(__file__).parent / "fixtures")
sys.path.insert(0, FIXTURES)
import bad_input_check_adapters as hostile  # noqa: E402

K1 = next(c for c in golden.load_all() if c["id"] == "kl.k1/on-reference")


def _torch_k1():
    from pgspec.adapters.torch import make_adapter

    return make_adapter().implementations["kl.k1"]


class StrRaises(Exception):
    def __str__(self):
        raise ValueError("str broke")


class StrNotAString(Exception):
    def __str__(self):
        return 5


class ReprRaises:
    def __repr__(self):
        raise RuntimeError("repr broke")


class OwnBaseException(BaseException):
    pass


def _gen(out):
    yield out


# kind -> (what the implementation returns, given the correct result; the start of the case's message)
RUN_RESULTS = {
    "generator": (lambda o: _gen(o), "the adapter returned generator "),
    "none": (lambda o: None, "the adapter returned NoneType None; expected a dict"),
    "tuple": (lambda o: (o["kl"],), "the adapter returned tuple "),
    "repr-raises": (lambda o: ReprRaises(), "the adapter returned ReprRaises <ReprRaises whose repr() raised>"),
    "empty-dict": (lambda o: {}, "the adapter returned no 'kl'"),
    "primary-none": (lambda o: {"kl": None}, "the adapter returned no 'kl'"),
    "non-string-keys": (lambda o: {1: o["kl"]}, "the adapter returned no 'kl'"),
    "meta-device": (lambda o: {"kl": o["kl"].detach().to("meta")}, "output 'kl' must be on the run's device cpu, got a tensor on meta"),
    "sparse": (lambda o: {"kl": o["kl"].detach().to_sparse()}, "output 'kl' must be a dense (strided) tensor, got layout sparse_coo"),
    "detached": (lambda o: {"kl": o["kl"].detach()}, "not connected: output 'kl' does not require grad"),
    "repr-raises-output": (lambda o: {"kl": ReprRaises()}, "output 'kl' must be a torch.Tensor of shape [2, 4], got ReprRaises"),
    "grad-tuple": (lambda o: {"kl": o["kl"].detach(), "grad": (1,)}, "the adapter's 'grad' must be a dict"),
    "grad-meta": (lambda o: {"kl": o["kl"].detach(), "grad": {"logprobs": torch.zeros(2, 4, dtype=torch.float64, device="meta")}},
                  "gradient 'grad.logprobs' must be on the run's device cpu, got a tensor on meta"),
    "grad-sparse": (lambda o: {"kl": o["kl"].detach(), "grad": {"logprobs": torch.zeros(2, 4, dtype=torch.float64).to_sparse()}},
                    "gradient 'grad.logprobs' must be a dense (strided) tensor"),
    "grad-int": (lambda o: {"kl": o["kl"].detach(), "grad": {"logprobs": torch.zeros(2, 4, dtype=torch.int64)}},
                 "gradient 'grad.logprobs' must be a floating tensor"),
}


@pytest.mark.parametrize("kind", sorted(RUN_RESULTS))
def test_run_a_malformed_result_is_the_cases_error_naming_it(kind):
    spoil, expected = RUN_RESULTS[kind]
    good = _torch_k1()
    adapter = Adapter(f"spoiled-{kind}", "test", "0", implementations={"kl.k1": lambda i, p: spoil(good(i, p))})
    r = run_case(adapter, K1, "float64", "cpu")
    assert r.outcome == "error", (r.outcome, r.message)
    assert r.message.startswith(expected), r.message
    assert "Traceback" not in r.message     # a malformed result is named, not a traceback of pgspec's frames


RAISES = {
    "str-raises": (StrRaises, "StrRaises: <StrRaises whose str() raised ValueError>"),
    "str-not-a-string": (StrNotAString, "StrNotAString: <StrNotAString whose str() raised TypeError>"),
    "own-base-exception": (lambda: OwnBaseException("odd"), "OwnBaseException: odd"),
    "system-exit-object": (lambda: SystemExit(ReprRaises()), "SystemExit"),
}


@pytest.mark.parametrize("kind", sorted(RAISES))
def test_describe_exception_never_raises(kind):
    make, expected = RAISES[kind]
    assert untrusted.describe_exception(make()) == expected


@pytest.mark.parametrize("kind", sorted(RAISES))
def test_run_an_exception_that_cannot_be_printed_is_the_cases_error(kind):
    make, _ = RAISES[kind]

    def impl(inputs, params):
        raise make()

    k2 = next(c for c in golden.load_all() if c["id"] == "kl.k2/on-reference")
    from pgspec.adapters.torch import make_adapter

    adapter = Adapter(f"raising-{kind}", "test", "0",
                      implementations={"kl.k1": impl, "kl.k2": make_adapter().implementations["kl.k2"]})
    r = run_case(adapter, K1, "float64", "cpu")
    assert r.outcome == "error" and r.exception["type"] in ("StrRaises", "StrNotAString", "OwnBaseException", "SystemExit")
    assert run_case(adapter, k2, "float64", "cpu").outcome == "pass"    # the next case runs


@pytest.mark.parametrize("x", [ReprRaises(), StrRaises(), "a\nb\tc", "x" * 5000])
def test_safe_str_is_one_bounded_line(x):
    text = untrusted.safe_str(x, limit=100)
    assert "\n" not in text and len(text) <= 100


# pgspec check ------------------------------------------------------------------------------------

CHECK_EXPECTED = {
    "none": "the adapter returned NoneType None; expected a dict of output name -> tensor (loss, terms)",
    "list": "the adapter returned list [",
    "string": "the adapter returned str 'x'",
    "gen": "the adapter returned generator ",
    "missing": "the adapter returned no 'loss' (its dict holds nothing)",
    "kl-none": "the adapter returned no 'loss' (its dict holds 'loss')",
    "str-out": "output 'loss' must be a torch.Tensor of shape [], got str '0.5'",
    "float": "output 'loss' must be a torch.Tensor of shape [], got float 0.5",
    "shape": "output 'loss' must have shape [], got shape [1]",
    "int": "output 'loss' must be a floating tensor of dtype float32 or bfloat16 or float16 (the run's dtype is "
           "float32), got dtype int64",
    "f64-in-f32": "output 'loss' must be a floating tensor of dtype float32 or bfloat16 or float16 (the run's dtype "
                  "is float32), got dtype float64",
    "meta": "output 'loss' must be on the run's device cpu, got a tensor on meta",
    "detached": "not connected: output 'loss' does not require grad",
    "grad-list": "the adapter's 'grad' must be a dict of input name -> tensor, got list [1]",
    "grad-shape": "gradient 'grad.logprobs' must have shape [2, 8], got shape [1] (the shape of input 'logprobs')",
    "grad-str": "gradient 'grad.logprobs' must be a torch.Tensor of shape [2, 8], got str 'x'",
    "badstr": "hostile-badstr raised BadStr: <BadStr whose str() raised ValueError>",
    "sysexit": "hostile-sysexit raised SystemExit (sys.exit(3))",
}


@pytest.mark.parametrize("kind", sorted(CHECK_EXPECTED))
def test_check_a_malformed_result_is_the_checks_error_naming_it(kind, capsys, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(FIXTURES)
    assert set(CHECK_EXPECTED) == set(hostile.K)
    out_json = tmp_path / "r.json"
    code = main(["check", "--formula", "loss.grpo", "--shape", "2x8", "--adapter",
                 f"bad_input_check_adapters:h_{kind.replace('-', '_')}", "--json", str(out_json)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err
    assert code == 1, (out, err)
    results = json.loads(out_json.read_text())
    rows = results if isinstance(results, list) else results.get("results", [results])
    row = rows[0]
    assert row["outcome"] == "error"
    assert row["message"].startswith(CHECK_EXPECTED[kind]), row["message"]


# an isolated worker's start-up and hangs ----------------------------------------------------------

KL = ["--formulas", "kl.k1/on-reference", "--dtype", "float64", "--no-properties"]


@pytest.fixture
def worker_env(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FIXTURES, str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PGSPEC_LOG_DIR", str(tmp_path / "logs"))


@pytest.mark.parametrize("factory, expected", [
    ("missing_dependency", r"adapter 'missing-dep': cannot import module 'pgspec_no_such_dependency' \(imported at "
                           r".*bad_input_adapters\.py:\d+\): it is not installed in (?P<py>\S+); install it there with "
                           r"`(?P=py) -m pip install pgspec-no-such-dependency`"),
    ("missing_nested_dependency", r"cannot import module 'pgspec_no_such_dependency' \(imported at "
                                  r".*bad_input_checkout_module\.py:2\)"),
    ("broken_checkout", r"adapter 'missing-dep': loading the checkout raised FileNotFoundError: "
                        r"nemo_rl/algorithms/loss_functions\.py is not in the checkout /x"),
])
def test_a_checkout_that_cannot_load_is_one_start_up_line(capsys, worker_env, factory, expected):
    """Not a traceback in every case, and no expected-error row turned into a stale declaration."""
    code = main(["run", "--python", sys.executable, "--adapter", f"bad_input_adapters:{factory}", *KL])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in out + err and "pgspec conformance" not in out
    last = err.splitlines()[-1]
    assert re.search(expected, last), last
    assert "the worker's traceback is saved to " in last


def test_a_case_that_hangs_in_the_worker_is_its_error_and_the_run_goes_on(capsys, worker_env, tmp_path):
    code = main(["run", "--python", sys.executable, "--adapter", "bad_input_adapters:hangs_in_k1", "--case-timeout", "3",
                 "--formulas", "kl.k1/on-reference,kl.k2/on-reference", "--dtype", "float64", "--no-properties",
                 "--report", f"json:{tmp_path}/r.json"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    r = {x["case_id"]: x for x in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert r["kl.k1/on-reference"]["outcome"] == "error"
    assert r["kl.k1/on-reference"]["message"].startswith("no answer within 3 s: the worker was killed")
    assert r["kl.k2/on-reference"]["outcome"] == "pass"     # a fresh worker took the next case


# a time limit in this process ----------------------------------------------------------------------

@pytest.mark.parametrize("factory, name", [("hangs_in_k1", "hangs"), ("hangs_swallowing", "hangs-swallowing")])
def test_a_case_that_hangs_in_this_process_is_its_error_with_case_timeout(capsys, monkeypatch, tmp_path, factory, name):
    from pgspec.conformance.run import untrusted as u

    monkeypatch.syspath_prepend(FIXTURES)
    monkeypatch.setattr(u, "CASE_TIMEOUT", None)
    code = main(["run", "--adapter", f"bad_input_adapters:{factory}", "--case-timeout", "1",
                 "--formulas", "kl.k1/on-reference,kl.k2/on-reference", "--dtype", "float64", "--no-properties",
                 "--report", f"json:{tmp_path}/r.json"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    r = {x["case_id"]: x for x in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert r["kl.k1/on-reference"]["outcome"] == "error"
    assert r["kl.k1/on-reference"]["message"] == (f"adapter {name!r} did not return within 1 s (--case-timeout): its "
                                                  "call was interrupted")
    assert r["kl.k2/on-reference"]["outcome"] == "pass"
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)     # the timer is off after the run


class Outer(BaseException):
    """What an outer timer (pytest-timeout's signal method) raises when it fires."""


def _outer_timer(seconds):
    import signal

    def fire(signum, frame):
        raise Outer()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    return fire, previous


def test_a_case_time_limit_keeps_a_longer_outer_timer(monkeypatch):
    """pytest-timeout's signal method and a case's limit share SIGALRM: the case's limit fires first, then
    the outer timer is set again with the time it had left, and its handler is back."""
    import signal
    import time

    from pgspec.conformance.run import untrusted as u

    fire, previous = _outer_timer(30.0)
    try:
        with u.case_timeout(0.2, "--pgspec-case-timeout"):
            with pytest.raises(u.CaseTimeout, match=r"within 0.2 s \(--pgspec-case-timeout\)"):
                with u.time_limit("x"):
                    time.sleep(5)
        assert signal.getsignal(signal.SIGALRM) is fire
        assert 29 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30
        assert (u.CASE_TIMEOUT, u.CASE_TIMEOUT_OPTION) == (None, "--case-timeout")   # restored
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_an_outer_timer_due_first_decides(monkeypatch):
    import signal
    import time

    from pgspec.conformance.run import untrusted as u

    fire, previous = _outer_timer(0.2)
    try:
        with u.case_timeout(30, "--case-timeout"):
            with pytest.raises(Outer):
                with u.time_limit("x"):
                    time.sleep(5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_without_case_timeout_nothing_is_interrupted(monkeypatch):
    from pgspec.conformance.run import untrusted as u

    monkeypatch.setattr(u, "CASE_TIMEOUT", None)
    with u.time_limit("x") as t:
        assert t.previous is None


@pytest.mark.parametrize("option, value, expected", [
    ("--case-timeout", "1e308", "must be at most 604800 seconds (7 days), got '1e308'"),
    ("--case-timeout", "604801", "must be at most 604800 seconds (7 days), got '604801'"),
    ("--case-timeout", "inf", "must be a positive number of seconds, got 'inf'"),
    ("--case-timeout", "0", "must be a positive number of seconds, got '0'"),
    ("--case-timeout", "ten", "must be a number of seconds, got 'ten'"),
    ("--startup-timeout", "1e308", "must be at most 604800 seconds (7 days), got '1e308'"),
    ("--startup-timeout", "nan", "must be a positive number of seconds, got 'nan'"),
])
def test_timeouts_have_a_range(capsys, option, value, expected):
    code = main(["run", "--adapter", "torch", f"{option}={value}", *KL])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines()[-1] == f"pgspec run: error: argument {option}: {expected}"


def test_a_huge_timeout_in_the_api_is_a_run_error():
    from pgspec.conformance.run.isolated import IsolatedAdapter
    from pgspec.conformance.run.runner import RunError

    with pytest.raises(RunError, match="--case-timeout must be at most 604800 seconds"):
        IsolatedAdapter(sys.executable, "torch", timeout=1e308)


def test_a_module_missing_inside_a_case_is_named_with_its_install(monkeypatch):
    """A framework that imports a dependency lazily, inside the call: one line naming the module and
    the pip command, not a traceback."""
    def impl(inputs, params):
        import pgspec_no_such_dependency  # noqa: F401

    r = run_case(Adapter("lazy-import", "test", "0", implementations={"kl.k1": impl}), K1, "float64", "cpu")
    assert r.outcome == "error"
    assert re.fullmatch(r"cannot import module 'pgspec_no_such_dependency' \(imported at .*test_bad_input_untrusted\.py:\d+\): "
                        r"it is not installed in \S+; install it there with `\S+ -m pip install pgspec-no-such-dependency` "
                        r"\(or the checkout's requirements\)", r.message), r.message


@pytest.mark.parametrize("module, pip", [("yaml", "pyyaml"), ("PIL.Image", "pillow"), ("flash_attn", "flash-attn"),
                                         ("google.protobuf", "protobuf"), ("ray.util", "ray")])
def test_the_pip_name_of_a_module(module, pip):
    assert untrusted.pip_name(module) == pip


# the pytest plugin: the same checks, a failing test each, never INTERNALERROR ----------------------

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("factory, expected", [
    ("bad_input_adapters:spoiled_list", "output 'kl' must be a torch.Tensor of shape"),
    ("bad_input_adapters:raising_sys_exit_3", "SystemExit: 3"),
    ("bad_input_adapters:meta_output", "output 'kl' must be on the run's device cpu, got a tensor on meta"),
    ("bad_input_adapters:detached_output", "not connected: output 'kl' does not require grad"),
])
def test_the_plugin_reports_a_malformed_result_as_a_failing_test(pytester, monkeypatch, factory, expected):
    import pgspec.adapters.torch  # noqa: F401 - pytester's in-process run must not import torch again

    monkeypatch.syspath_prepend(FIXTURES)
    pytester.makepyfile(test_nothing="")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "--pgspec-adapter", factory,
                                          "--pgspec-formulas", "kl.k1/on-reference", "--pgspec-dtype", "float64")
    text = "\n".join(result.outlines + result.errlines)
    assert "INTERNALERROR" not in text
    assert result.ret == pytest.ExitCode.TESTS_FAILED, text
    assert expected in text, text
