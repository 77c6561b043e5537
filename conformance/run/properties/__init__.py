"""Property checks (DESIGN section 8, spec/properties.md): invariances every implementation must keep.

Each property has an ID (``prop.<name>``), a spec anchor, and the formula IDs it applies to
(computed from the registry at run time, so new ``loss.*`` recipes are covered when they land).
It is checked two ways:

- on the **reference** with hypothesis (``check_reference``): examples drawn from
  ``pgspec.conformance.strategies``, the invariance asserted at the working precision (agreement
  to 40 significant digits, or exactly for booleans);
- on an **adapter** (``run_properties``) with a *fixed* set of examples made from seeded sources
  (the same on every run and machine), the adapter's formulas called the way the runner calls them
  (``runner.to_tensors``, ``adapter.call``, autograd of the unmasked sum of ``grad_of``) and every
  number compared with the tolerance model (spec/tolerance.md) against the reference evaluated on
  the very inputs the adapter saw.  A property passes when every example does; a failure names
  the property, the formula, the first falsifying example (JSON) and a copy-paste repro.

Adapters expose formula IDs only, so each property is stated in terms of formula calls (for
example the CP rank sum is: the adapter's ``dist.cp_reduce`` partials, and its aggregator evaluated
on each rank's tokens with the whole batch's denominators, add up to the reference's cp = 1 value).

The package has one module per property (``padding``, ``permutation``, ``group_relabel``,
``cp_rank_sum``, ``accumulation``, ``opsm``, ``length_independence``, ``on_policy``, ``clamp``,
``gradient_fd``), each defining ``PROPERTY``; ``_common`` holds what they share.  Adapters are
called and results compared through ``pgspec.conformance.judge.compare``, the module the runner uses.

Owns: the property checks, one module per property, and ``_common`` (examples, calls, comparisons).
May import: what the run may import (pgspec.adapters, the verdicts, the judge, the corpus, the base,
pgspec.reference); never the check or the edges.
Add a property: a module here with its ``Property`` entries, listed in ``PROPERTIES`` below, and its
text in spec/properties.md (its anchor, the formulas it applies to, what it asserts).
"""

from __future__ import annotations

import fnmatch
import json
import math
import traceback
import zlib

from pgspec.reference import dist as ref_dist  # noqa: F401 - re-exported (tests)

from ...corpus import strategies as pst
from . import cp_rank_sum, accumulation, opsm, length_independence, on_policy, padding, permutation, group_relabel, clamp, gradient_fd
from ._common import (  # noqa: F401 - the public names of the former single module
    BASE_PARAMS, EXCLUDED, FIXED_EXAMPLES, OUTCOMES, REF_DIGITS, SPEC_PAGE, Ctx, Falsified, NotAdmitted, Property,
    PropertyResult, Unsupported, call, compare, compare_to_ref, decode, encode, formula_example, input_fields, ref)
from .accumulation import MEGATRON_7452, naive_difference  # noqa: F401
from .clamp import CLAMP_PARAMS  # noqa: F401
from .cp_rank_sum import AGGREGATORS, _cp_reference, full_denominator_params, recipe_aggregator  # noqa: F401
from .length_independence import COLLAPSING, GEOMETRIC  # noqa: F401
from .on_policy import ON_POLICY  # noqa: F401
from .opsm import _opsm_extra  # noqa: F401

# The registry, in the order results are reported
PROPERTIES: dict[str, Property] = {m.PROPERTY.id: m.PROPERTY for m in (cp_rank_sum, accumulation, opsm, length_independence, on_policy, padding, permutation, group_relabel, clamp, gradient_fd)}


def fixed_examples(prop_id: str, fid: str, n: int = FIXED_EXAMPLES) -> list[dict]:
    """The fixed examples ``run_properties`` uses: ``n`` drawn from seeded sources (seed = CRC-32
    of "<property>/<formula>/<k>"), then the property's hand-made ones.  Identical on every run."""
    return [ex for _, ex, _ in _fixed_entries(prop_id, fid, n)]


def _seeded(prop_id: str, fid: str, seed: int, refused: frozenset = frozenset()):
    """(the example the seeded source builds, the options it drew); ``refused``: options not drawn."""
    src = pst.SeededSource(seed)
    src.refused_options = refused
    ex = PROPERTIES[prop_id].build(src, fid)
    return ex, frozenset(getattr(src, "drawn_options", ()))


def _fixed_entries(prop_id: str, fid: str, n: int = FIXED_EXAMPLES) -> list[tuple]:
    """(seed or None for a hand-made example, example, options drawn) for each fixed example."""
    out = []
    for k in range(n):
        seed = zlib.crc32(f"{prop_id}/{fid}/{k}".encode())
        ex, drawn = _seeded(prop_id, fid, seed)
        out.append((seed, ex, drawn))
    return out + [(None, decode(e), frozenset()) for e in PROPERTIES[prop_id].extra_examples(fid)]


_FIXED_CACHE: dict = {}


def _fixed(prop_id, fid):
    key = (prop_id, fid)
    if key not in _FIXED_CACHE:
        _FIXED_CACHE[key] = _fixed_entries(prop_id, fid)
    return _FIXED_CACHE[key]


def _redrawn(prop_id, fid, seed, refused):
    """The seeded example drawn again without the ``refused`` options (cached, like the others)."""
    key = (prop_id, fid, seed, refused)
    if key not in _FIXED_CACHE:
        _FIXED_CACHE[key] = _seeded(prop_id, fid, seed, refused)
    return _FIXED_CACHE[key]


def check_reference(prop_id: str, formulas=None, **hypothesis_settings):
    """Check property ``prop_id`` on the reference with hypothesis, for each applicable formula
    (or those given).  Settings default to the CI profile: derandomize=True, max_examples=5,
    no deadline, no example database.  Raises on the first falsifying example."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    prop = PROPERTIES[prop_id]
    chosen = prop.formulas if formulas is None else tuple([formulas] if isinstance(formulas, str) else formulas)
    s = dict(derandomize=True, max_examples=5, deadline=None, database=None,
             suppress_health_check=list(HealthCheck))
    s.update(hypothesis_settings)
    def make(fid):
        @settings(**s)
        @given(st.data())
        def run(data):
            example = prop.build(pst.DrawSource(data.draw), fid)
            prop.reference(fid, example)

        return run

    for fid in chosen:
        make(fid)()
        for extra in prop.extra_examples(fid):
            prop.reference(fid, decode(extra))


def check_example(adapter, prop_id: str, fid: str, example: dict, dtype: str = "float64", device: str = "cpu",
                  adapter_spec: str | None = None, *, decoded: bool = False) -> PropertyResult:
    """Run one property on one example (JSON form accepted) for an adapter: the repro entry point.
    ``decoded=True``: the example is already decoded (the fixed ones: kept as the same objects, so
    their reference evaluations are found again for the next dtype)."""
    prop = PROPERTIES[prop_id]
    example = example if decoded else decode(example)
    ctx = Ctx(adapter, dtype, device)
    res = PropertyResult(prop_id, fid, dtype, device, "pass", examples=1)
    try:
        prop.adapter(ctx, fid, example)
        res.error_ratio = ctx.worst
    except NotAdmitted as e:
        # outside the adapter's declared capabilities: not applicable, as a golden case would be
        res.outcome, res.message = "not-applicable", str(e)
        res.declaration, res.refused = e.declaration.summary(), list(e.params)
    except Unsupported as e:
        res.outcome, res.message = "unsupported", str(e)
    except Falsified as e:
        res.outcome, res.message, res.error_ratio = "fail", f"{prop_id}: {e}", math.inf
        res.example = encode(example)
        res.repro = repro_snippet(adapter_spec or adapter.name, prop_id, fid, example, dtype, device)
    except Exception as e:  # noqa: BLE001 - a crash of the implementation is an outcome
        from ..origin import exception_record

        res.outcome, res.message = "error", traceback.format_exc(limit=-6)
        res.exception = exception_record(e, adapter)
        res.example = encode(example)
        res.repro = repro_snippet(adapter_spec or adapter.name, prop_id, fid, example, dtype, device)
    return res


def planned(formulas_glob: str = "*", properties: str = "*") -> list[tuple[str, str]]:
    """The (property, formula) pairs ``run_properties`` checks for these globs, in its order: one
    result each per dtype (what `pgspec run`'s progress bar counts before it runs them)."""
    globs = [g.strip() for g in formulas_glob.split(",") if g.strip()]
    pglobs = [g.strip() for g in properties.split(",") if g.strip()]
    return [(pid, fid) for pid, prop in PROPERTIES.items() if any(fnmatch.fnmatchcase(pid, g) for g in pglobs)
            for fid in prop.formulas if any(fnmatch.fnmatchcase(fid, g) for g in globs)]


def run_properties(adapter, dtype: str, device: str, formulas_glob: str = "*", *, properties: str = "*",
                   adapter_spec: str | None = None) -> list[PropertyResult]:
    """Every property on every applicable formula matching ``formulas_glob`` (comma-separated
    globs over formula IDs), on the fixed examples: one PropertyResult per (property, formula)."""
    results = []
    for pid, fid in planned(formulas_glob, properties):
        prop = PROPERTIES[pid]
        res = PropertyResult(pid, fid, dtype, device, "pass", error_ratio=0.0)
        skipped = []            # the examples outside the adapter's capabilities (their results)
        for seed, ex, drawn in _fixed(pid, fid):
            one = _with_admitted_options(adapter, pid, fid, seed, ex, drawn, dtype, device, adapter_spec)
            if one.outcome in ("not-applicable", "unsupported"):
                skipped.append(one)     # an example the adapter cannot take: the others still run
                continue
            res.examples += 1
            if one.outcome != "pass":
                one.examples = res.examples
                res = one
                break
            res.error_ratio = max(res.error_ratio or 0.0, one.error_ratio or 0.0)
        if res.outcome == "pass" and not res.examples and skipped:
            # no example the adapter can take: the row is unsupported (the adapter refused) or not
            # applicable (its declared capabilities do), as its golden cases would be
            res = skipped[0]
            if len(skipped) > 1:
                res.message = f"all {len(skipped)} example(s) are outside what the adapter takes: {res.message}"
            res.example = res.repro = None
        elif res.outcome == "pass":
            left_out = (f" ({len(skipped)} more outside what the adapter takes: {skipped[0].message})"
                        if skipped else "")
            res.message = f"{res.examples} example(s){left_out}; {prop.title}"
        results.append(res)
    return results


def _with_admitted_options(adapter, pid, fid, seed, ex, drawn, dtype, device, adapter_spec) -> PropertyResult:
    """``check_example`` on a fixed example; when the adapter's declarations refuse an option the
    example drew (or the adapter raises Unsupported on an example with drawn options), the example
    is drawn again from its seed without that option (without all of them when the refusal names
    none), until the adapter takes it or no drawn option is left (spec/properties.md, "Options and
    capabilities")."""
    one = check_example(adapter, pid, fid, ex, dtype, device, adapter_spec, decoded=True)
    refused = frozenset()
    while one.outcome in ("not-applicable", "unsupported") and seed is not None and drawn - refused:
        named = (drawn - refused) & set(one.refused or ())
        refused |= named or drawn
        ex, drawn = _redrawn(pid, fid, seed, refused)
        one = check_example(adapter, pid, fid, ex, dtype, device, adapter_spec, decoded=True)
    return one


def repro_snippet(adapter: str, prop_id: str, fid: str, example: dict, dtype: str, device: str) -> str:
    data = json.dumps(encode(example), sort_keys=True)
    return (
        "import json\n"
        "from pgspec.conformance.properties import check_example\n"
        "from pgspec.conformance.run.runner import load_adapter\n"
        f"adapter = load_adapter({adapter!r})\n"
        f"example = json.loads({data!r})\n"
        f"print(check_example(adapter, {prop_id!r}, {fid!r}, example, {dtype!r}, {device!r}))\n"
    )


__all__ = ["PROPERTIES", "Property", "PropertyResult", "check_reference", "run_properties", "check_example",
           "fixed_examples", "formula_example", "recipe_aggregator", "full_denominator_params", "naive_difference",
           "ON_POLICY", "CLAMP_PARAMS"]
