"""Real distributed execution: 2 and 4 CPU processes (gloo) give the single-process reference.

Every rank builds the same batch, keeps its shard (DP: rows b with b mod dp == dp_rank; CP: the
tokens slime's zig-zag split gives its CP rank, from the reference's dist.cp_split), fills every
other position with NaN, and computes its contribution with adapters/torch/distributed.py.  The
contributions summed over ranks, and the gradients each rank gets at its own tokens, must equal
the reference's value and gradient of the unsharded formula (float64).
"""

from __future__ import annotations

import math
import os
import socket
import tempfile

import pytest
import torch
import torch.multiprocessing as tmp_mp

from pgspec.reference import evaluate

B, T = 4, 11
LENGTHS = [11, 6, 3, 0]          # a sequence shorter than 2*cp and an empty one
GROUPS = [0, 0, 1, 1]


def batch():
    g = torch.Generator().manual_seed(0)
    lp = -(torch.rand(B, T, generator=g, dtype=torch.float64) * 3 + 0.01)
    old = lp + (torch.rand(B, T, generator=g, dtype=torch.float64) - 0.5) * 0.2
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = torch.tensor([[t < n for t in range(T)] for n in LENGTHS])
    adv = torch.tensor([1.0, -0.5, 0.25, 0.75], dtype=torch.float64)
    return lp, old, values, mask, adv


def cp_rank_map(mask, cp):
    if cp == 1:
        return [[0 if m else -1 for m in row] for row in mask.tolist()]
    r = evaluate("dist.cp_split", {"mask": mask.tolist()}, {"cp_size": cp, "layout": "bshd", "ownership": "position"})
    return [[-1 if x is None else int(x) for x in row] for row in r["rank"]]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, dp, cp, port, out_dir):
    import torch.distributed as dist

    from pgspec.adapters.torch import distributed as D

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dp_rank, cp_rank = rank // cp, rank % cp
    dp_groups = [dist.new_group([d * cp + c for d in range(dp)]) for c in range(cp)]
    cp_groups = [dist.new_group([d * cp + c for c in range(cp)]) for d in range(dp)]
    dp_group, cp_group = dp_groups[cp_rank], cp_groups[dp_rank]
    lp, old, values, mask, adv = batch()
    owner = torch.tensor(cp_rank_map(mask, cp))
    rows = [b for b in range(B) if b % dp == dp_rank]          # this DP replica's sequences
    mine = (mask & (owner == cp_rank))[rows]                   # and, of them, this CP rank's tokens
    nan = torch.full((len(rows), T), float("nan"), dtype=torch.float64)
    local_values = torch.where(mine, values[rows], nan).requires_grad_(True)
    local_lp = torch.where(mine, lp[rows], nan).requires_grad_(True)
    local_old = torch.where(mine, old[rows], nan)
    gids = torch.tensor(GROUPS)[rows]
    results = {}
    fns = {
        "agg.token_mean": lambda: D.token_mean(local_values, mine),
        "agg.sample_mean": lambda: D.sample_mean(local_values, mine, cp_group=cp_group, dp_group=dp_group, cp_rank=cp_rank),
        "agg.seq_mean_token_sum": lambda: D.seq_mean_token_sum(local_values, mine, cp_group=cp_group,
                                                               dp_group=dp_group, cp_rank=cp_rank),
        "agg.constant": lambda: D.constant(local_values, mine, divisor=16.0, dp_group=dp_group, cp_group=cp_group,
                                           cp_rank=cp_rank),
        "agg.prompt_mean": lambda: D.prompt_mean(local_values, mine, gids, num_groups_total=2),
    }

    def full(grad):  # this rank's gradient, placed back in the [B, T] batch
        out = torch.zeros(B, T, dtype=torch.float64)
        out[rows] = torch.where(mine, grad, torch.zeros_like(grad))
        return out

    for name, fn in fns.items():
        contribution = fn()
        (grad,) = torch.autograd.grad(contribution, local_values)
        results[name] = (contribution.detach(), full(grad))
    contribution = D.gspo_sequence_loss(local_lp, local_old, mine, adv[rows], eps_low=0.2, eps_high=0.2,
                                        cp_group=cp_group, cp_size=cp, dp_group=dp_group, cp_rank=cp_rank)
    (grad,) = torch.autograd.grad(contribution, local_lp)
    results["loss.gspo"] = (contribution.detach(), full(grad))
    mine_full = torch.zeros(B, T, dtype=torch.bool)
    mine_full[rows] = mine
    mine = mine_full
    torch.save({"mine": mine, "results": results}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def reference(name, lp, old, values, mask, adv):
    m = mask.tolist()
    if name == "loss.gspo":
        r = evaluate("loss.gspo", {"logprobs": lp.tolist(), "old_logprobs": old.tolist(), "mask": m,
                                   "advantages": adv.tolist()}, {"eps_low": 0.2, "eps_high": 0.2})
        return float(r["loss"]), torch.tensor([[float(x) for x in row] for row in r["grad"]["logprobs"]], dtype=torch.float64)
    params = {"divisor": 16} if name == "agg.constant" else {}
    inputs = {"values": values.tolist(), "mask": m}
    if name == "agg.prompt_mean":
        inputs["group_ids"] = GROUPS
    r = evaluate(name, inputs, params)
    return float(r["value"]), torch.tensor([[float(x) for x in row] for row in r["grad"]["values"]], dtype=torch.float64)


@pytest.mark.parametrize("dp,cp", [(2, 1), (1, 2), (2, 2)], ids=["dp2", "cp2-zigzag", "dp2xcp2"])
def test_sharded_equals_single_process_reference(dp, cp):
    world = dp * cp
    with tempfile.TemporaryDirectory() as out:
        tmp_mp.spawn(_worker, args=(world, dp, cp, _free_port(), out), nprocs=world, join=True)
        shards = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(world)]
    lp, old, values, mask, adv = batch()
    owned = sum(s["mine"].long() for s in shards)
    assert torch.equal(owned, mask.long()), "every unmasked token lives on exactly one rank"
    for name in shards[0]["results"]:
        value = sum(s["results"][name][0] for s in shards).item()
        grad = sum(s["results"][name][1] for s in shards)
        ref_value, ref_grad = reference(name, lp, old, values, mask, adv)
        assert math.isclose(value, ref_value, rel_tol=1e-13, abs_tol=1e-15), (name, value, ref_value)
        assert torch.allclose(grad, ref_grad, rtol=1e-13, atol=1e-15), (name, grad, ref_grad)
        assert not torch.isnan(grad).any()


def test_local_cp_denominator_is_not_invariant():
    """The bug class the global counts prevent: normalizing by the local CP chunk's token count."""
    lp, old, values, mask, adv = batch()
    owner = torch.tensor(cp_rank_map(mask, 2))
    counts = [int((mask & (owner == r)).sum()) for r in range(2)]
    assert counts[0] != counts[1], counts  # the zig-zag split leaves the ranks unequal token counts
    local = 0.0
    for r in range(2):
        mine = mask & (owner == r)
        local += (torch.where(mine, values, 0).sum() / mine.sum().clamp(min=1)).item() / 2
    ref_value, _ = reference("agg.token_mean", lp, old, values, mask, adv)
    assert not math.isclose(local, ref_value, rel_tol=1e-6)
