"""The AReaL adapter over the golden corpus (runs only where AReaL 1.0.4 is installed: ci/install-areal.sh)."""

from __future__ import annotations

import pytest

pytest.importorskip("areal")

import torch  # noqa: E402

from pgspec.conformance.run.runner import (BAD_OUTCOMES, load_adapter, load_case, property_results, run_case,  # noqa: E402
                                           select_cases)


@pytest.fixture(scope="module")
def adapter():
    a = load_adapter("areal")
    ok, why = a.available()
    if not ok:
        pytest.skip(why)
    return a


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_corpus_has_no_fail_error_or_stale_deviation(adapter, dtype):
    bad = []
    for case in select_cases("*"):
        r = run_case(adapter, case, dtype, "cpu")
        if r.outcome in BAD_OUTCOMES:
            bad.append(f"{r.case_id} [{dtype}] {r.outcome}: {r.message.strip().splitlines()[-1][:200]}")
    assert not bad, "\n".join(bad)


def test_declared_overflow_bug_reproduces(adapter):
    # PPO clip, log-ratio 200 on the clipped side: exp overflows in float32, the gradient is NaN
    r = run_case(adapter, load_case("surrogate.ppo_clip/log-ratio-200-clipped-side"), "float32", "cpu")
    assert r.outcome == "bug", r.message
    assert r.declaration["kind"] == "bug"
    assert "nan" in r.first_failure["got"]
    # float64 does not overflow there: the same case passes
    assert run_case(adapter, load_case("surrogate.ppo_clip/log-ratio-200-clipped-side"), "float64", "cpu").outcome == "pass"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_properties_have_no_fail_error_or_stale_deviation(adapter, dtype):
    bad = [f"{r.case_id} [{dtype}] {r.outcome}: {r.message.strip().splitlines()[-1][:200]}"
           for r in property_results(adapter, dtype, "cpu", "*") if r.outcome in BAD_OUTCOMES]
    assert not bad, "\n".join(bad)


def test_declared_masked_nan_property_bug_reproduces(adapter):
    # prop.padding: NaN/inf at masked positions give a NaN gradient in AReaL's PPO loss
    (r,) = [r for r in property_results(adapter, "float32", "cpu", "surrogate.ppo_clip") if r.case_id == "prop.padding/surrogate.ppo_clip"]
    assert r.outcome == "bug", r.message
    assert r.declaration["kind"] == "bug"
    assert "NaN" in r.message


def test_loss_bnpo_worked_example_passes_and_prompt_mean_is_not_applicable(adapter):
    r = run_case(adapter, load_case("loss.bnpo/worked-example"), "float64", "cpu")
    assert r.outcome == "pass", r.message
    r = run_case(adapter, load_case("loss.dapo/worked-example-prompt-mean"), "float64", "cpu")
    assert r.outcome == "not-applicable", r.message
    r = run_case(adapter, load_case("loss.dapo/worked-example-token-mean"), "float64", "cpu")
    assert r.outcome == "pass", r.message


def test_unequal_groups_run_one_group_at_a_time(adapter):
    # AReaL never receives groups of different sizes: the group-level formulas normalize each group in
    # its own call (what AReaL computes for a batch of groups of that size) and pass; the batch-level one
    # (the batch std couples the groups) is not applicable, never an "incomplete trailing group"
    r = run_case(adapter, load_case("adv.group_normalized/two-groups"), "float32", "cpu")
    assert r.outcome == "pass", r.message
    r = run_case(adapter, load_case("adv.batch_normalized/worked-example"), "float32", "cpu")
    assert r.outcome == "not-applicable", r.message


def test_trailing_group_gets_reward_over_eps():
    """AReaL's Normalization leaves the rows of an incomplete trailing group at R / eps."""
    from areal.api.cli_args import NormConfig
    from areal.utils.data import Normalization

    norm = Normalization(NormConfig(mean_level="group", std_level="group", group_size=3))
    a = norm(torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.5, 1.0]))
    assert a[:6].abs().max().item() < 2
    assert a[6].item() == pytest.approx(1e5, rel=1e-6)


def test_gradient_seed_recovers_token_sum(adapter):
    """The per-token surrogate gradient is AReaL's scalar (sum / N0) seeded with N0."""
    lp = torch.tensor([[-1.0, -2.0, -2.5, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    inputs = {"logprobs": lp, "old_logprobs": torch.tensor([[-1.5, -2.0, -2.0, -1.5, 0.0]], dtype=torch.float64),
              "mask": torch.tensor([[True, True, True, True, False]]),
              "advantages": torch.tensor([[1.0, -0.5, -1.0, -1.0, 0.0]], dtype=torch.float64)}
    out = adapter.call("surrogate.ppo_clip", inputs, {})
    assert out["grad"]["logprobs"][0, :4].tolist() == pytest.approx([0.0, 0.5, 0.0, 1.6487212707001282])


def test_param_map_covers_every_capability(adapter):
    assert set(adapter.param_map) >= adapter.capabilities()
    assert adapter.version == "1.0.4"


# the AReaL functions the adapter calls (adapters/areal/__init__.py); torch.compile wraps a function
# in one that carries _torchdynamo_orig_callable
CALLED = {"areal.utils.functional": ("ppo_actor_loss_fn", "sapo_loss_fn", "apply_rejection_sampling"),
          "areal.utils.data": ("KLEstimator", "Normalization")}


def test_no_function_the_adapter_calls_is_compiled():
    """At the tested commit AReaL compiles only gather_logprobs(_entropy), which the adapter does
    not call: the compiled default path of every formula tested is AReaL's eager Python. A release
    that compiles one of these must be tested under PGSPEC_AREAL_COMPILE=default (README)."""
    import importlib

    for module, names in CALLED.items():
        mod = importlib.import_module(module)
        for name in names:
            obj = getattr(mod, name)
            members = [obj] + [v for v in vars(obj).values() if callable(v)] if isinstance(obj, type) else [obj]
            for fn in members:
                fn = getattr(fn, "__func__", fn)
                assert not hasattr(fn, "_torchdynamo_orig_callable"), f"{module}.{name} is torch.compile'd"


def test_compiled_default_path_gives_the_eager_results(monkeypatch):
    """The compiled default path (PGSPEC_AREAL_COMPILE=default) as a variant, on the cases whose
    float parameters change from call to call: every output is the eager one, bit for bit."""
    from pgspec.adapters import areal as areal_adapter

    monkeypatch.setenv("PGSPEC_AREAL_COMPILE", "default")
    compiled = areal_adapter.make_adapter()
    monkeypatch.delenv("PGSPEC_AREAL_COMPILE")
    eager = areal_adapter.make_adapter()
    assert "torch.compile mode default" in compiled.version and "torch.compile" not in eager.version
    cases = [c for pat in ("surrogate.*", "loss.bnpo/*", "loss.dapo/*", "is.*", "kl.k*") for c in select_cases(pat)]
    assert len(cases) > 50
    for dtype in ("float64", "float32"):
        for case in cases:
            a, b = run_case(eager, case, dtype, "cpu"), run_case(compiled, case, dtype, "cpu")
            assert (a.outcome, a.error, a.message) == (b.outcome, b.error, b.message), (case["id"], dtype)
