"""The Triton kernels of check_logprob_fused.py (the three sweeps over the vocabulary; see its docstring).

Imported only when the fused oracle runs: importing triton is not free, and Triton's interpreter
(TRITON_INTERPRET=1) must be chosen before these functions are made."""

import triton
import triton.language as tl


@triton.jit
def _prod(a, b, LOW: tl.constexpr):
    """a @ b in float64: a float64 product, or (LOW) a float16 one accumulated in float32, exact on inputs
    that check_logprob_fused.exact_logits admits."""
    if LOW:
        return tl.dot(a, b, out_dtype=tl.float32).to(tl.float64)
    else:
        return tl.dot(a, b, out_dtype=tl.float64)


@triton.jit
def _logits(x, xa, W, cols, hs, H, V, P, WITH_E: tl.constexpr, LOW: tl.constexpr):
    """(z', E(z'), a, E(a), W tile^T, |W tile|^T) of one tile: a = z s, z' = a / tau, as logit_scales (the
    W tiles in float64)."""
    cmask = cols < V
    wt = tl.load(W + cols[None, :] * H + hs[:, None], mask=cmask[None, :] & (hs[:, None] < H), other=0.0)
    z = _prod(x, wt, LOW)
    s = tl.load(P)
    tau = tl.load(P + 1)
    a = z * s
    zp = a / tau
    if WITH_E:
        abs_s = tl.load(P + 2)
        dH = tl.load(P + 3)
        wa = tl.abs(wt)
        Ez = dH * _prod(xa, wa, LOW)
        Ea = tl.abs(a) + abs_s * Ez
        Ezp = tl.abs(zp) + Ea / tau
        return zp, Ezp, a, Ea, wt, wa
    else:
        return zp, zp, a, a, wt, wt


@triton.jit
def _rows_of_x(X, rows, rmask, hs, H, LOW: tl.constexpr):
    """(X rows, |X rows|) for the logits' products: float64, or (LOW) float16 (exact)."""
    x = tl.load(X + rows[:, None] * H + hs[None, :], mask=rmask[:, None] & (hs[None, :] < H), other=0.0)
    if LOW:
        return x.to(tl.float16), tl.abs(x).to(tl.float16)
    else:
        return x, tl.abs(x)


@triton.jit
def stats_kernel(X, W, P, M1, M2, ARG, n, V, VSTOP, H: tl.constexpr, HP: tl.constexpr, BM: tl.constexpr,
                 BV: tl.constexpr, LOW: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    rmask = rows < n
    hs = tl.arange(0, HP)
    x, xa = _rows_of_x(X, rows, rmask, hs, H, LOW)
    ninf = float("-inf")
    m1 = tl.full([BM], ninf, tl.float64)
    m2 = tl.full([BM], ninf, tl.float64)
    arg = tl.zeros([BM], tl.int64)
    for v0 in range(0, VSTOP, BV):
        cols = v0 + tl.arange(0, BV)
        zp, _e, _a, _ea, _w, _wa = _logits(x, xa, W, cols, hs, H, V, P, False, LOW)
        zp = tl.where((cols < V)[None, :], zp, ninf)
        tmax = tl.max(zp, axis=1)
        targ = tl.argmax(zp, axis=1, tie_break_left=True)
        t2 = tl.max(tl.where(zp < tmax[:, None], zp, ninf), axis=1)
        M = tl.maximum(m1, tmax)
        m2 = tl.maximum(tl.maximum(tl.where(m1 < M, m1, ninf), m2), tl.maximum(tl.where(tmax < M, tmax, ninf), t2))
        arg = tl.where(tmax > m1, v0 + targ.to(tl.int64), arg)
        m1 = M
    tl.store(M1 + rows, m1, mask=rmask)
    tl.store(M2 + rows, m2, mask=rmask)
    tl.store(ARG + rows, arg, mask=rmask)

@triton.jit
def sums_kernel(X, W, P, ZS, EZS, STAR, S_OUT, SEE_OUT, n, V, VSTOP, H: tl.constexpr, HP: tl.constexpr,
                BM: tl.constexpr, BV: tl.constexpr, LOW: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    rmask = rows < n
    hs = tl.arange(0, HP)
    x, xa = _rows_of_x(X, rows, rmask, hs, H, LOW)
    zs = tl.load(ZS + rows, mask=rmask, other=0.0)
    Ezs = tl.load(EZS + rows, mask=rmask, other=0.0)
    star = tl.load(STAR + rows, mask=rmask, other=0)
    S = tl.zeros([BM], tl.float64)
    SEe = tl.zeros([BM], tl.float64)
    for v0 in range(0, VSTOP, BV):
        cols = v0 + tl.arange(0, BV)
        zp, Ezp, _a, _ea, _w, _wa = _logits(x, xa, W, cols, hs, H, V, P, True, LOW)
        d = zp - zs[:, None]
        Ed = (tl.abs(d) + Ezp) + Ezs[:, None]
        keep = (cols < V)[None, :] & (cols[None, :] != star[:, None])
        e = tl.where(keep, tl.exp(tl.where(keep, d, 0.0)), 0.0)
        Ee = e * Ed + e
        S += tl.sum(e, axis=1)
        SEe += tl.sum(Ee, axis=1)
    tl.store(S_OUT + rows, S, mask=rmask)
    tl.store(SEE_OUT + rows, SEe, mask=rmask)

@triton.jit
def grad_kernel(X, W, W64, P, ROW, STAR, Y, GX, PA, PC, n, V, VSTOP, H: tl.constexpr, HP: tl.constexpr,
                BM: tl.constexpr, BV: tl.constexpr, LOW: tl.constexpr, GRAD: tl.constexpr, SCALES: tl.constexpr):
    # ROW [n, 7]: z'_*, E(z'_*), 1/(1+S), 2/(1+S), A_*, C_*, [y != *]; GRAD: G W into GX, SCALES: A_z |W|, C_z |W|
    # into PA, PC (both in one sweep, or each in a sweep of its own: fewer accumulators held at once).  W64: W in
    # float64 for those products (with LOW, W holds the float16 copy for the logits' products: the float64 tiles
    # are loaded, not converted from float16 ones, which Triton 3.6's float64 dot cannot take as operands)
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    rmask = rows < n
    hs = tl.arange(0, HP)
    x, xa = _rows_of_x(X, rows, rmask, hs, H, LOW)
    zs = tl.load(ROW + rows * 7, mask=rmask, other=0.0)[:, None]
    Ezs = tl.load(ROW + rows * 7 + 1, mask=rmask, other=0.0)[:, None]
    a_s = tl.load(ROW + rows * 7 + 2, mask=rmask, other=0.0)[:, None]
    c_s = tl.load(ROW + rows * 7 + 3, mask=rmask, other=0.0)[:, None]
    A_star = tl.load(ROW + rows * 7 + 4, mask=rmask, other=0.0)[:, None]
    C_star = tl.load(ROW + rows * 7 + 5, mask=rmask, other=0.0)[:, None]
    y_not_star = tl.load(ROW + rows * 7 + 6, mask=rmask, other=0.0)[:, None]
    star = tl.load(STAR + rows, mask=rmask, other=0)[:, None]
    y = tl.load(Y + rows, mask=rmask, other=0)[:, None]
    tau = tl.load(P + 1)
    abs_s = tl.load(P + 2)
    s_tau = tl.load(P + 4)
    inv_tau = tl.load(P + 5)
    gx = tl.zeros([BM, HP], tl.float64)
    pa = tl.zeros([BM, HP], tl.float64)
    pc = tl.zeros([BM, HP], tl.float64)
    for v0 in range(0, VSTOP, BV):
        cols = v0 + tl.arange(0, BV)
        zp, Ezp, a, Ea, wt, wa = _logits(x, xa, W, cols, hs, H, V, P, True, LOW)
        if LOW:
            wt = tl.load(W64 + cols[None, :] * H + hs[:, None], mask=(cols < V)[None, :] & (hs[:, None] < H), other=0.0)
            wa = tl.abs(wt)
        valid = (cols < V)[None, :]
        is_star = cols[None, :] == star
        is_y = cols[None, :] == y
        d = zp - zs
        Ed = (tl.abs(d) + Ezp) + Ezs
        e_full = tl.where(valid, tl.exp(tl.where(valid, d, 0.0)), 0.0)
        e = tl.where(is_star, 0.0, e_full)
        # the backend's gradient: (onehot_y - p) s / tau, p_v = e_v / (1 + S), p_* = 1 / (1 + S)
        p = tl.where(is_star, a_s, e * a_s)
        G = (tl.where(is_y, 1.0, 0.0) - p) * s_tau
        G = tl.where(valid, G, 0.0)
        # the scale pass of logit_scales, element for element: rel(e) = 1 + (e E(d) + e) / e = E(d) + 2 in fewer
        # divisions, equal to rounding; the edges of z' = a / tau and a = z s (a constant each) carry rho = 2;
        # divisions by tau as products with 1 / tau.  The scales are bounds: their rounding moves a verdict only
        # within the rounding of the bound itself (tests/test_check_logprob_fused.py).
        rel_e = tl.where(e != 0, Ed + 2, 1.0)
        Cd = (rel_e * a_s + c_s) * e
        Ad = e * a_s + tl.where(is_y, y_not_star, 0.0)
        Ad = tl.where(is_star, A_star, Ad)
        Cd = tl.where(is_star, C_star, Cd)
        step_zp = 2.0 * Ad + Cd
        A_a = Ad * inv_tau
        C_a = step_zp * inv_tau
        C_z = (2.0 * A_a + C_a) * abs_s
        A_z = A_a * abs_s
        A_z = tl.where(valid, A_z, 0.0)
        C_z = tl.where(valid, C_z, 0.0)
        if GRAD:
            gx += tl.dot(G, tl.trans(wt), out_dtype=tl.float64)
        if SCALES:
            pa += tl.dot(A_z, tl.trans(wa), out_dtype=tl.float64)
            pc += tl.dot(C_z, tl.trans(wa), out_dtype=tl.float64)
    out = rows[:, None] * H + hs[None, :]
    omask = rmask[:, None] & (hs[None, :] < H)
    if GRAD:
        tl.store(GX + out, gx, mask=omask)
    if SCALES:
        tl.store(PA + out, pa, mask=omask)
        tl.store(PC + out, pc, mask=omask)
