"""Expected-error cases: the spec's documented error conditions as golden data.

For every formula, starting from its first example case (valid inputs and parameters), one case per
documented error condition, each changing exactly one thing:

* every parameter with a range (spec parameter tables; the registry's ``Param``): a value just
  outside it (below ``lo`` or above ``hi``, the bound itself where it is open), and an unknown
  choice for a choice parameter;
* every pair of bounds that must be ordered (``*_min < *_max``, ``c_min <= c_max``, ``lower <= upper``):
  the two swapped;
* an unknown parameter name;
* inputs (spec/conventions.md, "Inputs"): a required input left out, ``mask`` with one row too few,
  a ragged [B,T] input (one row one token short), and NaN at an unmasked position of a real input.

Each case records the argument the error must name and the rule it breaks (``expect_error``); the
generator checks that the reference rejects the case with a ``SpecError`` whose message names the
argument, and stores that message.  An implementation passes such a case by raising (any exception);
returning numbers is a ``fail`` that quotes the rule.
"""

from __future__ import annotations

from pgspec.reference import REGISTRY

from . import Case

ORDERED_PAIRS = (("log_ratio_min", "log_ratio_max"), ("output_min", "output_max"), ("c_min", "c_max"),
                 ("lower", "upper"), ("kl_log_ratio_min", "kl_log_ratio_max"), ("kl_output_min", "kl_output_max"))
# (a recipe's is_c_min / is_c_max are only read, and so only checked, when is_level is not "none")


def _outside(p):
    """(value, what) just outside a parameter's range, or None when it has no finite bound."""
    out = []
    if p.kind in ("real", "int"):
        if p.lo is not None:
            v = p.lo if p.lo_open else p.lo - 1
            out.append((int(v) if p.kind == "int" else float(v), "below"))
        if p.hi is not None:
            v = p.hi if p.hi_open else p.hi + 1
            out.append((int(v) if p.kind == "int" else float(v), "above"))
    elif p.kind == "choice":
        out.append(("not-a-choice", "choice"))
    return out


def _base(cases: list) -> dict:
    """formula -> its first example case with literal inputs (else its first literal case)."""
    out = {}
    for c in cases:
        if isinstance(c.inputs, dict) and c.formula not in out and c.category == "example":
            out[c.formula] = c
    for c in cases:
        if isinstance(c.inputs, dict) and c.formula not in out and c.category != "error":
            out[c.formula] = c
    return out


def _first_bt(f, inputs, kind="real"):
    for i in f.inputs:
        if i.name in inputs and i.kind == kind and i.shapes and tuple(i.shapes[0])[:2] == ("B", "T") \
                and isinstance(inputs[i.name], list) and inputs[i.name] and isinstance(inputs[i.name][0], list):
            return i.name
    return None


def error_cases(cases: list) -> list[Case]:
    out = []
    for fid, base in _base(cases).items():
        f = REGISTRY[fid]
        inputs, params = base.inputs, dict(base.params)

        def add(slug, argument, rule, new_inputs=None, new_params=None, what=""):
            out.append(Case(f"{fid}/error-{slug}", fid, "error",
                            f"expected error: {what} (from {base.id}); the spec requires rejecting it: "
                            f"{argument}: {rule}",
                            new_inputs if new_inputs is not None else inputs,
                            new_params if new_params is not None else params,
                            expect_error={"argument": argument, "rule": rule}))

        for p in f.params:
            for value, side in _outside(p):
                add(f"{p.name.replace('_', '-')}-{side}", p.name, f"must be {p.range_text()}",
                    new_params={**params, p.name: value}, what=f"{p.name} = {value!r}")
        names = {p.name for p in f.params}
        for lo, hi in ORDERED_PAIRS:
            if lo in names and hi in names:
                add(f"{lo.replace('_', '-')}-above-{hi.replace('_', '-')}", lo, f"must be less than {hi}",
                    new_params={**params, lo: 2.0, hi: 1.0}, what=f"{lo} = 2 > {hi} = 1")
        add("unknown-parameter", "no_such_parameter", "unknown parameter",
            new_params={**params, "no_such_parameter": 1}, what="an unknown parameter")
        required = [i.name for i in f.inputs if not i.optional and i.name in inputs]
        if required:
            name = required[0]
            add(f"missing-{name.replace('_', '-')}", name, "required input",
                new_inputs={k: v for k, v in inputs.items() if k != name}, what=f"input {name} left out")
        if fid.startswith("loss.") and "logprobs" in inputs:
            beta = params.get("beta", next(p.default for p in f.params if p.name == "beta"))
            if float(beta) > 0 and "ref_logprobs" in inputs:
                add("missing-ref-logprobs-for-kl", "ref_logprobs", "required when beta > 0",
                    new_inputs={k: v for k, v in inputs.items() if k != "ref_logprobs"},
                    what=f"beta = {beta} without ref_logprobs")
            elif float(beta) == 0 and "ref_logprobs" not in inputs:
                add("unread-ref-logprobs", "ref_logprobs", "an input no enabled option reads is an error",
                    new_inputs={**inputs, "ref_logprobs": inputs["logprobs"]},
                    what="ref_logprobs given with beta = 0")
        mask = inputs.get("mask")
        if isinstance(mask, list) and len(mask) > 1:
            add("mask-rows", "mask", "shape [B,T] like the other inputs",
                new_inputs={**inputs, "mask": mask[:-1]}, what="mask with one row too few")
        bt = _first_bt(f, inputs)
        if bt is not None and len(inputs[bt][0]) > 1:
            ragged = [list(inputs[bt][0][:-1])] + [list(r) for r in inputs[bt][1:]]
            add(f"ragged-{bt.replace('_', '-')}", bt, "rows of equal length (shape [B,T])",
                new_inputs={**inputs, bt: ragged}, what=f"{bt} with a first row one token short")
        if bt is not None and isinstance(mask, list):
            pos = next(((b, t) for b, row in enumerate(mask) for t, m in enumerate(row) if m), None)
            if pos is not None:
                dirty = [list(r) for r in inputs[bt]]
                dirty[pos[0]][pos[1]] = "nan"
                add(f"nan-unmasked-{bt.replace('_', '-')}", bt, "finite where mask is true",
                    new_inputs={**inputs, bt: dirty}, what=f"NaN in {bt} at the unmasked position {list(pos)}")
    return out
