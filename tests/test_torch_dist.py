"""The built-in torch backend on the dist family's golden cases, and broken variants the runner must catch."""

from __future__ import annotations

import pytest
import torch

from pgspec.adapters.base import Adapter
from pgspec.adapters.torch import agg as torch_agg
from pgspec.adapters.torch import dist as torch_dist
from pgspec.conformance.corpus import golden
from pgspec.conformance.run import runner
from pgspec.conformance.corpus.cases import dist as dist_cases


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_backend_passes_every_dist_case(dtype):
    adapter = runner.load_adapter("torch")
    cases = [c for c in runner.select_cases("dist.*") if c["category"] != "error"]   # expected errors: test_verdicts.py
    results = [runner.run_case(adapter, c, dtype, "cpu") for c in cases]
    bad = [(r.case_id, r.outcome, r.message[:300]) for r in results if r.outcome != "pass"]
    assert not bad, f"{len(bad)} of {len(results)} dist cases do not pass in {dtype}: {bad[:5]}"
    assert {c["formula"] for c in cases} == set(torch_dist.IMPLEMENTATIONS)


def _case(case_id):
    """A golden record made in memory from the case definitions (independent of the shared corpus)."""
    case = next(c for c in dist_cases.cases() if c.id == case_id)
    return {**golden.generate_case(case), "family": "dist"}


def _adapter(fid, fn):
    return Adapter(name="broken", framework="test", version="0", implementations={fid: fn})


def test_rank_local_denominators_are_caught():
    """Each CP rank normalizing by its own token count: 10.5 + 6.5 = 17 instead of 7.5 (spec/dist.md)."""
    def broken(inputs, params):
        v, m = inputs["values"], inputs["mask"]
        C = params.get("cp_size", 2)
        rank, _, _ = torch_dist.owner_map(m, C, "thd", "logit")
        partials = [torch_agg.token_mean({"values": v, "mask": m & (rank == r)}, {})["value"] for r in range(C)]
        return {"partials": torch.stack(partials), "unsharded": torch_agg.token_mean(inputs, {})["value"]}

    r = runner.run_case(_adapter("dist.cp_reduce", broken), _case("dist.cp_reduce/worked"), "float64", "cpu")
    assert r.outcome == "fail" and r.first_failure["output"] == "partials"


def test_mean_of_micro_batch_means_is_caught():
    """Megatron-LM#7452: accumulating locally normalized micro-batch means (14/3) instead of the global mean (4)."""
    def broken(inputs, params):
        out = torch_dist.accumulate(inputs, params)
        return {**out, "contributions": out["naive_contributions"], "total": out["naive"]}

    r = runner.run_case(_adapter("dist.accumulate", broken), _case("dist.accumulate/megatron-7452"), "float64", "cpu")
    assert r.outcome == "fail"


def test_rank_local_segment_counts_are_caught():
    """SDP partial sums divided by each rank's own share of the segment instead of the global N_s."""
    def broken(inputs, params):
        lp, old, m, d = inputs["logprobs"], inputs["old_logprobs"], inputs["mask"], inputs["document_ids"]
        S = params.get("sdp_size", 2)
        T = m.shape[1]
        w = -(-T // S)
        ids = torch.unique(d[m], sorted=True)
        parts = []
        for r in range(S):
            sl = slice(r * w, (r + 1) * w)
            mm = m[:, sl]
            seg = torch.searchsorted(ids, d[:, sl][mm])
            num = torch.zeros(len(ids), dtype=lp.dtype).index_add(0, seg, (lp[:, sl] - old[:, sl])[mm])
            parts.append(num / torch.bincount(seg, minlength=len(ids)).clamp(min=1).to(lp.dtype))
        parts = torch.stack(parts)
        out = torch_dist.sdp_segment(inputs, params)
        return {**out, "partials": parts, "log_ratio": parts.sum(0), "ratio": torch.exp(parts.sum(0))}

    adapter = _adapter("dist.sdp_segment", broken)
    assert runner.run_case(adapter, _case("dist.sdp_segment/s1"), "float64", "cpu").outcome == "pass"
    assert runner.run_case(adapter, _case("dist.sdp_segment/worked"), "float64", "cpu").outcome == "fail"
