"""Fast-LLM's GSPO under sequence-data parallelism: S CPU processes in a gloo group.

Each packed row of T positions is cut into S contiguous pieces of ceil(T / S) positions; rank r
holds piece r and calls ``fused_gspo_loss_forward_backward`` with ``sdp_group`` = the gloo WORLD
group, so ``gspo_segment_seam`` all-reduces the per-segment sums of log-ratios and advantages.
The ranks' losses must add up to the single-rank loss, and their logits gradients, put side by
side, must equal the single-rank gradient.  Run under a Python >= 3.12 interpreter with the
checkout (tests/test_adapter_fast_llm.py).
"""

from __future__ import annotations

import os
import socket


def _call(src, data, rank, size, group):
    import torch

    from . import loader

    mods = loader.load(src)
    lp, old, adv, docs, mask = (torch.tensor(data[k]) for k in ("lp", "old", "adv", "docs", "mask"))
    lp, old, adv = lp.double(), old.double(), adv.double()
    T = lp.shape[-1]
    piece = -(-T // size)
    sl = slice(rank * piece, min((rank + 1) * piece, T))
    num_docs = int(docs.max()) + 1
    counts = torch.zeros(num_docs, dtype=torch.int32).index_add_(0, docs[mask], torch.ones(int(mask.sum()), dtype=torch.int32))
    n_per_tok = counts[docs].to(torch.int32)
    logits = torch.stack([lp, torch.log(-torch.expm1(lp))], dim=-1)
    target = torch.where(mask, 0, -100)
    loss, grad, _ = mods["pg"].fused_gspo_loss_forward_backward(
        logits[:, sl].contiguous(), target[:, sl].contiguous(), adv[:, sl].contiguous(), old[:, sl].contiguous(),
        docs[:, sl].contiguous(), num_docs, divisor=float(num_docs), num_labels_in_seq=n_per_tok[:, sl].contiguous(),
        grad_output=1.0, sdp_group=group, epsilon_low=data["eps"][0], epsilon_high=data["eps"][1])
    return float(loss), grad.tolist()


def _worker(rank, size, port, src, data, queue):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        queue.put((rank, _call(src, data, rank, size, dist.group.WORLD)))
    except Exception as e:  # noqa: BLE001
        queue.put((rank, f"{type(e).__name__}: {e}"))
    finally:
        dist.destroy_process_group()


def run(src, data: dict, sdp_size: int = 2, timeout: float = 300.0):
    """({rank: (loss, grad)}, (loss, grad) on one rank) for ``data`` = {lp, old, adv, docs, mask}
    (one packed row each, [1, T]) and eps = (low, high)."""
    import queue as queue_mod

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, sdp_size, port, str(src), data, q)) for r in range(sdp_size)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in procs:
            r, v = q.get(timeout=timeout)
            if isinstance(v, str):
                raise RuntimeError(f"Fast-LLM SDP rank {r}: {v}")
            out[r] = v
    except queue_mod.Empty:
        raise RuntimeError(f"Fast-LLM SDP: no answer within {timeout:g} s") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return out, _call(str(src), data, 0, 1, None)
