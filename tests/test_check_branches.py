"""What a `pgspec check` reports it judged: the count of tokens or rows on each side of each decision
(conformance/check/branches.py), tested against the decisions the torch backend's gradient shows."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pgspec.conformance import check, cli
from pgspec.conformance.check import branches as cb
from pgspec.conformance.run import runner
from pgspec.reference import REGISTRY

VERL_KL = {"kl_log_ratio_min": -20, "kl_log_ratio_max": 20, "kl_output_min": -10, "kl_output_max": 10}

CONFIGS = [
    ("loss.grpo", {"beta": 0}),
    ("loss.bnpo", {"beta": 0.1, "log_ratio_clamp": 0.3, "kl_estimator": "k1", "kl_output_max": 0.3}),
    ("loss.dapo", {"opsm_delta": 0.1, "is_level": "token", "is_mode": "mask", "is_c_min": 0.5, "is_c_max": 1.5}),
    ("loss.grpo", {"entropy_quantile": 0.2, "is_level": "geometric", "kl_log_ratio_min": -0.5, "kl_output_max": 0.1}),
    ("loss.cispo", {"aggregation": "token_mean"}), ("loss.cispo", {"cap_form": "absolute", "eps_high": 1.5}),
    ("loss.cispo", {"eps_low": 0.2, "aggregation": "token_mean"}),
    ("loss.gspo", {"eps_low": 0.2, "eps_high": 0.28, "log_ratio_max": 0.5}), ("loss.gspo", {"log_ratio_clamp": 2.0}),
    ("loss.luspo", {"ratio_level": "token", "eps_low": 0.2, "eps_high": 0.28}),
    ("loss.sapo", {"log_ratio_clamp": 1.0}), ("loss.vespo", {"max_log_weight": 0.5, "min_weight": 0.5}),
    ("loss.gmpo", {}), ("loss.minirl", {"is_cap": 1.5}),
    ("loss.grpo", {"is_level": "sequence", "is_log_ratio_clamp": 0.5, "is_c_max": None, **VERL_KL}),
]


@pytest.mark.parametrize("formula, params", CONFIGS)
def test_each_decision_partitions_its_tokens_or_rows(formula, params):
    """Each decision's sides are disjoint (but the IS weight's and the KL term's clamps and bounds, of
    which a token or row may pass two: a clamped x whose estimate is then above an output clamp) and
    lie within its units: the unmasked tokens (or those of a side of an earlier decision), or the
    non-empty rows."""
    arrays = check.check_inputs(formula, 32, 256, 3, params)
    mask = arrays["mask"]
    found = cb.branches(formula, arrays, params)
    assert found
    for b in found:
        units = int(mask.sum()) if b.unit == "tokens" else int(mask.any(-1).sum())
        several = b.name.startswith(("IS log-weight", "KL clamps"))
        free = list(b.counts)[0]          # "inside", "no clamp active"
        total = b.counts[free] + max(n for side, n in b.counts.items() if side != free) if several else \
            sum(b.counts.values())
        assert 0 < total <= units and len(b.counts) >= 2, b


def _zero_gradient_tokens(formula, arrays, params):
    """The unmasked tokens whose gradient the torch backend gives as exactly 0."""
    torch_adapter = runner.load_adapter("torch")
    t = check.to_tensors(formula, arrays, "float64", "cpu")
    out = torch_adapter.call(formula, t, runner.adapter_params(formula, params))
    (g,) = torch.autograd.grad(out["loss"], [t["logprobs"]])
    return (g == 0).numpy() & arrays["mask"]


def _on(found, constant):
    """The tokens [B, T] on any of the ``constant`` sides {decision name: (side, ...)} (a side of rows
    spread over the rows' tokens)."""
    out = None
    for b in found:
        for side in constant.get(b.name, ()):
            m = b.where[side]
            m = m if m.ndim == 2 else np.broadcast_to(m[:, None], out.shape if out is not None else (len(m), 1))
            out = m if out is None else out | m
    return out


@pytest.mark.parametrize("formula, params, constant", [
    ("loss.grpo", {"beta": 0}, {"PPO term": ("clipped constant",)}),
    ("loss.bnpo", {"beta": 0, "log_ratio_clamp": 0.3}, {"PPO term": ("clipped constant",),
                                                         "log-ratio clamp": ("clamped",)}),
    ("loss.gspo", {"beta": 0, "eps_low": 0.2, "eps_high": 0.28, "log_ratio_max": 0.5},
     {"sequence term": ("clipped constant",)}),
    ("loss.minirl", {}, {"decoupled-PPO mask": ("dropped",)}),
    ("loss.grpo", {"beta": 0, "entropy_quantile": 0.3}, {"PPO term": ("clipped constant",),
                                                          "entropy mask": ("dropped",)}),
    ("loss.grpo", {"beta": 0, "is_level": "token", "is_mode": "mask", "is_c_min": 0.5, "is_c_max": 1.5},
     {"PPO term": ("clipped constant",), "IS log-weight, token level": ("below is_c_min (masked)",
                                                                       "above is_c_max (masked)")}),
    ("loss.grpo", {"beta": 0, "opsm_delta": 0.1}, {"PPO term": ("clipped constant",),
                                                    "OPSM, rows of negative advantage": ("dropped",)}),
    ("loss.grpo", {"beta": 0, "opsm_delta": 0.1, "is_level": "geometric", "is_mode": "mask", "is_c_max": 3.0},
     {"PPO term": ("clipped constant",), "OPSM, rows of negative advantage": ("dropped",),
      "IS log-weight, geometric level": ("above is_c_max (masked)",)}),
])
def test_the_constant_sides_are_the_tokens_without_a_gradient(formula, params, constant):
    """The sides on which a token's term is a constant (the clipped PPO or sequence term, a clamped
    log-ratio, a token or row dropped or masked) are exactly the unmasked tokens, of nonzero advantage,
    whose gradient the torch backend gives as 0; and each such side is reached."""
    arrays = check.check_inputs(formula, 32, 128, 4, params)
    arrays["advantages"] = np.where(arrays["advantages"] == 0, 1.0, arrays["advantages"])
    found = cb.branches(formula, arrays, params)
    for b in found:
        for side in constant.get(b.name, ()):
            assert b.counts[side] > 0, (b.name, side)
    assert set(constant) <= {b.name for b in found}
    on = _on(found, constant) & arrays["mask"]
    assert np.array_equal(on, _zero_gradient_tokens(formula, arrays, params))


def test_sides_the_draw_cannot_reach_are_named_not_judged():
    """GSPO's clip range of 3e-4 / 4e-4 is too narrow for a row's mean log-ratio to keep off both its
    kinks: the check never puts a row inside it, and says so."""
    arrays = check.check_inputs("loss.gspo", 16, 256, 0, {})
    assert cb.unreached(cb.branches("loss.gspo", arrays, {})) == ["mean log-ratio against the clip range: inside"]
    wide = {"eps_low": 0.2, "eps_high": 0.28}
    assert cb.unreached(cb.branches("loss.gspo", check.check_inputs("loss.gspo", 16, 256, 0, wide), wide)) == []


def test_the_aggregators_make_no_decision():
    assert cb.branches("agg.token_mean", check.check_inputs("agg.token_mean", 4, 16, 0, {}), {}) == []


def test_the_cli_prints_the_branches_and_what_it_did_not_judge(capsys, tmp_path):
    """GSPO with TRL's token IS weight at its default clip range (3e-4 / 4e-4): the CLI lists each
    decision's counts and names the side the check cannot reach (a row's mean inside the range), and
    the JSON carries both."""
    params = {"beta": 0, "is_level": "token"}
    path = tmp_path / "c.json"
    args = ["check", "--formula", "loss.gspo", "--shape", "8x512", "--json", str(path)]
    assert cli.main(args + [a for k, v in params.items() for a in ("--param", f"{k}={json.dumps(v)}")]) == 0
    out = capsys.readouterr().out
    assert "branches judged, tokens or rows on each side:\n  mean log-ratio against the clip range (rows): below " in out
    assert "not judged (no token or row of the check's inputs takes it): mean log-ratio against the clip range: " \
           "inside\n" in out
    doc = json.loads(path.read_text())
    assert doc["unreached"] == ["mean log-ratio against the clip range: inside"]
    assert [b["name"] for b in doc["branches"]] == ["mean log-ratio against the clip range", "sequence term",
                                                    "IS log-weight, token level"]
    arrays = check.check_inputs("loss.gspo", 8, 512, 0, params)
    assert sum(doc["branches"][2]["counts"].values()) == int(arrays["mask"].sum())


def test_every_loss_with_an_oracle_reports_a_decision():
    losses = [f for f in check.ORACLE_FORMULAS if f.startswith("loss.")]
    for formula in losses:
        params = {} if formula != "loss.cispo" else {"aggregation": "token_mean"}
        assert cb.branches(formula, check.check_inputs(formula, 4, 64, 1, params), params), formula
    assert {f for f in REGISTRY if f.startswith("loss.")} >= set(losses)


def test_the_cli_gives_vespo_the_sampler_with_its_flag(tmp_path):
    """`pgspec check --formula loss.vespo --sampler`: VESPO gets the sampler's log-probs, and reports
    the clip of the sampler's log-ratio it folds into phi; without the flag, neither."""
    path = tmp_path / "v.json"
    assert cli.main(["check", "--formula", "loss.vespo", "--shape", "4x64", "--sampler", "--json", str(path)]) == 0
    names = [b["name"] for b in json.loads(path.read_text())["branches"]]
    assert "sampler log-ratio clip" in names
    assert cli.main(["check", "--formula", "loss.vespo", "--shape", "4x64", "--json", str(path)]) == 0
    assert "sampler log-ratio clip" not in [b["name"] for b in json.loads(path.read_text())["branches"]]
    assert cli.main(["check", "--formula", "loss.grpo", "--shape", "4x64", "--sampler"]) == 2
