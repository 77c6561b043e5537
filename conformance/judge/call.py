"""The call convention: how an adapter's formula is called on inputs (``to_tensors``, the adapter's
``call``, and the gradients of the unmasked sum of the ``grad_of`` output, ``objective``), so that the
runner, every property and `pgspec check` call adapters the same way."""

from __future__ import annotations

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


def objective(out, mask):
    """Sum of the unmasked elements of the grad_of output (masked ones selected away, never x 0)."""
    import torch

    if mask is not None and out.dim() >= 2 and tuple(out.shape[:2]) == tuple(mask.shape):
        m = mask.reshape(mask.shape + (1,) * (out.dim() - 2))
        out = torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out.sum()


def call(adapter, formula_id: str, tensors: dict, params: dict, unconnected: list | None = None):
    """(outputs, gradients) of the adapter's formula on ``tensors``: the adapter's own gradients
    when it returns them (``out["grad"]``), else autograd of ``objective`` of the ``grad_of``
    output with respect to every differentiable input given (zeros where unused; the names of
    those inputs are appended to ``unconnected`` when a list is given)."""
    import torch

    f = REGISTRY[formula_id]
    with torch.enable_grad():
        out = adapter.call(formula_id, tensors, dict(params))
        grads = out.get("grad")
        diff = [n for n in f.differentiable if n in tensors]
        if grads is None and diff and f.grad_of in out:
            got = autograd(out[f.grad_of], tensors, diff)
            grads = {n: (g if g is not None else torch.zeros_like(tensors[n])) for n, g in zip(diff, got)}
            if unconnected is not None:
                unconnected.extend(n for n, g in zip(diff, got) if g is None)
    return out, grads or {}


def autograd(out, tensors: dict, names: list) -> list:
    """The gradients of ``objective(out)`` with respect to ``tensors[name]`` for each of ``names``: a
    tensor, or None for an input the output has no autograd path to (all None when the output does
    not require grad at all: detached, or computed under no_grad)."""
    import torch

    obj = objective(out, tensors.get("mask"))
    if not (isinstance(obj, torch.Tensor) and obj.requires_grad):
        return [None] * len(names)
    return list(torch.autograd.grad(obj, [tensors[n] for n in names], allow_unused=True))
