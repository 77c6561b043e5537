"""`pgspec check --formula logprob.token --vocab V`: token log-probs at production vocabulary size.

A kernel that computes log-probs at V = 150k never holds the [N, V] logits of a batch: it takes the
hidden states X [N, H] and the LM head W [V, H] and computes ``log softmax(X W^T)_y`` chunk by
chunk (TRL's ``ChunkedLogProbFunction``, Liger's fused linear losses).  So the check feeds a
*linear head* whose logits are exact:

- X entries k / 16 with k uniform in [-16, 16], W entries uniform in {-1/2, 0, 1/2}, targets y
  uniform in [0, V), the ragged right-padded mask of ``check.seeded_inputs`` (numpy PCG64 seeded
  with ``seed mod 2^64``; X and W are exact in bfloat16).  Every product X_h W_vh is a multiple of 2^-5 of
  magnitude <= 1/2, so every logit z = sum_h X_h W_vh is computed exactly in float32 (and float64)
  for H <= 2^19, whatever the order of the sum; in bfloat16 a kernel that rounds z to bfloat16
  commits that rounding, which is judged like any other.
- The oracle evaluates ``logprob.token`` with the built-in torch backend in float64, ``chunk``
  positions at a time (z = X W^T in float64, exact), and its tolerance scale S as tensor operations:
  the reference's nodes (``pgspec.reference.logprob.log_softmax_at``: transformed logits, the
  shifted differences, their exps, one "sum" node, the fused log1p tail) with the forward error E
  and the scale pass of spec/tolerance.md (``reference._ad``), node for node.
- An adapter with a fused head (``adapter.heads["logprob.token"]``, see ``HEAD_PROTOCOL``) gets X
  and W and returns the log-probs and the gradient with respect to X (of the sum of the unmasked
  log-probs).  The oracle's gradient is G W (G = d/dz, float64), and the scales of the composite
  follow the same rules with the logits formed by the reference's nodes z_v = total_h(X_h * W_vh)
  (W constants): E(z) = (ceil(log2 H) + 1) sum_h |X_h W_vh| (the products are nodes of their own),
  which enters E(l) through the transformed logits, and
  S(dX_h) = sum_v (3 A_v + C_v) |W_vh| (the product's edge W_vh, a constant: rho = 2, with or without
  X_h = 0; reference._ad._edge_error), where A_v + C_v = S(dz_v) splits the logits' gradient scale into the path sum of |local
  derivatives| (A) and the error of evaluating them (C).  ``tests/test_check.py`` checks this
  against ``reference._ad`` run on the same composite.
- An adapter without a head entry but with ``logprob.token`` gets the logits ``X W^T`` formed in its
  dtype on its device (only for sizes whose [B, T, V] logits fit), and its gradient is taken with
  respect to those logits, then mapped to X by autograd through the matmul.

On CUDA (triton importable) ``oracle_chunks`` hands the work to check_logprob_fused.py: the same
quantities from Triton kernels that recompute the logits tile by tile instead of writing [n, V] float64
arrays (tests/test_check_logprob_fused.py holds the two equal); this module's tensor passes stay the
CPU oracle and the fused one's reference.
"""

from __future__ import annotations

import math

import numpy as np

HEAD_PROTOCOL = """adapter.heads["logprob.token"](hidden [B,T,H], weight [V,H], targets [B,T] int64, mask [B,T] bool,
params) -> {"logprobs": [B,T] (0 where masked), "grad": {"hidden": [B,T,H]}}, the gradient being that of the sum of
the unmasked log-probs; hidden and weight in the run's dtype on the run's device."""

FORMULA = "logprob.token"
DEFAULT_HIDDEN = 64


def seeded_head(B: int, T: int, V: int, H: int = DEFAULT_HIDDEN, seed: int = 0, ragged: bool = True) -> dict:
    """numpy arrays {hidden [B,T,H] float32, weight [V,H] float32, targets [B,T] int64, mask [B,T] bool}."""
    if V < 2:
        raise ValueError(f"--vocab must be >= 2, got {V}")
    if not 1 <= H <= 2 ** 19:
        raise ValueError(f"--hidden must be in [1, 2^19] (exact logits), got {H}")
    from .draws import pcg64

    rng = pcg64(seed)
    hidden = (rng.integers(-16, 17, size=(B, T, H), dtype=np.int8).astype(np.float32)) / 16
    weight = (rng.integers(-1, 2, size=(V, H), dtype=np.int8).astype(np.float32)) / 2
    targets = rng.integers(0, V, size=(B, T), dtype=np.int64)
    lengths = np.asarray([T - (b * 7919) % (T // 4 + 1) for b in range(B)] if ragged else [T] * B)
    mask = np.arange(T)[None, :] < lengths[:, None]
    return {"hidden": hidden, "weight": weight, "targets": targets, "mask": mask}


def _depth(k):
    """max(1, ceil(log2 k)) for an integer k >= 1 (reference _ad._rounding of a "sum" node)."""
    return max(1, (int(k) - 1).bit_length())


def _rel(v, E, nonneg=False):
    """1 + E / |v| where v != 0, else 1 + E: the reference's relative-error factor of a node of value
    v and forward error E (a fresh tensor)."""
    import torch

    av = v if nonneg else v.abs()
    r = torch.where(av != 0, E / av, E)          # E / 0 is replaced where v = 0
    return r.add_(1)


def logit_scales(z, targets, Ez, temperature=1.0, logit_scale=1):
    """(E(l) [n], A [n, V], C [n, V]) for log_softmax_at on float64 logits ``z`` [n, V] with forward
    error ``Ez`` (0 for exact inputs, a tensor for logits formed by a head), node for node as the
    reference builds them (softcap null): a_v = z_v * s, z'_v = a_v / tau, d_v = z'_v - z'_*,
    e_v = exp(d_v) (v != *), S = total(e), tail = log1p(S) (fused: rounding log1p(S) + 1, derivative
    error 2/(1 + S)), l = d_y - tail.  A + C is the gradient scale of the logits (S(dz_v)).

    The reference receives real parameters as mpf (reference/_evaluate.py check_params), so the
    edges of the scale and of the temperature carry their products' relative errors.

    Every [n, V] step is one tensor operation, in place where its input is not needed again: the
    oracle's time at V = 150k is these passes over memory.  Quantities of the maximum * and of the
    target y are one element per row, set by index; a product with 1 or a division by 1 (s or
    tau = 1) is exact and skipped."""
    import torch

    s = float(logit_scale)
    tau = float(temperature)
    n, V = z.shape
    rows = torch.arange(n, device=z.device)
    a = z if s == 1 else z * s
    Ea = a.abs()
    Ea += Ez if s == 1 else abs(s) * Ez             # |a| + |s| E(z)
    zp = a if tau == 1 else a / tau
    Ezp = zp.abs()
    Ezp += Ea if tau == 1 else Ea / tau             # |z'| + E(a) / tau
    star = torch.argmax(zp, dim=-1)                 # the first index of the maximum
    zs, Ezs = zp[rows, star], Ezp[rows, star]
    d = zp - zs[:, None]
    dy = d[rows, targets]
    Ed = d.abs()
    Ed += Ezp
    Ed += Ezs[:, None]                              # |d| + E(z') + E(z'_*)
    y_star = targets == star
    Edy = torch.where(y_star, 2 * Ezs, Ed[rows, targets])
    e = torch.exp(d)
    e[rows, star] = 0                               # d_* is not a term of the sum
    Ee = e * Ed
    Ee += e                                         # |e| + e E(d) (e >= 0), 0 at the maximum
    del Ed
    S = e.sum(-1)
    k = V - 1
    # The reference counts a "sum" node's residue value - fsum(terms) as one more term, the value
    # held at its working precision (60 digits) and the fsum taken in the 64-bit scale pass: so there
    # is a residue unless the sum is exact in 64 bits, i.e. unless every term but exact ones (e = 1
    # at a tie with the maximum) vanishes at 60 digits.  It changes the depth only when k is a power
    # of two.  (d = 0 at the maximum itself, so d != 0 leaves it out.)
    inexact = ((d != 0) & (e > S[:, None] * 1e-60)).any(-1)
    del d
    depth = torch.tensor([_depth(k), _depth(k + 1)], dtype=z.dtype, device=z.device)[(inexact & (k >= 2)).long()]
    ES = depth * S + Ee.sum(-1)
    tail = torch.log1p(S)
    Etail = tail + 1 + ES / (1 + S)
    if V == 1:      # no "sum" node: l = d_y - log1p(0), a constant, subtracted exactly
        Etail = torch.zeros_like(Etail)
    lval = dy - tail
    El = lval.abs() + Edy + Etail

    # scale pass, from l backwards
    a_s = (1 / (1 + S))[:, None]
    c_s = (2 / (1 + S))[:, None]
    step_e = _rel(e, Ee, nonneg=True).mul_(a_s).add_(c_s)    # c + a rel(e)
    del Ee
    Cd = step_e.mul_(e)                             # 0 at the maximum (e = 0 there)
    Ad = e.mul_(a_s)
    Ad[rows, targets] += (~y_star).to(z.dtype)      # l = d_y - tail: the +1 edge into d_y (y != *)
    # every d_v (v != *) also reaches z'_* through its -1 edge; d_* (reached only when y = *) twice
    A_star = Ad.sum(-1) + 2 * y_star.to(z.dtype)
    Ad[rows, star] = A_star
    Cd[rows, star] = Cd.sum(-1)
    A_zp = Ad
    # z' = a / tau and a = z s: a division and a product by a constant, whose derivative errs by one
    # rounding (the constant's) and the product by another: rho = 2 on each edge (reference._ad._edge_error)
    step_zp = A_zp.mul(2).add_(Cd)                  # C(z') + 2 A(z')
    del Cd, Ezp
    A_a = A_zp if tau == 1 else A_zp.div_(tau)
    C_a = step_zp if tau == 1 else step_zp.div_(tau)
    C_z = A_a.mul(2).add_(C_a)                     # C(a) + 2 A(a)
    if s != 1:
        C_z.mul_(abs(s))
        A_a.mul_(abs(s))
    return El, A_a, C_z


def head_forward_error(xc, wabs):
    """E(z) of z_v = total_h(X_h * W_vh): (ceil(log2 H) + 1) sum_h |X_h W_vh| (rounding of the sum
    node and of each product node; the products here are exact, the bound does not know it)."""
    H = xc.shape[-1]
    return (_depth(H) + 1) * (xc.abs() @ wabs.T)


def oracle_chunks(arrays: dict, params: dict, device: str = "cpu", chunk_tokens: int | None = None,
                  paths: bool = False, fused: bool | None = None):
    """Yield, for each chunk of positions (flattened over B, T), (index slice, log-probs [n],
    E(l) [n], grad wrt hidden [n, H], its scale [n, H]) of the float64 oracle; masked positions give
    0 with scale 0.  ``paths``: each tuple also ends with P [n, H], the A part of the scale pass at X
    (the sum over paths of |local derivatives|, A_z |W|): what a composite that seeds the pass at l
    with (A_l, C_l) instead of (1, 0) needs (check_head_loss.py).  ``fused``: the Triton oracle of
    check_logprob_fused.py, which never writes the [n, V] logits (None: its ``use_fused(device)``, on CUDA
    where triton is importable); False: the torch oracle below."""
    import torch

    from . import logprob_fused as check_logprob_fused
    from ..judge import compare
    from ..run import runner

    if fused if fused is not None else check_logprob_fused.use_fused(device):
        yield from check_logprob_fused.oracle_chunks(arrays, params, device, chunk_tokens, paths)
        return

    torch_adapter = runner.load_adapter("torch")
    X = torch.as_tensor(arrays["hidden"], device=device).double().reshape(-1, arrays["hidden"].shape[-1])
    W = torch.as_tensor(arrays["weight"], device=device).double()
    Wabs = W.abs()
    y = torch.as_tensor(arrays["targets"], device=device).reshape(-1)
    m = torch.as_tensor(arrays["mask"], device=device).reshape(-1)
    V = W.shape[0]
    N = X.shape[0]
    if chunk_tokens is None:
        # up to about 40 float64 [n, V] temporaries live at once (the backend's autograd and the scale
        # pass): 256 MiB each on a CPU, about 1% of the free
        # memory on a GPU
        budget = torch.cuda.mem_get_info()[0] // 96 if X.is_cuda else 1 << 28
        chunk_tokens = max(1, budget // (8 * V))
    p = {"temperature": params.get("temperature", 1), "logit_scale": params.get("logit_scale", 1), "softcap": None}
    for start in range(0, N, chunk_tokens):
        sl = slice(start, min(N, start + chunk_tokens))
        keep = m[sl]
        n = int(keep.sum())
        lp = torch.zeros(sl.stop - sl.start, dtype=torch.float64, device=device)
        El = torch.zeros_like(lp)
        gX = torch.zeros((sl.stop - sl.start, X.shape[1]), dtype=torch.float64, device=device)
        SX = torch.zeros_like(gX)
        PX = torch.zeros_like(gX) if paths else None
        if n:
            xc = X[sl][keep]
            yc = y[sl][keep]
            with torch.no_grad():
                z = xc @ W.T                               # exact (see the module docstring)
            logits = z[None].clone().requires_grad_(True)
            tensors = {"logits": logits, "targets": yc[None], "mask": torch.ones((1, n), dtype=torch.bool, device=device)}
            out, grads = compare.call(torch_adapter, FORMULA, tensors, p)
            G = grads["logits"][0].detach()
            with torch.no_grad():
                lp[keep] = out["logprobs"][0].detach()
                Ez = head_forward_error(xc, Wabs)
                El_c, A_z, C_z = logit_scales(z, yc, Ez, p["temperature"], p["logit_scale"])
                El[keep] = El_c
                gX[keep] = G @ W
                P = A_z @ Wabs
                SX[keep] = 3 * P + C_z @ Wabs     # the edges W_vh, constants: A (1 + rho), rho = 2
                if paths:
                    PX[keep] = P
                del z, Ez, A_z, C_z, G, logits, P
        yield (sl, lp, El, gX, SX, PX) if paths else (sl, lp, El, gX, SX)


def check_params(params: dict) -> dict:
    """logprob.token's parameters the head oracle covers: temperature > 0, logit_scale > 0, softcap null."""
    from .common import CheckError

    p = {"temperature": 1, "logit_scale": 1, "softcap": None}
    unknown = set(params) - set(p)
    if unknown:
        raise CheckError(f"{FORMULA}: unknown parameter(s) {sorted(unknown)}; parameters: {sorted(p)}")
    p.update(params)
    if p["softcap"] is not None:
        raise CheckError(f"{FORMULA}: the oracle scale covers softcap = null only (got {p['softcap']!r})")
    for name in ("temperature", "logit_scale"):
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise CheckError(f"{FORMULA}: parameter {name!r} must be a real > 0, got {v!r}")
    return p


def agreement(arrays: dict, params: dict, device: str = "cpu", **kw) -> dict:
    """Both oracles on ``arrays`` (with ``paths``): {"logprobs", "grad": max |fused - torch| / (2 K u64 S), S the
    torch oracle's scale (what the judge grants the oracle, twice; where S = 0, 0 if equal else inf); "E(l)",
    "S(grad)", "P": the largest relative difference of the scales; "scale_tol": 2 (V + 16) u64, the bound on it
    (tests/test_check_logprob_fused.py says why); "ok": all within}.  ``kw``: oracle_rows' block sizes."""
    import torch

    from ..judge import tolerance
    from . import logprob_fused
    from .common import U64

    p = {"temperature": 1, "logit_scale": 1, "softcap": None, **params}
    K, u = tolerance.K["logprob"], U64
    worst = {"logprobs": 0.0, "grad": 0.0, "E(l)": 0.0, "S(grad)": 0.0, "P": 0.0}

    def ratio(a, b, s):
        d = (a - b).abs()
        return float(torch.where(s > 0, d / (2 * K * u * s), torch.where(d == 0, 0.0, float("inf"))).max())

    def rel(a, b):
        d = (a - b).abs()
        return float(torch.where(a != 0, d / a.abs(), torch.where(d == 0, 0.0, float("inf"))).max())

    torch_chunks = oracle_chunks(arrays, p, device, paths=True, fused=False)
    fused_all = next(logprob_fused.oracle_chunks(arrays, p, device, chunk_tokens=arrays["mask"].size, paths=True, **kw))
    for sl, l0, E0, g0, S0, P0 in torch_chunks:
        _, l1, E1, g1, S1, P1 = (t[sl] if hasattr(t, "shape") else t for t in fused_all)
        for k, v in (("logprobs", ratio(l0, l1, E0)), ("grad", ratio(g0, g1, S0)), ("E(l)", rel(E0, E1)),
                     ("S(grad)", rel(S0, S1)), ("P", rel(P0, P1))):
            worst[k] = max(worst[k], v)
    tol = 2 * (arrays["weight"].shape[0] + 16) * 2.0 ** -53
    ok = worst["logprobs"] <= 1 and worst["grad"] <= 1 and max(worst["E(l)"], worst["S(grad)"], worst["P"]) <= tol
    return {**worst, "scale_tol": tol, "ok": ok}
