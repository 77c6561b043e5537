"""The built-in torch backend on the agg family's golden cases, and a broken variant the runner must catch."""

from __future__ import annotations

import pytest
import torch

from pgspec.adapters.base import Adapter
from pgspec.adapters.torch import agg as torch_agg
from pgspec.conformance.corpus import golden
from pgspec.conformance.run import runner
from pgspec.conformance.corpus.cases import agg as agg_cases


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_backend_passes_every_agg_case(dtype):
    adapter = runner.load_adapter("torch")
    cases = [c for c in runner.select_cases("agg.*") if c["category"] != "error"]   # expected errors: test_verdicts.py
    results = [runner.run_case(adapter, c, dtype, "cpu") for c in cases]
    bad = [(r.case_id, r.outcome, r.message[:300]) for r in results if r.outcome != "pass"]
    assert not bad, f"{len(bad)} of {len(results)} agg cases do not pass in {dtype}: {bad[:5]}"
    assert {c["formula"] for c in cases} == set(torch_agg.IMPLEMENTATIONS)


def _case(case_id):
    """A golden record made in memory from the case definitions (independent of the shared corpus)."""
    case = next(c for c in agg_cases.cases() if c.id == case_id)
    return {**golden.generate_case(case), "family": "agg"}


def _adapter(fid, fn):
    return Adapter(name="broken", framework="test", version="0", implementations={fid: fn})


def test_multiplying_by_the_mask_is_caught():
    """sum(q * m) / sum(m): an inf at a padded position becomes NaN (OpenRLHF #1240 style)."""
    def broken(inputs, params):
        v, m = inputs["values"], inputs["mask"]
        return {"value": (v * m).sum() / m.sum()}

    adapter = _adapter("agg.token_mean", broken)
    assert runner.run_case(adapter, _case("agg.token_mean/worked"), "float64", "cpu").outcome == "pass"
    r = runner.run_case(adapter, _case("agg.token_mean/masked-nan-inf"), "float64", "cpu")
    assert r.outcome == "fail" and "NaN" in r.message + str(r.first_failure)


def test_ignoring_the_global_count_is_caught():
    """A token mean over the local count when a global num_tokens is given (a scope bug)."""
    def broken(inputs, params):
        v, m = inputs["values"], inputs["mask"]
        return {"value": torch.where(m, v, torch.zeros_like(v)).sum() / m.sum()}

    adapter = _adapter("agg.token_mean", broken)
    assert runner.run_case(adapter, _case("agg.token_mean/worked"), "float32", "cpu").outcome == "pass"
    for cid in ("agg.token_mean/global-count", "agg.token_mean/megatron-7452-rank0"):
        assert runner.run_case(adapter, _case(cid), "float32", "cpu").outcome == "fail", cid


def test_counting_empty_sequences_is_caught():
    """SkyRL-style sample mean over all B rows where the spec's default counts the non-empty ones."""
    def broken(inputs, params):
        v, m = inputs["values"], inputs["mask"]
        L = m.sum(-1)
        per = torch.where(m, v, torch.zeros_like(v)).sum(-1) / L.clamp(min=1)
        return {"value": per.sum() / v.shape[0]}

    adapter = _adapter("agg.sample_mean", broken)
    assert runner.run_case(adapter, _case("agg.sample_mean/worked"), "float64", "cpu").outcome == "pass"
    assert runner.run_case(adapter, _case("agg.sample_mean/empty-sequence"), "float64", "cpu").outcome == "fail"
