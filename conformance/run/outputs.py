"""An adapter's outputs and gradients checked against the formula's declaration before any comparison:
a dict of tensors of the declared names, shapes and dtypes (MalformedOutput, the case's error), and
the float16 inexactness of a case's inputs.
"""

from __future__ import annotations

from pgspec.reference import REGISTRY

class MalformedOutput(Exception):
    """An adapter's result that is not what the spec declares (type, shape, dtype): the case's error."""


# Real outputs and gradients must be floating tensors of the run's dtype; for the 16-bit storage
# dtypes the spec's compute dtype (float32, spec/tolerance.md) is accepted as well.
# The floating dtypes an output may have in a run of each dtype: the run's own, float32 in the 16-bit
# runs (which compute in float32), and a lower precision than the run's (a framework that computes in
# float32 whatever its inputs is judged by its numbers against the run's bound, and declares that).
# A higher precision than the run's is refused: the adapter would not be testing the dtype it claims.
ACCEPTED_DTYPES = {"float64": ("float64", "float32", "bfloat16", "float16"),
                   "float32": ("float32", "bfloat16", "float16"),
                   "bfloat16": ("bfloat16", "float32"),
                   "float16": ("float16", "float32")}


def _nested_shape(x) -> tuple:
    return (len(x),) + (_nested_shape(x[0]) if x else ()) if isinstance(x, list) else ()


def _input_dims(f, tensors: dict) -> dict:
    dims = {}
    for spec in f.inputs:
        t = tensors.get(spec.name)
        if t is None:
            continue
        for candidate in spec.shapes:
            if len(candidate) == t.dim():
                for sym, n in zip(candidate, t.shape):
                    if not isinstance(sym, int):
                        dims.setdefault(sym, int(n))
                break
    return dims


def _describe_tensor(key: str, got, expected_shape: tuple, dtype: str, real: bool, where: str,
                     device: str | None = None) -> str | None:
    import torch

    if not isinstance(got, torch.Tensor):
        return (f"{where} {key!r} must be a torch.Tensor of shape {list(expected_shape)}, "
                f"got {type(got).__name__} {_short(got)}")
    if got.layout != torch.strided:
        return f"{where} {key!r} must be a dense (strided) tensor, got layout {str(got.layout).removeprefix('torch.')}"
    if device is not None and got.device.type != device:
        return f"{where} {key!r} must be on the run's device {device}, got a tensor on {got.device}"
    if tuple(got.shape) != tuple(expected_shape):
        return f"{where} {key!r} must have shape {list(expected_shape)}, got shape {list(got.shape)}"
    if real:
        accepted = ACCEPTED_DTYPES.get(dtype, (dtype,))
        name = str(got.dtype).removeprefix("torch.")
        if not got.is_floating_point() or name not in accepted:
            return (f"{where} {key!r} must be a floating tensor of dtype {' or '.join(accepted)} "
                    f"(the run's dtype is {dtype}), got dtype {name}")
    return None


def _short(x) -> str:
    try:
        text = repr(x)
        if not isinstance(text, str):
            raise TypeError
    except Exception:  # noqa: BLE001 - an adapter's object whose repr() raises
        return f"<{type(x).__name__} whose repr() raised>"
    return text if len(text) <= 60 else text[:57] + "..."


def check_outputs(f, case: dict, dtype: str, tensors: dict, out) -> None:
    """Raise MalformedOutput unless ``out`` is a dict whose outputs (those the case compares and the
    adapter produced) are tensors of the declared shape and, for real outputs, a floating dtype of
    the run (ACCEPTED_DTYPES)."""
    import torch

    if not isinstance(out, dict):
        raise MalformedOutput(f"the adapter returned {type(out).__name__} {_short(out)}; expected a dict of "
                              f"output name -> tensor ({', '.join(o.name for o in f.outputs)})")
    accepted = _accepted(dtype)
    device = _device_of(tensors)
    for name, real, expected, spec_shape in _expected_outputs(f, case, tensors):
        got = out.get(name)
        if got is None:
            continue
        if isinstance(got, torch.Tensor) and got.shape == expected and (not real or got.dtype in accepted) \
                and got.layout == torch.strided and (device is None or got.device.type == device):
            continue        # what _describe_tensor accepts, decided without building its message
        problem = _describe_tensor(name, got, expected, dtype, real, "output", device)
        if problem:
            raise MalformedOutput(problem + _dims_text(spec_shape, _input_dims(f, tensors)))
    if "grad" in out and out["grad"] is not None and not isinstance(out["grad"], dict):
        raise MalformedOutput(f"the adapter's 'grad' must be a dict of input name -> tensor, got "
                              f"{type(out['grad']).__name__} {_short(out['grad'])}")


# The shapes check_outputs expects of a case's outputs depend on the case and its inputs' shapes
# only: computed once per case (for every dtype), and again if the inputs' shapes differ.
_EXPECTED: dict = {}


def _expected_outputs(f, case: dict, tensors: dict) -> list:
    """[(name, real, expected shape, spec shape)] of the outputs the case compares, in the spec's order."""
    shapes = tuple((name, tuple(t.shape)) for name, t in tensors.items())
    hit = _EXPECTED.get(id(case))
    if hit is not None and hit[0] is case and hit[1] is f and hit[2] == shapes:
        return hit[3]
    dims = _input_dims(f, tensors)
    positions = case.get("positions")
    plan = []
    for o in f.outputs:
        if o.name not in case["outputs"]:
            continue
        ref = case["outputs"][o.name]
        if positions is not None and tuple(o.shape[:2]) == ("B", "T") and all(s in dims for s in o.shape):
            expected = tuple(dims[s] for s in o.shape)
        elif all(isinstance(s, int) or s in dims for s in o.shape):
            expected = tuple(s if isinstance(s, int) else dims[s] for s in o.shape)
        else:  # a dimension no input fixes (chunks, segments): the reference's own shape
            expected = _nested_shape(ref)
        plan.append((o.name, o.kind == "real", expected, o.shape))
    if len(_EXPECTED) > 20000:
        _EXPECTED.clear()
    _EXPECTED[id(case)] = (case, f, shapes, plan)
    return plan


_ACCEPTED: dict = {}


def _accepted(dtype: str) -> frozenset:
    """The torch dtypes ACCEPTED_DTYPES allows a real output or gradient of a ``dtype`` run."""
    hit = _ACCEPTED.get(dtype)
    if hit is None:
        import torch

        hit = _ACCEPTED[dtype] = frozenset(getattr(torch, name) for name in ACCEPTED_DTYPES.get(dtype, (dtype,))
                                           if isinstance(getattr(torch, name, None), torch.dtype))
    return hit


def check_grads(f, dtype: str, tensors: dict, grads) -> None:
    """Raise MalformedOutput unless every gradient has its input's shape and a floating dtype of the run."""
    import torch

    accepted = _accepted(dtype)
    device = _device_of(tensors)
    for name, g in (grads or {}).items():
        if name not in tensors or g is None:
            continue
        if isinstance(g, torch.Tensor) and g.shape == tensors[name].shape and g.dtype in accepted \
                and g.layout == torch.strided and (device is None or g.device.type == device):
            continue        # what _describe_tensor accepts, decided without building its message
        problem = _describe_tensor(f"grad.{name}", g, tuple(tensors[name].shape), dtype, True, "gradient", device)
        if problem:
            raise MalformedOutput(problem + f" (the shape of input {name!r})")


def _device_of(tensors: dict) -> str | None:
    """The device type (cpu, cuda) of the case's input tensors: where its outputs must be too."""
    for t in tensors.values():
        device = getattr(t, "device", None)
        if device is not None:
            return device.type
    return None


def _dims_text(shape: tuple, dims: dict) -> str:
    named = [f"{s}={dims[s]}" for s in shape if not isinstance(s, int) and s in dims]
    return f" (spec shape [{','.join(map(str, shape))}] with {', '.join(named)})" if named else ""


def float16_inexact(case: dict) -> str:
    """Why a float16 run cannot take this case ("" when it can).

    Golden inputs are exactly representable in bfloat16, whose exponent range is wider than
    float16's: a value beyond 65504 becomes inf, and one below float16's subnormals loses
    precision or becomes 0.  Such a case is not applicable to a float16 run (positions where the
    mask is false are not read by any formula and are not checked)."""
    from ..corpus.inputs import case_inputs

    import numpy as np

    f = REGISTRY[case["formula"]]
    inputs = case_inputs(case)
    mask = inputs.get(f.mask_input) if f.mask_input else None
    mask_arr = np.asarray(mask, dtype=bool) if mask is not None else None
    for name, value in inputs.items():
        if f.input(name).kind != "real" or value is None:
            continue
        try:
            x = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):  # not a rectangular array of numbers: the run reports it
            continue
        with np.errstate(over="ignore", under="ignore"):
            y = x.astype(np.float16).astype(np.float64)
        bad = ~((y == x) | (np.isnan(x) & np.isnan(y)))
        if mask_arr is not None and name != f.mask_input and x.shape[:2] == mask_arr.shape:
            bad &= mask_arr.reshape(mask_arr.shape + (1,) * (x.ndim - 2))
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0])
            where = "".join(f"[{i}]" for i in idx)
            became = "inf" if np.isinf(y[idx]) else repr(float(y[idx]))
            return (f"not applicable to float16: input {name}{where} = {float(x[idx])!r} is exact in bfloat16 but "
                    f"not in float16 (it becomes {became}); float16's exponent range is narrower than bfloat16's")
    return ""
