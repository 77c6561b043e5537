"""The formula registry: every formula's ID, inputs, parameters, outputs and provenance.

A formula module declares each formula with the ``@formula`` decorator.  The metadata is data:
``pgspec formulas --json`` prints it, the golden generator and the runner read it, and
``evaluate`` validates every call against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ._errors import SpecError

# Canonical input names (DESIGN section 7).  A formula may only use these names.
CANONICAL_INPUTS = {
    "logprobs": "current policy log-probs of the realized tokens",
    "old_logprobs": "trainer's log-probs at sampling time (old policy)",
    "sampler_logprobs": "inference engine's log-probs at sampling time",
    "ref_logprobs": "reference policy log-probs",
    "mask": "bool, true where the token counts",
    "advantages": "per-sequence [B] or per-token [B,T] advantages",
    "rewards": "per-sequence scalar rewards",
    "group_ids": "prompt-group id of each sequence",
    "document_ids": "document id of each token in a packed row",
    "values": "the per-token quantity an agg.* formula reduces",
    "logits": "unnormalized scores over the vocabulary",
    "targets": "realized token ids",
    "entropy": "per-token entropy of the current policy",
}


@dataclass(frozen=True)
class Input:
    """One input of a formula.

    ``shapes`` lists the accepted shapes, each a tuple of dimension symbols (``B``, ``T``, ``V``)
    or fixed integers.  ``kind`` is ``real`` (numbers), ``bool`` or ``int``.  Real inputs may hold
    NaN or +-inf only at positions where the formula's ``mask`` is false.
    """

    name: str
    shapes: tuple
    kind: str = "real"
    optional: bool = False
    doc: str = ""

    def to_json(self):
        return {
            "name": self.name,
            "shapes": [list(s) for s in self.shapes],
            "kind": self.kind,
            "optional": self.optional,
            "doc": self.doc or CANONICAL_INPUTS.get(self.name, ""),
        }


@dataclass(frozen=True)
class Param:
    """One parameter: its default and its allowed range.

    ``kind``: ``real``, ``int``, ``bool`` or ``choice``.  For numbers, ``lo``/``hi`` bound the
    range and ``lo_open``/``hi_open`` say whether the bound itself is excluded.  ``nullable``
    means ``None`` is allowed (it always means "off" and is explained in ``doc``).
    """

    name: str
    default: Any
    kind: str = "real"
    lo: Any = None
    hi: Any = None
    lo_open: bool = False
    hi_open: bool = False
    choices: tuple = ()
    nullable: bool = False
    doc: str = ""

    def range_text(self) -> str:
        if self.kind == "bool":
            return "true or false" + (" or null" if self.nullable else "")
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        left = "(" if self.lo_open or self.lo is None else "["
        right = ")" if self.hi_open or self.hi is None else "]"
        lo = "-inf" if self.lo is None else _fmt(self.lo)
        hi = "+inf" if self.hi is None else _fmt(self.hi)
        text = f"{'integer' if self.kind == 'int' else 'real'} in {left}{lo}, {hi}{right}"
        return text + (" or null" if self.nullable else "")

    def to_json(self):
        return {
            "name": self.name,
            "default": self.default,
            "kind": self.kind,
            "range": self.range_text(),
            "lo": self.lo,
            "hi": self.hi,
            "lo_open": self.lo_open,
            "hi_open": self.hi_open,
            "choices": list(self.choices),
            "nullable": self.nullable,
            "doc": self.doc,
        }

    def check(self, formula_id: str, value):
        """Return the validated value, or raise SpecError naming the parameter and its range."""
        where = f"{formula_id}: parameter {self.name!r}"
        if value is None:
            if self.nullable:
                return None
            raise SpecError(f"{where} must be {self.range_text()}, got None")
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise SpecError(f"{where} must be true or false, got {value!r}")
            return value
        if self.kind == "choice":
            if value not in self.choices:
                raise SpecError(f"{where} must be {self.range_text()}, got {value!r}")
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) and not _is_mpf(value):
            raise SpecError(f"{where} must be {self.range_text()}, got {value!r}")
        if self.kind == "int":
            if not isinstance(value, int):
                raise SpecError(f"{where} must be {self.range_text()}, got {value!r}")
            number = value
        else:
            number = _as_real(value, where, self.range_text())
        if self.lo is not None and (number < self.lo or (self.lo_open and number == self.lo)):
            raise SpecError(f"{where} must be {self.range_text()}, got {value!r}")
        if self.hi is not None and (number > self.hi or (self.hi_open and number == self.hi)):
            raise SpecError(f"{where} must be {self.range_text()}, got {value!r}")
        return value


def _is_mpf(x):
    from mpmath import mpf

    return isinstance(x, mpf)


def _as_real(value, where, expected):
    from mpmath import mpf

    try:
        number = mpf(value)
    except (TypeError, ValueError):
        raise SpecError(f"{where} must be {expected}, got {value!r}") from None
    if number != number or number in (mpf("inf"), mpf("-inf")):
        raise SpecError(f"{where} must be {expected} (finite), got {value!r}")
    return number


def _fmt(x):
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


@dataclass(frozen=True)
class Output:
    name: str
    shape: tuple
    kind: str = "real"
    doc: str = ""

    def to_json(self):
        return {"name": self.name, "shape": list(self.shape), "kind": self.kind, "doc": self.doc}


@dataclass(frozen=True)
class Formula:
    id: str
    family: str
    title: str
    func: Callable
    inputs: tuple
    params: tuple
    outputs: tuple
    differentiable: tuple
    grad_of: str | None
    spec: str
    references: tuple
    stop_gradients: tuple = field(default_factory=tuple)
    mask_input: str | None = "mask"

    def input(self, name):
        for i in self.inputs:
            if i.name == name:
                return i
        raise KeyError(name)

    def to_json(self):
        return {
            "id": self.id,
            "family": self.family,
            "title": self.title,
            "inputs": [i.to_json() for i in self.inputs],
            "params": [p.to_json() for p in self.params],
            "outputs": [o.to_json() for o in self.outputs],
            "differentiable": list(self.differentiable),
            "grad_of": self.grad_of,
            "stop_gradients": list(self.stop_gradients),
            "spec": self.spec,
            "references": list(self.references),
        }


REGISTRY: dict[str, Formula] = {}

FAMILIES = ("logprob", "ratio", "surrogate", "is", "mask", "kl", "agg", "adv", "dist", "loss")


def formula(
    id: str,
    *,
    title: str,
    inputs,
    params=(),
    outputs,
    differentiable=(),
    grad_of=None,
    stop_gradients=(),
    references=(),
    mask_input="mask",
):
    """Register the decorated function as formula ``id`` (see DESIGN section 2)."""

    family = id.split(".", 1)[0]
    if family not in FAMILIES:
        raise ValueError(f"formula {id!r}: unknown family {family!r}")
    if id in REGISTRY:
        raise ValueError(f"formula {id!r} registered twice")
    for i in inputs:
        if i.name not in CANONICAL_INPUTS:
            raise ValueError(f"formula {id!r}: input {i.name!r} is not a canonical input name")
    names = {i.name for i in inputs}
    for d in differentiable:
        if d not in names:
            raise ValueError(f"formula {id!r}: differentiable input {d!r} is not an input")
    if differentiable and grad_of is None:
        raise ValueError(f"formula {id!r}: differentiable inputs need grad_of")
    for p in params:
        if p.default is not None or not p.nullable:
            p.check(id, p.default)

    def register(func):
        REGISTRY[id] = Formula(
            id=id,
            family=family,
            title=title,
            func=func,
            inputs=tuple(inputs),
            params=tuple(params),
            outputs=tuple(outputs),
            differentiable=tuple(differentiable),
            grad_of=grad_of,
            spec=f"spec/{family}.md#{id}",
            references=tuple(references),
            stop_gradients=tuple(stop_gradients),
            mask_input=mask_input if mask_input in names else None,
        )
        func.formula_id = id
        return func

    return register


def get(formula_id: str) -> Formula:
    try:
        return REGISTRY[formula_id]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise SpecError(f"unknown formula ID {formula_id!r}; known IDs: {known}") from None


__all__ = ["Input", "Param", "Output", "Formula", "REGISTRY", "FAMILIES", "formula", "get"]
