"""The skyrl adapter against the golden corpus (skipped unless skyrl-train is installed here).

Install: bash ci/install-skyrl.sh VENV, then VENV/bin/python -m pytest tests/test_adapter_skyrl.py.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("skyrl_train.utils.ppo_utils")

from pgspec.conformance.corpus import golden  # noqa: E402
from pgspec.conformance.run.runner import BAD_OUTCOMES, load_adapter, load_case, run_case  # noqa: E402


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("skyrl")
    ok, why = a.available()
    assert ok, why
    return a


def test_declares_framework(adapter):
    from importlib import metadata

    assert adapter.framework.startswith("SkyRL")
    assert adapter.version == metadata.version("skyrl-train") == "0.3.1"
    assert {"surrogate.ppo_clip", "surrogate.gspo", "surrogate.cispo", "kl.k3", "agg.sample_mean",
            "adv.group_normalized"} <= adapter.capabilities()


def test_reduce_loss_is_restored(adapter):
    from skyrl_train.utils import ppo_utils

    before = ppo_utils.reduce_loss
    run_case(adapter, load_case("surrogate.ppo_clip/four-regions"), "float32", "cpu")
    assert ppo_utils.reduce_loss is before


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus(adapter, dtype):
    cases = [c for c in golden.load_all() if c["formula"] in adapter.capabilities()]
    assert cases
    bad = [(r.case_id, r.outcome, r.message.splitlines()[-1] if r.message else "")
           for r in (run_case(adapter, c, dtype, "cpu") for c in cases) if r.outcome in BAD_OUTCOMES]
    assert not bad, bad


def test_declared_bug_reproduces(adapter):
    # SkyRL #1340: compute_approx_kl runs under torch.no_grad, so the KL loss has no gradient
    r = run_case(adapter, load_case("kl.k3/skyrl-1340-has-gradient"), "float32", "cpu")
    assert r.outcome == "bug", r.message
    assert r.declaration["kind"] == "bug"
    # reduce_loss("sequence_mean") counts empty rows: a documented batch mean (spec/verdicts.md: convention)
    r = run_case(adapter, load_case("agg.sample_mean/empty-sequence"), "float32", "cpu")
    assert r.outcome == "convention" and r.declaration["kind"] == "convention", r.message
