"""The trl adapter over the golden corpus (skipped when TRL is not installed in this interpreter)."""

import pytest

pytest.importorskip("trl")

from pgspec.conformance import golden  # noqa: E402
from pgspec.conformance.runner import BAD_OUTCOMES, load_adapter, load_case, run_case  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("trl")
    ok, why = a.available()
    assert ok, why
    return a


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus_has_no_unexplained_outcome(adapter, dtype):
    bad = []
    for case in golden.load_all():
        r = run_case(adapter, case, dtype, "cpu")
        if r.outcome in BAD_OUTCOMES:
            bad.append(f"{r.case_id} [{dtype}] {r.outcome}: {r.message.strip().splitlines()[-1] if r.message else ''}")
    assert not bad, "\n".join(bad[:20])


def test_declared_bug_reproduces(adapter):
    # use_bias_correction_kl: the product-rule gradient of exp(l - l_old) * k3 cancels at a log-ratio of 20
    r = run_case(adapter, load_case("kl.k3_unbiased/log-ratio-20"), "float32", "cpu")
    assert r.outcome == "deviation", r
    assert r.deviation["kind"] == "bug"


def test_trl_delta_runs(adapter):
    r = run_case(adapter, load_case("surrogate.trl_delta/" + next(
        c["id"].split("/", 1)[1] for c in golden.load_family("surrogate")["cases"]
        if c["formula"] == "surrogate.trl_delta")), "float64", "cpu")
    assert r.outcome in ("pass", "deviation")
