"""The adapter protocol (DESIGN section 7).

An adapter maps formula IDs to callables over torch tensors in one canonical layout: padded
[B, T] tensors with a boolean ``mask``, per-sequence tensors of shape [B], parameters by their
spec names.  Each callable returns a dict of output tensors named as the spec's outputs; the
runner differentiates the spec's ``grad_of`` output itself, as the vector-Jacobian product with the
case's cotangent c (the sum over its unmasked elements of c_i * out_i; spec/golden-format.md,
"Cotangent"), so a callable only has to be differentiable the way the framework is.  A callable may
instead return ``"grad"``: {input name: tensor} when the framework computes gradients its own way (a
fused backward kernel, say).  That gradient must be the same VJP: for a scalar ``grad_of`` output
(a loss) return the gradient of the output itself and the runner multiplies it by c (exact); for a
per-token output read c with ``current_cotangent(like=output)`` (a tensor shaped like the output,
ones when no caller set one) and return the VJP with it.  An own gradient of a per-token output
returned without reading ``current_cotangent()`` is an error, never judged as the VJP of ones; an
adapter that reads it for a scalar output returns the gradient already multiplied by c.

What an adapter knows about its framework's differences from the spec lives in
``adapters/<name>/deviations.toml``: ``[[unsupported]]`` formulas, ``[[capability]]`` parameter
domains and ``[[rule]]`` root causes.  The format, the classification order and the policy are
normative: spec/verdicts.md; the reader is ``pgspec.conformance.verdicts.declarations``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar

# the cotangent of the call in progress (documented above), set by pgspec around adapter.call; an
# adapter that calls one of its own formulas for a read-out (not for the case's gradient) wraps that
# call in ``with cotangent_context(None):`` so that the inner call sees ones
from pgspec.conformance.judge.call import cotangent_context, current_cotangent  # noqa: F401


class Unsupported(Exception):
    """The adapter lacks a formula (or dtype) the property needs (raised by an adapter's formula,
    or by a property; also importable as ``pgspec.conformance.properties.Unsupported``)."""


# The token losses that `pgspec check --vocab V` computes from hidden states and an LM head
# (conformance/check/head_loss.py HEAD_PROTOCOL): the formulas an adapter's fused ``heads`` may hold.
HEAD_LOSS_FORMULAS = ("loss.grpo", "loss.bnpo", "loss.dr_grpo", "loss.dapo", "loss.cispo", "loss.gspo", "loss.luspo",
                      "loss.sapo", "loss.vespo")


def load_deviations(path: Path):
    """Read and check an adapter's declarations file (spec/verdicts.md)."""
    from pgspec.conformance.verdicts.declarations import load

    return load(path)


def spec_param(params: dict, fid: str, name: str):
    """Parameter ``name`` of formula ``fid`` as a framework's config holds it: the case's value or the
    registry default; null and booleans as they are, numbers (and decimal strings) as Python floats,
    other strings (choices) as they are."""
    from pgspec.reference import REGISTRY

    if name in params:
        value = params[name]
    else:
        value = next(p.default for p in REGISTRY[fid].params if p.name == name)
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return float(value)


def _no_declarations():
    from pgspec.conformance.verdicts.declarations import Declarations

    return Declarations()


@dataclass
class Adapter:
    """What an adapter declares.  Subclasses fill ``implementations`` and may override hooks."""

    name: str
    framework: str
    version: str
    devices: tuple = ("cpu",)
    dtypes: tuple = ("float64", "float32", "bfloat16")
    implementations: dict[str, Callable] = field(default_factory=dict)
    # spec parameter name -> the framework's config name, per formula ID (documentation + reports)
    param_map: dict[str, dict[str, str]] = field(default_factory=dict)
    # the declarations file: unsupported formulas, capabilities and root-cause rules
    deviations: object = field(default_factory=_no_declarations)
    # the modules whose code is the framework's (dotted prefixes: "trl", "liger_kernel"): an
    # expected-error case counts as rejected only when the exception is raised there (the innermost
    # frame of the framework, the adapter or pgspec; spec/verdicts.md, "Validation"), or by an
    # adapter check that a [[check]] declaration names.  Empty: nothing counts as the framework's.
    framework_modules: ClassVar[tuple] = ()

    def capabilities(self) -> set[str]:
        return set(self.implementations)

    def available(self) -> tuple[bool, str]:
        """(True, "") when the framework can run here, else (False, why)."""
        return True, ""

    def device_available(self, device: str) -> tuple[bool, str]:
        import torch

        if device not in self.devices:
            return False, f"adapter {self.name!r} supports devices {', '.join(self.devices)}, not {device!r}"
        if device == "cuda" and not torch.cuda.is_available():
            return False, "no CUDA device is available on this machine"
        return True, ""

    def call(self, formula_id: str, inputs: dict, params: dict) -> dict:
        return self.implementations[formula_id](inputs, params)

    @property
    def declarations(self):
        return self.deviations
