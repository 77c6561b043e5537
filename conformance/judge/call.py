"""The call convention: how an adapter's formula is called on inputs (``to_tensors``, the adapter's
``call`` with the case's cotangent in reach, ``adapter_call``, and the vector-Jacobian product of the
``grad_of`` output with that cotangent, ``objective``), so that the runner, every property, the
fuzzer and `pgspec check` call adapters the same way."""

from __future__ import annotations

import contextlib
import contextvars

import numpy as np

from pgspec.reference import REGISTRY


# ------------------------------------------------------------------------------------------------
# The call convention
# ------------------------------------------------------------------------------------------------
TORCH_DTYPES = {"float64": "float64", "float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


def to_tensors(formula_id: str, inputs: dict, dtype: str, device: str):
    """The inputs (nested lists as the golden corpus gives them) as tensors of ``dtype``: reals
    in ``dtype`` (exact: golden inputs are bfloat16-exact), masks bool, ids long; the formula's
    differentiable inputs require grad."""
    import torch

    f = REGISTRY[formula_id]
    tdtype = getattr(torch, TORCH_DTYPES[dtype])
    tensors = {}
    for name, value in inputs.items():
        kind = f.input(name).kind
        # through numpy: the same values as torch.tensor(nested list), built several times faster
        # (np.array copies: the tensors never share memory with the caller's arrays, see runner.case_arrays)
        if kind == "bool":
            t = torch.from_numpy(np.array(value, dtype=np.bool_))
            t = t if device == "cpu" else t.to(device)
        elif kind == "int":
            t = torch.from_numpy(np.array(value, dtype=np.int64))
            t = t if device == "cpu" else t.to(device)
        else:
            # golden inputs are bfloat16-exact: float64 -> dtype is exact
            t = torch.from_numpy(np.array(value, dtype=np.float64)).to(device=device, dtype=tdtype)
            if name in f.differentiable:
                t.requires_grad_(True)
        tensors[name] = t
    return tensors


def objective(out, mask, cotangent=None):
    """The VJP objective: the sum over the unmasked elements i of the grad_of output of c_i * out_i
    (masked elements selected away, never multiplied: they may be NaN).  ``cotangent``: c, a tensor
    (or nested floats) of ``out``'s shape, or None for ones (the plain sum).  c is bfloat16-exact,
    so it converts to ``out``'s dtype exactly."""
    import torch

    if mask is not None and out.dim() >= 2 and tuple(out.shape[:2]) == tuple(mask.shape):
        m = mask.reshape(mask.shape + (1,) * (out.dim() - 2))
        out = torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))
    if cotangent is not None:
        c = cotangent_tensor(cotangent, out)
        out = out * c
    return out.sum()


def cotangent_tensor(cotangent, like):
    """``cotangent`` (a tensor or nested floats) as a tensor of ``like``'s dtype and device; a ValueError
    naming both shapes when it is not of ``like``'s shape (never a broadcast)."""
    import torch

    c = cotangent if isinstance(cotangent, torch.Tensor) else torch.as_tensor(np.asarray(cotangent, dtype=np.float64))
    if tuple(c.shape) != tuple(like.shape):
        raise ValueError(f"the cotangent has shape {list(c.shape)}, the output {list(like.shape)}: they must agree")
    return c.to(dtype=like.dtype, device=like.device)


# ------------------------------------------------------------------------------------------------
# The cotangent an adapter's own gradient must use (documented in pgspec.adapters.base)
# ------------------------------------------------------------------------------------------------
class _Cotangent:
    __slots__ = ("value", "read")

    def __init__(self, value):
        self.value = value      # a float64 tensor shaped like the grad_of output, or None (ones)
        self.read = False


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("pgspec_cotangent", default=None)


def current_cotangent(like=None):
    """The cotangent c of the call in progress, for an adapter that returns its own gradients
    (``out["grad"]``): the gradient it returns must be the VJP d(sum_i c_i out_i)/d input of its
    ``grad_of`` output (masked elements excluded).  ``like``: the output tensor; c comes in its
    dtype and device (exact).  Ones (shaped like ``like``) when the caller set none; None when
    neither is known.  Reading it marks the call: an own gradient of a non-scalar output returned
    without reading the cotangent is an error (it would silently be the VJP of ones)."""
    import torch

    state = _CURRENT.get()
    if state is not None:
        state.read = True
    value = None if state is None else state.value
    if value is None:
        return None if like is None else torch.ones_like(like)
    if like is None:
        return value
    return cotangent_tensor(value, like)


@contextlib.contextmanager
def cotangent_context(cotangent):
    """``with cotangent_context(c) as state:`` makes ``c`` the call's cotangent (``current_cotangent``);
    ``state.read`` tells afterwards whether the adapter read it."""
    import torch

    value = None
    if cotangent is not None:
        value = cotangent if isinstance(cotangent, torch.Tensor) else \
            torch.as_tensor(np.asarray(cotangent, dtype=np.float64))
    state = _Cotangent(value)
    token = _CURRENT.set(state)
    try:
        yield state
    finally:
        _CURRENT.reset(token)


class OwnGradientError(Exception):
    """An adapter's own gradient that cannot be the VJP with the case's cotangent."""


def own_gradients(formula_id: str, grads: dict, cotangent, read: bool, adapter_name: str = "the adapter") -> dict:
    """An adapter's own gradients (``out["grad"]``) as the VJP with ``cotangent``: as returned when the
    adapter read ``current_cotangent()``; for a scalar ``grad_of`` output multiplied by its one value
    c in float64 (exact: c has 4 significant bits); else an OwnGradientError (a per-token or
    per-sequence output's gradient made with ones is not the VJP the case asks for).  ``cotangent`` None: as returned."""
    import torch

    if cotangent is None or read or not grads:
        return grads
    f = REGISTRY[formula_id]
    shape = next(o.shape for o in f.outputs if o.name == f.grad_of)
    if tuple(shape) == ():
        c = float(np.asarray(cotangent.detach().cpu() if isinstance(cotangent, torch.Tensor) else cotangent,
                             dtype=np.float64))
        return {n: (g.detach().to(torch.float64) * c if isinstance(g, torch.Tensor) else g) for n, g in grads.items()}
    raise OwnGradientError(
        f"{adapter_name} returned its own gradient of {formula_id}'s non-scalar output {f.grad_of!r} without "
        f"reading the case's cotangent (pgspec.adapters.base.current_cotangent()): the gradient pgspec judges is the "
        f"VJP with that cotangent (spec/golden-format.md, 'Cotangent'); one made with ones would pass unjudged")


def adapter_call(adapter, formula_id: str, tensors: dict, params: dict, cotangent=None):
    """``adapter.call`` with ``cotangent`` as the call's ``current_cotangent()``: (out, read), read telling
    whether the adapter read it."""
    with cotangent_context(cotangent) as state:
        out = adapter.call(formula_id, tensors, params)
    return out, state.read


def call(adapter, formula_id: str, tensors: dict, params: dict, unconnected: list | None = None, cotangent=None):
    """(outputs, gradients) of the adapter's formula on ``tensors``: the adapter's own gradients
    when it returns them (``out["grad"]``, made the VJP with ``cotangent`` by ``own_gradients``), else
    autograd of ``objective`` of the ``grad_of`` output with ``cotangent`` (None: ones) with respect to
    every differentiable input given (zeros where unused; the names of those inputs are appended to
    ``unconnected`` when a list is given)."""
    import torch

    f = REGISTRY[formula_id]
    with torch.enable_grad():
        out, read = adapter_call(adapter, formula_id, tensors, dict(params), cotangent)
        grads = out.get("grad")
        diff = [n for n in f.differentiable if n in tensors]
        if grads is not None:
            grads = own_gradients(formula_id, grads, cotangent, read, getattr(adapter, "name", "the adapter"))
        if grads is None and diff and f.grad_of in out:
            got = autograd(out[f.grad_of], tensors, diff, cotangent)
            grads = {n: (g if g is not None else torch.zeros_like(tensors[n])) for n, g in zip(diff, got)}
            if unconnected is not None:
                unconnected.extend(n for n, g in zip(diff, got) if g is None)
    return out, grads or {}


def autograd(out, tensors: dict, names: list, cotangent=None) -> list:
    """The gradients of ``objective(out, mask, cotangent)`` with respect to ``tensors[name]`` for each of
    ``names``: a tensor, or None for an input the output has no autograd path to (all None when the
    output does not require grad at all: detached, or computed under no_grad)."""
    import torch

    obj = objective(out, tensors.get("mask"), cotangent)
    if not (isinstance(obj, torch.Tensor) and obj.requires_grad):
        return [None] * len(names)
    return list(torch.autograd.grad(obj, [tensors[n] for n in names], allow_unused=True))
