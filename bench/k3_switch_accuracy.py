"""Accuracy of the torch backend's k3 core ``e^u - 1 - u`` (``adapters/torch/is_.py: expm1_minus_x``)
and of the forms its switch-over points choose between, on [-2, -1] and at u = -1 and u = 2.

    python bench/k3_switch_accuracy.py

``expm1_minus_x`` takes the Taylor series on [-1, 2], ``e^u - (1 + u)`` below -1 and ``expm1(u) - u``
above 2.  Four mutants of bench/mutation_score.py move a switch-over point: ``is_.py:151:17`` (series
down to -2) and ``is_.py:153:51`` (``expm1(u) - u`` down to -2) change the form on [-2, -1);
``is_.py:151:11`` (u = -1 to ``e^u - (1 + u)``) and ``is_.py:151:23`` (u = 2 to ``expm1(u) - u``) change
it at one point.  This prints, per dtype, each form's largest error over the spec's tolerance bound
for ``is.reject``'s ``token_stat`` (K = 4, bound ``4 u(dtype) S`` with the reference's own scale of the
node, ``S = e^u + |e^u - 1| + |k3|``; the propagated error of u, which only widens the bound, is left
out), and in how many points it differs from the backend's form: over every bfloat16 and every float32
in [-2, -1], and 10^6 random float64 (with the two endpoints).  The exact value is taken in numpy's
long double where it has a 64-bit significand (x86), else from mpmath on the first 20,000 points.
A ratio below 1 everywhere means that no ``token_stat`` or ``seq_stat`` can tell the forms apart.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import torch


_SERIES = [1.0 / math.factorial(k + 2) for k in range(27)]   # as adapters/torch/is_.py
U = {"bfloat16": 2.0 ** -8, "float32": 2.0 ** -24, "float64": 2.0 ** -53}
K = 4


def forms(u):
    """The three forms, each evaluated in u's dtype."""
    series = torch.full_like(u, _SERIES[-1])
    for c in reversed(_SERIES[:-1]):
        series = series * u + c
    return {"series": u * u * series, "exp(u) - (1 + u)": torch.exp(u) - (1 + u), "expm1(u) - u": torch.expm1(u) - u}


def grid(dtype: str) -> torch.Tensor:
    t = getattr(torch, dtype)
    if dtype == "float64":
        g = torch.Generator().manual_seed(0)
        return torch.cat([torch.tensor([-2.0, -1.0]), -1 - torch.rand(10 ** 6, generator=g, dtype=torch.float64)])
    # every value of the dtype in [-2, -1]: the bit patterns from -1 to -2 (one sign, one binade)
    bits = {"bfloat16": (torch.int16, 7), "float32": (torch.int32, 23)}[dtype]
    lo = torch.tensor([-1.0], dtype=t).view(bits[0]).item()
    n = 1 << bits[1]
    return (torch.arange(lo, lo + n + 1, dtype=torch.int64).to(bits[0])).view(t).double()


def exact(u: np.ndarray) -> np.ndarray:
    if np.finfo(np.longdouble).nmant >= 63:
        x = u.astype(np.longdouble)
        return np.expm1(x) - x
    import mpmath as mp

    return np.array([mp.expm1(mp.mpf(x)) - mp.mpf(x) for x in u], dtype=np.float64)


def main() -> int:
    print(f"k3 = e^u - 1 - u on [-2, -1]: error / bound (K = {K}, S = e^u + |e^u - 1| + |k3|)")
    for dtype in ("bfloat16", "float32", "float64"):
        u64 = grid(dtype)
        if dtype == "float64" and np.finfo(np.longdouble).nmant < 63:
            u64 = u64[:20000]
        u = u64.to(getattr(torch, dtype))
        assert torch.equal(u.double(), u64)
        ex = exact(u64.numpy())
        S = np.exp(u64.numpy()) + np.abs(np.expm1(u64.numpy())) + np.abs(ex.astype(np.float64))
        bound = K * U[dtype] * S
        got = forms(u)
        backend = got["exp(u) - (1 + u)"]
        for name, y in got.items():
            err = np.abs(y.double().numpy().astype(ex.dtype) - ex).astype(np.float64)
            r = err / bound
            k = int(r.argmax())
            print(f"  {dtype:8s} {name:17s} max ratio {r.max():.3f} (at u = {u64[k].item()!r}); differs from the "
                  f"backend's form at {int((y != backend).sum())} of {u.numel()} points")
        for point, form in ((-1.0, "exp(u) - (1 + u)"), (2.0, "expm1(u) - u")):
            p = torch.tensor([point], dtype=getattr(torch, dtype))
            y = forms(p)[form].double().item()
            e = float(abs(np.longdouble(y) - exact(np.array([point]))[0]))
            s = math.exp(point) + abs(math.expm1(point)) + abs(math.expm1(point) - point)
            print(f"  {dtype:8s} u = {point:4g}: {form:17s} ratio {e / (K * U[dtype] * s):.3f} "
                  f"(the series there: {forms(p)['series'].double().item()!r}, this form: {y!r})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
