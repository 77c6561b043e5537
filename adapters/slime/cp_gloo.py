"""slime's policy loss under real context parallelism: C CPU processes joined in a gloo group.

GSPO and OPSM need whole sequences: slime all-gathers each sample's CP-local log-probs with
``all_gather_with_cp`` (``dist.nn.all_reduce`` over the CP group) before the sequence statistics,
so these two paths cannot be emulated by setting a rank on the ``megatron.core.mpu`` stand-in as
``dist.cp_reduce`` does: they run here over a real process group.  Each process loads the
checkout, reports (cp_size = C, cp_rank = r, cp_group = WORLD) through the stand-in, feeds its
zig-zag chunk of every sample (slime's own ``slice_log_prob_with_cp``) to ``loss_function``, and
returns its loss; the ranks' losses must add up to the CP = 1 loss (``loss_function``'s × cp_size
cancels Megatron's average over the dp × cp group, so the per-rank values are divided by C here).

Layout: row i of the canonical [B, T] inputs is sample i's response (T tokens, loss mask = the
row's mask) after a one-token prompt.  Used by tests/test_adapter_slime.py and recorded in
docs/findings.md.
"""

from __future__ import annotations

import os
import socket


def _args(estimator, eps_low, eps_high, opsm_delta):
    from . import _args as make

    kw = dict(advantage_estimator=estimator, eps_clip=eps_low, eps_clip_high=eps_high)
    if opsm_delta is not None:
        kw.update(use_opsm=True, opsm_delta=opsm_delta)
    return make(**kw)


def _loss(src, cp_size, rank, data, cfg):
    import torch

    from . import loader

    _, cp, lossmod = loader.load(src)
    loader.CP.update(size=cp_size, rank=rank)
    if cp_size > 1:
        import torch.distributed as dist

        loader.CP["group"] = dist.group.WORLD
    lp, old, adv, mask = (torch.tensor(data[k], dtype=torch.float64) for k in ("lp", "old", "adv", "mask"))
    B, T = lp.shape
    tot, resp = [T + 1] * B, [T] * B

    def local(x, i):
        return cp.slice_log_prob_with_cp(x, tot[i], resp[i]) if cp_size > 1 else x

    lp_rows = [local(lp[i], i).clone().requires_grad_() for i in range(B)]
    batch = {"advantages": [local(adv[i].expand(T).contiguous(), i) for i in range(B)],
             "log_probs": [local(old[i], i) for i in range(B)], "unconcat_tokens": [None] * B,
             "response_lengths": resp, "total_lengths": tot, "loss_masks": [mask[i] for i in range(B)],
             "rollout_mask_sums": None}
    lossmod.get_log_probs_and_entropy = lambda logits, **k: (None, {
        "log_probs": lp_rows, "entropy": [torch.zeros_like(t) for t in lp_rows]})
    args = _args(**cfg)
    loss, _, _ = lossmod.loss_function(args, batch, 1, B, torch.zeros(1, B * T, 1, dtype=torch.float64))
    return loss.item() / cp_size


def _worker(rank, world, port, src, data, cfg, queue):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        queue.put((rank, _loss(src, world, rank, data, cfg)))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        queue.put((rank, f"{type(e).__name__}: {e}"))
    finally:
        dist.destroy_process_group()


def run(src, data: dict, cfg: dict, cp_size: int = 2, timeout: float = 600.0):
    """({rank: loss}, CP = 1 loss) for lists ``data`` = {lp, old, adv, mask} and ``cfg`` =
    {estimator: "gspo" | "grpo", eps_low, eps_high, opsm_delta}.  The CP = 1 loss is computed in a
    process of its own as well, so the caller's interpreter never loads the checkout."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, cp_size, port, str(src), data, cfg, q)) for r in range(cp_size)]
    for p in procs:
        p.start()
    ranks = dict(_get(q, procs, timeout) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    single = ctx.Process(target=_single, args=(str(src), data, cfg, q))
    single.start()
    _, whole = _get(q, [single], timeout)
    single.join(timeout=60)
    for k, v in list(ranks.items()) + [("CP=1", whole)]:
        if isinstance(v, str):
            raise RuntimeError(f"slime under CP, {k}: {v}")
    return ranks, whole


def _get(queue, procs, timeout):
    """The next answer; a process that died without answering is an error, not a hang."""
    import queue as queue_mod
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return queue.get(timeout=2.0)
        except queue_mod.Empty:
            if all(p.exitcode is not None for p in procs):
                codes = [p.exitcode for p in procs]
                raise RuntimeError(f"slime under CP: the worker processes exited ({codes}) without an answer") from None
    for p in procs:
        p.kill()
    raise RuntimeError(f"slime under CP: no answer within {timeout:g} s")


def _single(src, data, cfg, queue):
    try:
        queue.put((0, _loss(src, 1, 0, data, cfg)))
    except Exception as e:  # noqa: BLE001
        queue.put((0, f"{type(e).__name__}: {e}"))


