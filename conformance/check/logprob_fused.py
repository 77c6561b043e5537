"""The fused float64 oracle of `pgspec check --formula logprob.token --vocab V` (and of the log-prob step
of the losses from hidden states, check_head_loss.py): Triton kernels that never write the [n, V] logits.

``check_logprob.oracle_chunks`` (the torch oracle) forms z = X W^T in float64 for a chunk of positions
and runs the backend and ``logit_scales`` over it: about 40 passes over [n, V] float64 memory.  Here
each program holds ``BLOCK_M`` positions and walks the vocabulary in tiles of ``BLOCK_V`` columns,
recomputing each tile's logits from X and W (``tl.dot``) in three sweeps:

1. the row maximum z'_* of the transformed logits z' = (z s) / tau, its first index * (a later tile
   takes the maximum only when strictly greater, ``tl.argmax`` breaks ties to the left), and the
   largest z' strictly below it (whether the "sum" node has a residue: ``logit_scales``' ``inexact``);
2. with z'_* known, S = sum_{v != *} exp(z'_v - z'_*) and sum_v E(e_v), each element formed as
   ``logit_scales`` forms it (the same operations in the same order: only the summation order
   differs);
3. the gradient G = dl/dz ((onehot_y - p) / tau * s, p = e / (1 + S), p_* = 1 / (1 + S)) and the scale
   pass's A_z and C_z per element (the star's column from row constants: A_* = sum_v e_v/(1+S) + 1 + [y = *],
   C_* = (S + sum E(e)) / (1 + S) + 2 S / (1 + S), the closed forms of ``logit_scales``' row sums), reduced
   at once into G W, A_z |W| and C_z |W| [n, H] (``split``: G W in a sweep of its own).  Its relative-error
   factors take fewer divisions than ``logit_scales`` (rel(e) = E(d) + 2, one reciprocal of |a|): equal to
   rounding, which the tests' bounds cover.

The per-row quantities in between (E(z'_*), z'_y and E(z'_y) from X and the rows W_* and W_y, E(l), the
depth of the sum node) are [n] torch operations.  Memory: X, W and [n, H] outputs only.  The work is 8
[n, V, H] products (1 + 2 + 5 per sweep) and a few exps per logit.  The three products of the gradient
and its scales (G W, A_z |W|, C_z |W|) are float64 products.  The logits' products z = X W^T and
|X| |W|^T are float16 products accumulated in float32 where that is exact (``exact_logits``: the seeded
head's X = i / 16, W = j / 2, every partial sum a multiple of 2^-5 far below 2^24; the torch oracle's
float64 logits are exact for the same reason), else float64 products: so on the seeded head 5 of the 8
products run on the tensor cores' float16 rate, 3 at the float64 rate.

It is the oracle on CUDA when triton is importable (``use_fused``); the torch oracle stays the CPU
path and what this one is tested against: ``tests/test_check_logprob_fused.py`` runs both on every
configuration of the log-prob and head-loss checks' tests under Triton's interpreter
(``TRITON_INTERPRET=1``, CPU) and requires agreement within what the judge already grants the oracle.
``PGSPEC_LOGPROB_ORACLE`` = ``fused`` or ``torch`` overrides the choice (``fused`` on a CPU needs
``TRITON_INTERPRET=1`` set before triton is first imported).
"""

from __future__ import annotations

import importlib.util
import os

BLOCK_M = 32        # positions per program
BLOCK_V = 64        # vocabulary columns per tile
ENV = "PGSPEC_LOGPROB_ORACLE"


def available(device: str) -> tuple[bool, str]:
    """(whether the fused oracle can run on ``device``, why not)."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    if str(device).startswith("cuda"):
        return True, ""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True, ""
    return False, f"device {device}: Triton runs on a CPU only under its interpreter (TRITON_INTERPRET=1)"


def use_fused(device: str) -> bool:
    """Whether the log-prob oracle on ``device`` is this module's: ``PGSPEC_LOGPROB_ORACLE`` if set
    (``fused``: required, check.CheckError where it cannot run; ``torch``: never), else on CUDA where triton
    is importable."""
    from .common import CheckError      # a usage error of `pgspec check` (exit status 2), not a pgspec bug

    want = os.environ.get(ENV, "").strip().lower()
    if want not in ("", "fused", "torch"):
        raise CheckError(f"{ENV} must be 'fused' or 'torch', got {want!r}")
    if want == "torch":
        return False
    ok, why = available(device)
    if want == "fused":
        if not ok:
            raise CheckError(f"{ENV}=fused: {why}")
        return True
    return ok and str(device).startswith("cuda")


def _depth(k: int) -> int:
    """max(1, ceil(log2 k)) (check_logprob._depth)."""
    return max(1, (int(k) - 1).bit_length())


def _kernels():
    """The three sweeps (check_logprob_fused_kernels.py, imported on first use so that TRITON_INTERPRET
    set by then applies)."""
    from . import logprob_fused_kernels as k

    return k.stats_kernel, k.sums_kernel, k.grad_kernel


def exact_logits(X, W) -> bool:
    """Whether the products X W^T and |X| |W|^T are exact as float16 products accumulated in float32, in any
    order: X = i / 16 and W = j / 2 with integers |i|, |j| <= 256 (exact in float16), and H max|i| max|j| <
    2^22, so that every partial sum is an integer multiple of 2^-5 below 2^17 in magnitude, held exactly by
    float32 (with margin for a tensor core's truncated alignment).  The seeded head (check_logprob.seeded_head:
    |i| <= 16, |j| <= 1, H = 64 by default) is; then the logits' products need not be float64 products."""
    import torch

    H = X.shape[-1]
    i, j = X * 16, W * 2
    if not (torch.equal(i, i.round()) and torch.equal(j, j.round())):
        return False
    mi = float(i.abs().max()) if i.numel() else 0.0
    mj = float(j.abs().max()) if j.numel() else 0.0
    return mi <= 256 and mj <= 256 and H * mi * mj < 2 ** 22


def oracle_rows(X, W, y, temperature=1.0, logit_scale=1.0, *, block_m: int = BLOCK_M, block_v: int = BLOCK_V,
                num_warps: int | None = None, low: bool | None = None, split: bool = False,
                _vocab_stop: int | None = None):
    """(log-probs [n], E(l) [n], dl/dX [n, H], S(dl/dX) [n, H], P [n, H]) of ``logprob.token`` on the
    logits X W^T (float64 X [n, H], W [V, H] on one device; y [n] int64), as ``check_logprob.oracle_chunks``
    computes them for unmasked positions (P: the path sum A_z |W| of its ``paths``).  ``low``: the logits'
    two products (z and E(z)) as float16 products accumulated in float32 (None: where ``exact_logits``
    says they are exact; the three products of the gradient and its scales are float64 products always).
    ``block_m``, ``block_v``, ``num_warps``: the kernels' tiles and warps (None: Triton's default); ``split``:
    the gradient and its scales in two sweeps (fewer accumulators at once: fewer registers, one more sweep).
    ``_vocab_stop`` (tests only) ends every sweep at that column: a wrong kernel that drops the last tiles."""
    import torch

    stats_kernel, sums_kernel, grad_kernel = _kernels()
    X = X.double().contiguous()
    W = W.double().contiguous()
    if low is None:
        low = exact_logits(X, W)
    Wk = W.to(torch.float16).contiguous() if low else W       # the W the kernels load (exact in float16 if low)
    y = y.to(torch.int64).contiguous()
    n, H = X.shape
    V = W.shape[0]
    dev = X.device
    s, tau = float(logit_scale), float(temperature)
    dH = _depth(H) + 1
    P = torch.tensor([s, tau, abs(s), dH, s / tau, 1 / tau], dtype=torch.float64, device=dev)
    HP = max(16, 1 << (H - 1).bit_length())
    stop = V if _vocab_stop is None else int(_vocab_stop)
    grid = (max(1, -(-n // block_m)),)
    meta = dict(H=H, HP=HP, BM=block_m, BV=block_v, LOW=bool(low), **({} if num_warps is None else
                                                                      {"num_warps": num_warps}))
    f64 = dict(dtype=torch.float64, device=dev)
    m1, m2 = torch.empty(n, **f64), torch.empty(n, **f64)
    star = torch.empty(n, dtype=torch.int64, device=dev)
    if n:
        stats_kernel[grid](X, Wk, P, m1, m2, star, n, V, stop, **meta)

    # per row, from X and the rows W_*, W_y: z'_*, E(z'_*), z'_y, E(z'_y) (logit_scales' elementwise steps)
    def transformed(rows_w):
        z = (X * rows_w).sum(-1)
        Ez = dH * (X.abs() * rows_w.abs()).sum(-1)
        a = z * s
        Ea = a.abs() + abs(s) * Ez
        zp = a / tau
        return zp, zp.abs() + Ea / tau

    zs, Ezs = m1, transformed(W[star])[1]
    zy, Ezy = transformed(W[y])
    S, SEe = torch.empty(n, **f64), torch.empty(n, **f64)
    if n:
        sums_kernel[grid](X, Wk, P, zs, Ezs, star, S, SEe, n, V, stop, **meta)
    y_star = y == star
    dy = torch.where(y_star, torch.zeros_like(zy), zy - zs)
    Ed_y = (dy.abs() + Ezy) + Ezs
    Edy = torch.where(y_star, 2 * Ezs, Ed_y)
    k = V - 1
    # logit_scales' "inexact": some e_v with d_v != 0 above S 1e-60; the largest such e is exp(m2 - z'_*)
    inexact = torch.exp(m2 - zs) > S * 1e-60
    depth = torch.tensor([_depth(k), _depth(k + 1)], **f64)[(inexact & (k >= 2)).long()]
    ES = depth * S + SEe
    tail = torch.log1p(S)
    Etail = tail + 1 + ES / (1 + S)
    if V == 1:      # no "sum" node: l = d_y - log1p(0), a constant, subtracted exactly (logit_scales)
        Etail = torch.zeros_like(Etail)
    lval = dy - tail
    El = lval.abs() + Edy + Etail
    a_s = 1 / (1 + S)
    c_s = 2 / (1 + S)
    A_star = S * a_s + torch.where(y_star, 2.0, 1.0).to(torch.float64)
    C_star = (S + SEe) * a_s + c_s * S
    row = torch.stack([zs, Ezs, a_s, c_s, A_star, C_star, (~y_star).to(torch.float64)], 1).contiguous()
    gX, PA, PC = torch.zeros((n, H), **f64), torch.zeros((n, H), **f64), torch.zeros((n, H), **f64)
    if n:
        for parts in ((True, False), (False, True)) if split else ((True, True),):
            grad_kernel[grid](X, Wk, W, P, row, star, y, gX, PA, PC, n, V, stop, **meta, GRAD=parts[0], SCALES=parts[1])
    SX = 3 * PA + PC        # the edges W_vh, constants: A (1 + rho), rho = 2
    return lval, El, gX, SX, PA


def oracle_chunks(arrays: dict, params: dict, device: str = "cpu", chunk_tokens: int | None = None,
                  paths: bool = False, **kw):
    """``check_logprob.oracle_chunks`` by the fused kernels: the same tuples, chunk by chunk of positions
    (default: 2^26 / H positions, the [n, H] float64 arrays of 512 MiB; no [n, V] array exists)."""
    import torch

    X = torch.as_tensor(arrays["hidden"], device=device).double().reshape(-1, arrays["hidden"].shape[-1])
    W = torch.as_tensor(arrays["weight"], device=device).double()
    y = torch.as_tensor(arrays["targets"], device=device).reshape(-1)
    m = torch.as_tensor(arrays["mask"], device=device).reshape(-1)
    N, H = X.shape
    if chunk_tokens is None:
        chunk_tokens = max(1, (1 << 26) // H)
    tau, s = float(params.get("temperature", 1)), float(params.get("logit_scale", 1))
    for start in range(0, N, chunk_tokens):
        sl = slice(start, min(N, start + chunk_tokens))
        keep = m[sl]
        f64 = dict(dtype=torch.float64, device=device)
        lp, El = torch.zeros(sl.stop - sl.start, **f64), torch.zeros(sl.stop - sl.start, **f64)
        gX, SX = torch.zeros((sl.stop - sl.start, H), **f64), torch.zeros((sl.stop - sl.start, H), **f64)
        PX = torch.zeros_like(gX) if paths else None
        if int(keep.sum()):
            l_c, E_c, g_c, S_c, P_c = oracle_rows(X[sl][keep], W, y[sl][keep], tau, s, **kw)
            lp[keep], El[keep], gX[keep], SX[keep] = l_c, E_c, g_c, S_c
            if paths:
                PX[keep] = P_c
        yield (sl, lp, El, gX, SX, PX) if paths else (sl, lp, El, gX, SX)
