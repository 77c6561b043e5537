"""``evaluate()`` shows its progress on a long evaluation (issue 39, "work proportional to the input is
bounded or shown"): its steps and the time elapsed, on stderr, only when stderr is a terminal; a
callback gets the steps anywhere; nothing otherwise, and the values never change."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys

import pytest

from pgspec.conformance.corpus import golden
from pgspec.reference import REGISTRY, SpecError, evaluate
from pgspec.reference import _progress

CASES = golden.load_all()


def first_case(fid):
    return next(c for c in CASES if c["formula"] == fid and "$generate" not in c["inputs"] and not c.get("expect_error"))


@pytest.mark.parametrize("fid, with_scale, steps", [
    ("kl.k3", False, ["the inputs", "the formula", "the gradient"]),
    ("kl.k3", True, ["the inputs", "the formula", "the gradient", "the error scales"]),
    ("mask.opsm", True, ["the inputs", "the formula", "the error scales"]),      # no gradient: not differentiable
    ("mask.opsm", False, ["the inputs", "the formula"]),
])
def test_a_callback_gets_every_step_in_order_and_the_values_do_not_change(fid, with_scale, steps):
    assert bool(REGISTRY[fid].differentiable) == ("the gradient" in steps)
    c = first_case(fid)
    seen = []
    got = evaluate(fid, golden.case_inputs(c), c["params"], with_scale=with_scale, progress=lambda *a: seen.append(a))
    n = len(steps)
    assert seen == [(s, k, n) for k, s in enumerate(steps)] + [("done", n, n)]
    assert got == evaluate(fid, golden.case_inputs(c), c["params"], with_scale=with_scale, progress=False)


def test_a_failed_evaluation_ends_without_done():
    seen = []
    with pytest.raises(SpecError, match="missing input 'ref_logprobs'"):
        evaluate("kl.k3", {"logprobs": [[-1.0]], "mask": [[True]]}, progress=lambda *a: seen.append(a))
    assert seen == [("the inputs", 0, 3)]


@pytest.mark.parametrize("value", [3, "yes", [], 1.0])
def test_a_bad_progress_is_a_spec_error_naming_it(value):
    with pytest.raises(SpecError) as e:
        evaluate("kl.k3", {"logprobs": [[-1.0]], "ref_logprobs": [[-1.0]], "mask": [[True]]}, progress=value)
    assert str(e.value) == f"{_progress.PROGRESS_HELP}, got {type(value).__name__} {value!r}"


def test_the_size_is_that_of_the_largest_input():
    f = REGISTRY["loss.grpo"]
    assert _progress.largest_input(f, {"logprobs": [[0.0] * 7] * 3, "advantages": [1.0] * 3}) == 21
    cyclic: list = []
    cyclic.append(cyclic)       # a list that contains itself: read no deeper than the rank
    assert _progress.largest_input(f, {"logprobs": cyclic}) == 1
    assert _progress.PROGRESS_ELEMENTS > max(  # the golden corpus shows nothing while it is generated
        _progress.largest_input(REGISTRY[c["formula"]], golden.case_inputs(c)) for c in CASES)


# on a terminal ------------------------------------------------------------------------------------

SCRIPT = """
import sys
from pgspec.reference import SpecError, evaluate, _progress
_progress.PROGRESS_ELEMENTS = {threshold}
B, T = 20, {T}
x = [[-1.0 - (b * T + t) % 7 / 8 for t in range(T)] for b in range(B)]
inputs = {{"logprobs": x, "ref_logprobs": [[v / 2 for v in row] for row in x], "mask": [[True] * T for _ in range(B)]}}
{bad}
try:
    out = evaluate("kl.k3", inputs, progress={progress})
    print("value", len(out["kl"]))
except SpecError as e:
    print("SpecError", e)
"""


def run(*, terminal: bool, threshold=1000, T=1000, progress="None", bad=""):
    """The script above with its stderr on a pseudo-terminal or a pipe: (stdout, stderr as received)."""
    import pty

    code = SCRIPT.format(threshold=threshold, T=T, progress=progress, bad=bad)
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    if not terminal:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        return r.stdout, r.stderr
    main, side = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=side, env=env)
    os.close(side)
    seen = b""
    while True:
        if select.select([main], [], [], 0.5)[0]:
            try:
                chunk = os.read(main, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                break
            seen += chunk
        elif p.poll() is not None:
            break
    out = p.stdout.read().decode()
    p.wait(timeout=60)
    os.close(main)
    return out, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))


def test_a_long_evaluation_shows_its_steps_on_a_terminal():
    """20,000 elements (a second or so), the threshold lowered to 1,000: the bar names the formula, the
    size and each step as it runs, counts the steps and ends at all of them done."""
    out, err = run(terminal=True, T=1000)
    assert out == "value 20\n"
    frames = re.findall(r"pgspec evaluate kl\.k3 \(20,000 elements\): (the inputs|the formula|the gradient|done)"
                        r"[^\r\n]*? (\d)/3 ", err)
    assert frames and frames[-1] == ("done", "3") and ("the formula", "1") in frames, err[-2000:]
    assert [int(k) for _, k in frames] == sorted(int(k) for _, k in frames)


@pytest.mark.parametrize("kw", [
    dict(terminal=False),                               # not a terminal: nothing, even when long
    dict(terminal=False, progress="True"),              # True: on a terminal only
    dict(terminal=True, threshold=10 ** 6),             # short (below the threshold): nothing
    dict(terminal=True, progress="False"),              # quiet
])
def test_nothing_is_shown_off_a_terminal_for_a_short_evaluation_or_when_quiet(kw):
    out, err = run(T=200, **kw)
    assert out == "value 20\n" and err == ""


def test_true_shows_a_short_evaluation_and_an_error_ends_the_bar():
    out, err = run(terminal=True, threshold=10 ** 6, T=200, progress="True")
    assert out == "value 20\n" and "pgspec evaluate kl.k3 (4,000 elements): done" in err
    out, err = run(terminal=True, T=200, progress="True", bad="inputs['mask'][0][0] = 2")
    assert out.startswith("SpecError kl.k3: input mask[0][0] must be a bool") and "done" not in err
