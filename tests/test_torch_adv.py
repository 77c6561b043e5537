"""The built-in torch backend on the adv golden cases, and broken variants the cases must catch."""

from __future__ import annotations

import fnmatch
import functools

import pytest
import torch

from pgspec.adapters.base import Adapter
from pgspec.adapters.torch import adv as torch_adv
from pgspec.conformance.run import runner

IDS = ("adv.group_normalized", "adv.group_centered", "adv.batch_normalized")


@functools.cache
def family_cases():
    """The family's cases from the shared golden corpus, loaded (and schema-checked) once."""
    return tuple(c for c in runner.select_cases("adv.*") if c["category"] != "error")   # expected errors: test_verdicts.py


def run(adapter, globs, dtype):
    """{case id: result} for the family's cases matching any of the comma-separated globs."""
    chosen = [c for c in family_cases()
              if any(fnmatch.fnmatchcase(c["id"], g) or c["formula"] == g for g in globs.split(","))]
    assert chosen, globs
    return {c["id"]: runner.run_case(adapter, c, dtype, "cpu") for c in chosen}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_backend_passes_every_adv_case(dtype):
    results = run(runner.load_adapter("torch"), "adv.*", dtype)
    assert {r.formula for r in results.values()} == set(IDS)
    bad = [(cid, r.outcome, r.message[:300]) for cid, r in results.items() if r.outcome != "pass"]
    assert not bad, bad
    # only the empty batch has nothing to compare
    assert [cid for cid, r in results.items() if r.compared == 0] == [f"{f}/empty-batch" for f in IDS]


def broken(name, impls):
    return Adapter(name=name, framework="broken variant", version="0", implementations=impls)


def textbook_group_normalized(inputs, params):
    """(R - mean) / (std + eps) per group with torch.std's default (Bessel) and no identical-rewards
    check: wrong std for the population default, and 0/0 = NaN for identical rewards with eps = 0."""
    r, g = inputs["rewards"], inputs["group_ids"]
    out = torch.empty_like(r)
    for gid in torch.unique(g):
        sel = g == gid
        x = r[sel]
        std = x.std() if x.numel() > 1 else torch.zeros((), dtype=r.dtype)
        out[sel] = (x - x.mean()) / (std + float(params.get("eps", 0)))
    return {"advantages": out}


def test_textbook_grpo_normalization_is_caught():
    results = run(broken("textbook", {"adv.group_normalized": textbook_group_normalized}),
                  "adv.group_normalized", "float64")
    # Bessel where the spec's default is the population std: the published anchors disagree
    assert results["adv.group_normalized/anchor-population"].outcome == "fail"
    assert results["adv.group_normalized/anchor-bessel"].outcome == "pass"
    # identical rewards with eps = 0: 0/0
    r = results["adv.group_normalized/identical-rewards-eps0"]
    assert r.outcome == "fail" and r.first_failure["note"] == "got NaN"


def test_wrong_singleton_convention_is_caught():
    def always_zero(inputs, params):
        return torch_adv.group_centered(inputs, {k: v for k, v in params.items() if k != "singleton"})

    results = run(broken("singleton", {"adv.group_centered": always_zero}), "adv.group_centered", "float32")
    assert results["adv.group_centered/singleton-mean0_std1"].outcome == "fail"
    assert results["adv.group_centered/singleton-zero"].outcome == "pass"


def test_rewards_std_for_centered_std_is_caught():
    def wrong_std_of(inputs, params):
        return torch_adv.batch_normalized(inputs, {**params, "std_of": "rewards"})

    results = run(broken("std_of", {"adv.batch_normalized": wrong_std_of}), "adv.batch_normalized", "float64")
    assert results["adv.batch_normalized/worked-example"].outcome == "fail"
    assert results["adv.batch_normalized/std-of-rewards-trl"].outcome == "pass"
