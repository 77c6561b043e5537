"""Bad input to `pgspec check` (issue 39, principle 5): a shape that does not fit in the memory
available is refused before anything is allocated (one line with the estimate, the limit and how to
override, exit 2); --max-memory is checked against its range; a long check says what it is doing;
every argument out of range is one line, exit 2, before any work."""

from __future__ import annotations

import pytest

from pgspec.conformance import check
from pgspec.conformance.check import memory as check_memory
from pgspec.conformance.cli import main


@pytest.fixture
def no_work(monkeypatch):
    """Any allocation of the check's inputs fails the test: the refusal must come first."""
    real = check.check_inputs

    def inputs(formula, B, T, *a, **k):
        if B * T > 16:      # the argument check's own tiny batch (a recipe's rules) is allowed
            pytest.fail("the check started allocating")
        return real(formula, B, T, *a, **k)

    monkeypatch.setattr(check, "check_inputs", inputs)
    monkeypatch.setattr(check, "oracle", lambda *a, **k: pytest.fail("the check started allocating"))


def one_line(capsys, *argv) -> str:
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in out + err and "internal error" not in err
    lines = err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("argv, estimate", [
    (["--formula", "loss.grpo", "--shape", "100000x100000"], "4768.37 GiB"),
    (["--formula", "agg.token_mean", "--shape", "1x99999999999999"], "GiB"),
    (["--formula", "logprob.token", "--shape", "64x32768", "--vocab", "150000"], "28126.29 GiB"),
    (["--formula", "logprob.token", "--shape", "1x1", "--vocab", "2", "--hidden", "99999999999"], "GiB"),
])
def test_a_shape_that_does_not_fit_is_refused_before_any_allocation(capsys, no_work, argv, estimate):
    line = one_line(capsys, *argv)
    assert line.startswith("pgspec check: --shape ") and f"needs an estimated " in line and estimate in line
    assert "GiB available (MemAvailable in /proc/meminfo)" in line
    assert line.endswith("use a smaller --shape, or pass --max-memory GIB to allow more (the estimate is an upper bound)")


def test_the_limit_is_the_memory_available(capsys, no_work, monkeypatch):
    monkeypatch.setattr(check_memory, "available_bytes", lambda device: (100 << 20, "a test's figure"))
    line = one_line(capsys, "--formula", "loss.grpo", "--shape", "512x512")
    assert line == ("pgspec check: --shape 512x512: loss.grpo needs an estimated 0.12 GiB, more than the 0.10 GiB "
                    "available (a test's figure); use a smaller --shape, or pass --max-memory GIB to allow more (the "
                    "estimate is an upper bound)")


def test_max_memory_overrides_the_limit(capsys, monkeypatch):
    monkeypatch.setattr(check_memory, "available_bytes", lambda device: (1 << 20, "a test's figure"))
    assert main(["check", "--formula", "agg.token_mean", "--shape", "2x8", "--max-memory", "1"]) == 0
    capsys.readouterr()
    line = one_line(capsys, "--formula", "agg.token_mean", "--shape", "2048x1024", "--max-memory", "0.5")
    assert line.endswith("more than the 0.50 GiB allowed (--max-memory); use a smaller --shape, raise --max-memory "
                         "(the estimate is an upper bound)")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "abc", "", "1e9", "0.0001"])
def test_max_memory_out_of_range(capsys, no_work, value):
    line = one_line(capsys, "--formula", "loss.grpo", "--shape", "2x8", "--max-memory", value)
    assert line == f"pgspec check: --max-memory must be a number of GiB from 0.001 to 1048576, got {value!r}"


def test_the_estimate_grows_with_every_dimension():
    base = check_memory.estimate_bytes(8, 1024)
    assert check_memory.estimate_bytes(16, 1024) == 2 * base
    assert check_memory.estimate_bytes(8, 2048) == 2 * base
    assert check_memory.estimate_bytes(8, 1024, vocab=100) > base
    assert check_memory.estimate_bytes(8, 1024, vocab=100, hidden=10 ** 6) > check_memory.estimate_bytes(8, 1024, vocab=100)


def test_a_long_check_says_what_it_is_doing(capsys, monkeypatch):
    monkeypatch.setattr(check_memory, "PROGRESS_TOKENS", 16)
    assert main(["check", "--formula", "agg.token_mean", "--shape", "2x8"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["pgspec check: agg.token_mean 2x8: seeded inputs, then the float64 oracle on cpu, then torch in float32",
                   err[1]] and err[1].startswith("pgspec check: oracle done (") and err[1].endswith("s); torch in float32")


def test_a_short_check_is_quiet(capsys):
    assert main(["check", "--formula", "agg.token_mean", "--shape", "2x8"]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("argv, expected", [
    (["--shape", "2x8x3"], "--shape must be BxT (e.g. 64x32768), got '2x8x3'"),
    (["--shape", "0x8"], "--shape must be positive, got '0x8'"),
    (["--shape", "-2x8"], "--shape must be positive, got '-2x8'"),
    (["--shape", "2.5x8"], "--shape must be BxT"),
    (["--shape", ""], "--shape must be BxT"),
    (["--chunk", "0"], "--chunk must be an integer >= 1, got 0"),
    (["--param", "eps_low"], "--param must be NAME=VALUE, got 'eps_low'"),
    (["--param", "eps_low=-1"], "--param: "),
    (["--param", "no_such=1"], "--param: "),
    (["--dtype", "float8"], "unknown dtype"),
    (["--formula", "agg.token_mean", "--vocab", "100"], "--vocab applies to"),
    (["--hidden", "8"], "--hidden is the width of the linear head"),
])
def test_an_argument_out_of_range_is_one_line(capsys, no_work, argv, expected):
    args = {"--formula": "loss.grpo", "--shape": "2x8"}
    rest = []
    for k, v in zip(argv[::2], argv[1::2]):
        if k in args:
            args[k] = v
        else:
            rest += [k, v]
    line = one_line(capsys, *[f"{k}={v}" for k, v in args.items()], *rest)
    assert line.startswith("pgspec check: ") and expected in line, line


@pytest.mark.parametrize("kind, expected", [
    ("list", "the adapter's result must be a dict of logprobs, got list [1]"),
    ("str", "output 'logprobs' must be a torch.Tensor of shape [2, 8], got str 'x'"),
    ("shape", "output 'logprobs' must have shape [2, 8], got shape [1, 8]"),
    ("detached", "not connected: output 'logprobs' does not require grad"),
    ("f64", "output 'logprobs' must be a floating tensor of dtype float32 or bfloat16 or float16 (the run's dtype is "
            "float32), got dtype float64"),
    ("missing", "the adapter returned no 'logprobs'"),
])
def test_a_malformed_logprob_result_is_the_checks_error(capsys, monkeypatch, kind, expected):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fixtures"))
    code = main(["check", "--formula", "logprob.token", "--shape", "2x8", "--vocab", "16",
                 "--adapter", f"bad_input_check_adapters:lp_{kind}"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err and "internal error" not in err
    line = next(x for x in out.splitlines() if x.startswith(f"pgspec check lp-{kind} "))
    assert line.split(": error (")[1].split("): ", 1)[1].startswith(expected), line
