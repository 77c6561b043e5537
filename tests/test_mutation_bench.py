"""bench/mutation_score.py's operators: the opt-in per-token Jacobian operator keeps values and moves
gradients, and adding it left the default samples of every seed as they were."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import mutation_score as ms  # noqa: E402


def _rolled(expr: str, env: dict):
    node = ast.parse(expr, mode="eval").body
    tree = ast.Expression(ms._gradient_rolled(node))
    ast.fix_missing_locations(tree)
    return eval(compile(tree, "<mutant>", "eval"), env)


def test_the_jacobian_operator_keeps_values_and_permutes_the_gradient():
    x = torch.tensor([[0.5, -1.0, 2.0], [0.25, 3.0, -0.5]], dtype=torch.float64, requires_grad=True)
    y = _rolled("torch.exp(x)", {"torch": torch, "x": x})
    assert torch.equal(y, torch.exp(x))                              # the values, bit for bit
    (g_ones,) = torch.autograd.grad(y.sum(), x, retain_graph=True)
    assert torch.equal(g_ones, torch.exp(x).detach())                # a cotangent of ones cannot see it
    c = torch.tensor([[1.0, -1.125, 1.5], [-1.25, 1.875, -1.0]], dtype=torch.float64)
    (g_c,) = torch.autograd.grad((c * y).sum(), x)
    expected = (c.flatten().roll(-1) * torch.exp(x).detach().flatten()).reshape(x.shape)
    assert torch.equal(g_c, expected) and not torch.equal(g_c, c * torch.exp(x).detach())


def test_jacobian_sites_are_opt_in_and_come_last():
    every = ms.all_mutants(opt_in=True)
    default = ms.all_mutants()
    assert not any(m.kind in ms.OPT_IN for v in default.values() for m in v)
    for fam, mutants in every.items():
        kept = [m for m in mutants if m.kind not in ms.OPT_IN]
        assert kept == default[fam]                                       # same sites, same indices
        assert all(m.kind in ms.OPT_IN for m in mutants[len(kept):])      # the opt-in ones after them
    assert sum(m.kind == "jacobian" for v in every.values() for m in v) == \
        sum(m.kind == "detach-added" for v in every.values() for m in v)
    assert not any(m.kind in ms.OPT_IN for m in ms.sample(160, 2))
    chosen = ms.sample(5, 1, {"jacobian"})
    assert len(chosen) == 5 and all(m.kind == "jacobian" for m in chosen)


@pytest.mark.parametrize("family", ["ratio", "kl"])
def test_a_jacobian_mutant_compiles(family):
    m = next(m for m in ms.all_mutants(opt_in=True)[family] if m.kind == "jacobian")
    source, mutant = ms.mutate(family, m.index)
    compile(source, f"<{mutant.key}>", "exec")
    assert ".roll(1)" in source
