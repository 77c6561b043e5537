"""The AReaL adapter runs every implementation with TorchDynamo disabled unless
PGSPEC_AREAL_COMPILE=default (adapters/areal/README.md, "torch.compile"); runs without AReaL."""

from __future__ import annotations

import pytest
import torch

import pgspec.adapters.areal as areal


def _probe(seen):
    def kl_k1(inputs, params):
        """probe"""
        seen.append(torch._dynamo.config.disable)
        return {"kl": inputs}

    return kl_k1


@pytest.mark.parametrize("mode, disabled", [(None, True), ("eager", True), ("default", False)])
def test_dynamo_is_disabled_around_each_call_unless_default(monkeypatch, mode, disabled):
    seen: list = []
    monkeypatch.setattr(areal, "IMPLEMENTATIONS", {"kl.k1": _probe(seen)})
    if mode is None:
        monkeypatch.delenv("PGSPEC_AREAL_COMPILE", raising=False)
    else:
        monkeypatch.setenv("PGSPEC_AREAL_COMPILE", mode)
    a = areal.make_adapter()
    before = torch._dynamo.config.disable
    assert a.implementations["kl.k1"]("x", {}) == {"kl": "x"}
    assert seen == [disabled]
    assert torch._dynamo.config.disable == before          # scoped: nothing leaks to other code
    assert a.implementations["kl.k1"].__name__ == "kl_k1"
    assert ("torch.compile mode default" in a.version) == (mode == "default")


def test_a_compiled_function_reached_from_an_implementation_runs_its_python_body(monkeypatch):
    calls: list = []

    @torch.compile(dynamic=True)
    def scaled(x, eps):
        calls.append(eps)               # a Python side effect: runs on every call only when eager
        return x * eps

    def kl_k1(inputs, params):
        return {"kl": scaled(inputs, params["eps"])}

    monkeypatch.setattr(areal, "IMPLEMENTATIONS", {"kl.k1": kl_k1})
    monkeypatch.delenv("PGSPEC_AREAL_COMPILE", raising=False)
    run = areal.make_adapter().implementations["kl.k1"]
    x = torch.ones(3, dtype=torch.float64, requires_grad=True)
    outs = [run(x, {"eps": e})["kl"] for e in (0.2, 0.28, 0.5)]
    assert calls == [0.2, 0.28, 0.5]
    assert [float(o[0]) for o in outs] == [0.2, 0.28, 0.5]


def test_an_unknown_mode_is_an_error(monkeypatch):
    monkeypatch.setenv("PGSPEC_AREAL_COMPILE", "fast")
    with pytest.raises(ValueError, match="PGSPEC_AREAL_COMPILE must be one of"):
        areal.make_adapter()
