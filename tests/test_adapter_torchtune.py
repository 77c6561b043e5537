"""The torchtune adapter, loaded from a checkout (PGSPEC_TORCHTUNE_SOURCE); skips cleanly without one.

Recipe: adapters/torchtune/README.md (the 0.6.1 wheel has no torchtune/dev, so the GRPO losses come
from a checkout of main at 19bb8e68).  Every case runs in the adapter's own worker process (the isolated
mode), as `pgspec run --adapter torchtune --source PATH` does, so the package shells never reach this
test process."""

from __future__ import annotations

import os
import sys

import pytest

from pgspec.conformance.run import runner

SOURCE = os.environ.get("PGSPEC_TORCHTUNE_SOURCE")


def test_unavailable_without_a_checkout_names_the_clone_command(monkeypatch):
    monkeypatch.delenv("PGSPEC_TORCHTUNE_SOURCE", raising=False)
    a = runner.load_adapter("torchtune")
    ok, why = a.available()
    assert not ok
    assert "git clone https://github.com/pytorch/torchtune" in why
    assert "19bb8e680ef90dfb527bfc8c8545a6b87c9eb895" in why
    assert not any(m == "torchtune.dev" or m.startswith("torchtune.dev.") for m in sys.modules)


def test_a_directory_that_is_no_checkout_is_unavailable(monkeypatch, tmp_path):
    monkeypatch.setenv("PGSPEC_TORCHTUNE_SOURCE", str(tmp_path))
    ok, why = runner.load_adapter("torchtune").available()
    assert not ok and "not a torchtune checkout" in why


needs_source = pytest.mark.skipif(not SOURCE, reason="no torchtune checkout: set PGSPEC_TORCHTUNE_SOURCE "
                                                     "(adapters/torchtune/README.md)")


@pytest.fixture(scope="module")
def adapter():
    from pgspec.conformance.run.isolated import IsolatedAdapter

    a = IsolatedAdapter(sys.executable, "torchtune")
    ok, why = a.available()
    if not ok:
        pytest.skip(why)
    yield a
    a.close()


def _run(adapter, case_id, dtype):
    return adapter.run_case(runner.load_case(case_id), dtype, "cpu")


@needs_source
def test_version_names_the_tested_commit(adapter):
    assert adapter.version.startswith("git:19bb8e680ef9") and "blobs verified" in adapter.version


@needs_source
@pytest.mark.parametrize("case_id", ["loss.bnpo/worked-example", "loss.grpo/on-policy-pair", "agg.token_mean/empty-sequence",
                                     "loss.dapo/preset-trl-loss-type-dapo-batch"])
def test_cases_pass_in_float32(adapter, case_id):
    r = _run(adapter, case_id, "float32")
    assert r.outcome == "pass", r.message


@needs_source
def test_declared_causes(adapter):
    r = _run(adapter, "loss.bnpo/masked-nan-inf", "float32")
    assert r.outcome == "bug" and r.declaration["cause"] == "masked-nonfinite", r.message
    r = _run(adapter, "loss.bnpo/log-ratio-200", "float32")
    assert r.outcome == "bug" and r.declaration["cause"] == "exp-overflow", r.message
    # GRPOSimpleLoss ignores the old log-probs: an off-policy case is the declared formula variant
    r = _run(adapter, "loss.grpo/clipped-high", "float32")
    assert r.outcome == "convention" and r.declaration["cause"] == "formula-variant", r.message
