"""What `pgspec fuzz` draws: one formula's parameters and inputs, from a ``Source``.

A drawn example is ``{"params": {...}, "inputs": {...}}`` in the golden corpus's form (nested lists of
bfloat16-exact numbers, junk at masked positions).  Every choice goes through the ``Source``
(``pgspec.conformance.strategies``), so hypothesis shrinks an example towards the first candidate
of each choice: a parameter at its default, a small batch, ordinary log-ratios.

Parameters are drawn from candidate lists biased toward what breaks implementations: the default,
both ends of the spec's range where they are closed, 0 (equality of a clip's two sides at r = 1),
the values of every framework preset (``conformance/presets``), a spread of ordinary values, and
null for an optional one; every candidate is inside the formula's range and inside the adapter's
declared capabilities (its ``[[capability]]`` domains).  A log-space bound (a ``*log_ratio*``
clamp, OPSM's ``delta``) may be set to exactly one of the drawn tokens' log-ratios, the equality
case of its comparison.  Inputs: ragged masks (empty rows, one-token rows, holes), NaN and
infinities at masked positions, log-ratios on a 1/64 grid up to 1 in size with about one token in
six at +-20 or +-200 (``extreme``), both advantage signs and 0, singleton and identical-reward
groups.  In bfloat16 and float16 the ordinary log-ratios keep 1/64 away from the common clip bounds
(``strategies.logprob_triple(avoid_kinks=True)``): there a correct implementation's ratio may round
to the other side of a bound.
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from functools import lru_cache

from pgspec.reference import REGISTRY

from ..corpus import strategies as pst

LOGPROB_FIELDS = ("logprobs", "old_logprobs", "sampler_logprobs", "ref_logprobs")
LOW_PRECISION = ("bfloat16", "float16")
# ordinary values of a real parameter (filtered by its range): bounds of clips, caps, temperatures
SPREAD = (0.0, 0.1, 0.2, 0.28, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0)
LOG_SPREAD = (0.015625, 0.125, 0.25, 0.5, 1.0, 2.0, 20.0)   # bf16-exact log-space bounds
INT_SPREAD = (0, 1, 2, 3, 4, 8)
MAX_B, MAX_T = 4, 8
# log-ratios set exactly at one token (``_special_log_ratios``): small integers and halves, where a
# comparison with a constant (x == 0, x > 1) decides, and 768, past float64's exp overflow (709.78),
# where a product with w = e^768 must be selected away, never formed as inf * 0
SMALL_LOG_RATIOS = (1.0, -1.0, 0.5, -0.5, 2.0, -2.0)
HUGE_LOG_RATIOS = (768.0, -768.0)


def coin(src, n: int = 2) -> bool:
    """True with probability 1/n; False is the simplest value (what hypothesis shrinks toward)."""
    return src.integer(0, n - 1) == n - 1


def _is_log_space(name: str) -> bool:
    return "log_ratio" in name or name in ("delta", "opsm_delta")


@lru_cache(maxsize=None)
def preset_values() -> dict:
    """{parameter name: sorted values any framework preset gives it} and {recipe: [params, ...]}."""
    from ..corpus.namemap import PRESETS_DIR

    values: dict = {}
    recipes: dict = {}
    for path in sorted(PRESETS_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        for preset in data.get("preset", []):
            params = {k: (None if v == "null" else v) for k, v in (preset.get("params") or {}).items()}
            recipes.setdefault(preset.get("recipe"), []).append(params)
            for k, v in params.items():
                values.setdefault(k, [])
                if v not in values[k]:
                    values[k].append(v)
    return {"values": values, "recipes": recipes}


def _in_range(p, v) -> bool:
    if v is None:
        return p.nullable
    if p.kind == "choice":
        return v in p.choices
    if p.kind == "bool":
        return isinstance(v, bool)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        return False
    if p.kind == "int" and not float(v).is_integer():
        return False
    if p.lo is not None and (v < p.lo or (p.lo_open and v == p.lo)):
        return False
    if p.hi is not None and (v > p.hi or (p.hi_open and v == p.hi)):
        return False
    return True


class Plan:
    """The candidates of one formula's parameters for one adapter (its capability domains)."""

    def __init__(self, fid: str, decl=None):
        self.fid = fid
        self.formula = f = REGISTRY[fid]
        domains: dict = {}
        for d in (decl.capabilities if decl is not None else ()):
            if any(_fnmatch(fid, g) for g in d.ids):
                for name, dom in d.params:
                    domains.setdefault(name, []).append(dom)
        self.domains = domains
        pv = preset_values()
        self.candidates = {}
        for p in f.params:
            if p.kind in ("object",):
                continue
            cands = self._candidates(p, pv["values"].get(p.name, []))
            admitted = [v for v in cands if all(dom.admits(v) for dom in domains.get(p.name, ()))]
            # a domain of listed values: its values are the candidates (in range)
            for dom in domains.get(p.name, ()):
                if not dom.interval:
                    admitted += [v for v in dom.values if v not in admitted and _in_range(p, v)]
            self.candidates[p.name] = admitted or [p.default]
        self.presets = [ps for ps in pv["recipes"].get(fid, [])
                        if all(all(dom.admits(ps[k]) for dom in domains.get(k, ())) for k in ps if k in self.candidates)]

    def _candidates(self, p, presets) -> list:
        out = [p.default]

        def add(v):
            if v not in out and _in_range(p, v):
                out.append(v)

        if p.kind == "choice":
            for v in p.choices:
                add(v)
        elif p.kind == "bool":
            add(not p.default if isinstance(p.default, bool) else True)
            add(False)
        elif p.kind == "int":
            for v in (p.lo, (p.lo or 0) + 1, *INT_SPREAD):
                if v is not None:
                    add(v)
        elif p.kind == "real":
            if p.lo is not None and not p.lo_open:
                add(p.lo)
            if p.hi is not None and not p.hi_open:
                add(p.hi)
            for v in presets:
                add(v)
            spread = LOG_SPREAD if _is_log_space(p.name) else SPREAD
            for v in spread:
                add(v)
                if p.name.endswith("_min") or (p.lo is None and p.hi is not None and p.hi <= 0):
                    add(-v)
            if p.lo is None and p.hi is None and not p.name.endswith("_min"):
                for v in spread:
                    add(-v)
        if p.nullable:
            add(None)
        return out

    def draw_params(self, src) -> dict:
        params = {}
        base = {}
        if self.presets and coin(src, 3):
            base = dict(src.choice(self.presets))
        for name, cands in self.candidates.items():
            if name in base and base[name] in cands:
                params[name] = base[name]
            else:
                params[name] = cands[src.integer(0, len(cands) - 1)] if len(cands) > 1 else cands[0]
        return params


def _fnmatch(name, glob):
    import fnmatch

    return fnmatch.fnmatchcase(name, glob)


def _field_key(f, params: dict) -> str:
    """What decides which optional inputs an example needs: the choices, and which numbers are 0 or null."""
    key = {}
    for p in f.params:
        v = params.get(p.name, p.default)
        key[p.name] = v if p.kind in ("choice", "bool") else ("null" if v is None else "zero" if v == 0 else "set")
    return json.dumps(key, sort_keys=True)


@lru_cache(maxsize=4096)
def _fields(fid: str, key: str, params_json: str) -> tuple | None:
    """The inputs the reference asks for with these parameters (None: it accepts no input set)."""
    from pgspec.reference import SpecError, evaluate

    f = REGISTRY[fid]
    params = json.loads(params_json)
    fields = [i.name for i in f.inputs if not i.optional]
    for _ in range(8):
        ex = batch(pst.SeededSource(1), fid, tuple(fields), params, "float64")
        try:
            evaluate(fid, ex, params, dps=15)
            return tuple(fields)
        except SpecError as e:
            msg = str(e)
            missing = re.search(r"missing input '(\w+)'", msg) or re.search(r"needs the input '(\w+)'", msg)
            given = re.search(r"input '(\w+)' was given", msg)
            if missing and missing.group(1) not in fields:
                fields.append(missing.group(1))
            elif given and given.group(1) in fields:
                fields.remove(given.group(1))
            else:
                return tuple(fields)    # another problem (a parameter): the oracle rejects the example
        except Exception:  # noqa: BLE001 - the seeded example's values, not the input set: keep it
            return tuple(fields)
    return tuple(fields)


def fields_for(fid: str, params: dict) -> tuple:
    f = REGISTRY[fid]
    return _fields(fid, _field_key(f, params), json.dumps(params, sort_keys=True))


def _adv_shapes(fid):
    try:
        return tuple(tuple(s) for s in REGISTRY[fid].input("advantages").shapes)
    except KeyError:
        return ()


def batch(src, fid: str, fields: tuple, params: dict, dtype: str) -> dict:
    """The inputs ``fields`` of ``fid``: a ragged padded batch (strategies.padded_batch) whose
    log-probs come from ``strategies.logprob_triple`` with kinks allowed above bfloat16."""
    shapes = _adv_shapes(fid)
    kw = {}
    if "advantages" in fields and ("B", "T") not in shapes:
        kw["per_token_advantages"] = False
    elif "advantages" in fields and ("B",) not in shapes:
        kw["per_token_advantages"] = True
    lp = tuple(f for f in LOGPROB_FIELDS if f in fields)
    other = tuple(f for f in fields if f not in lp)
    holes = coin(src, 3)
    # group statistics (adv.*) take no mask: up to 8 sequences, so that groups of 3 and 4 are common
    max_B = 2 * MAX_B if "mask" not in fields else MAX_B
    data = pst.padded_batch(src, other, max_B=max_B, max_T=MAX_T, min_B=1, min_T=1, holes=holes, **kw)
    if lp:
        mismatch = src.choice((16, 4, 64))
        extreme = coin(src, 3)
        data.update(pst.logprob_triple(src, data["mask"], mismatch=mismatch, extreme=extreme, fields=lp,
                                       avoid_kinks=dtype in LOW_PRECISION))
        if coin(src, 3):
            _special_log_ratios(src, data, lp)
    if "document_ids" in data and coin(src, 4):
        _many_short_documents(src, data)
    return {k: data[k] for k in fields}


def _special_log_ratios(src, data: dict, fields: tuple) -> None:
    """At one unmasked token, the log-probs ``fields`` set so that their log-ratios are exactly 0 or a
    special value: each field is d - max(d) for d drawn from 0 and ``SMALL_LOG_RATIOS`` (or, by a coin,
    ``HUGE_LOG_RATIOS``: then every pair of fields is 0 or +-768 or +-1536 apart).  All values are <= 0
    and bfloat16-exact.  The strategies' log-ratios lie on a 1/64 grid up to 2 in size, which reaches
    such a point too rarely to be searched (x = 1 exactly; w = e^(l - l_old) overflowing float64)."""
    mask = data["mask"]
    where = [(b, t) for b, row in enumerate(mask) for t, m in enumerate(row) if m]
    if len(fields) < 2 or not where:
        return
    b, t = where[src.integer(0, len(where) - 1)]
    pool = (0.0,) + (HUGE_LOG_RATIOS if coin(src, 3) else SMALL_LOG_RATIOS)
    d = {name: src.choice(pool) for name in fields}
    top = max(d.values())
    for name in fields:
        data[name][b][t] = d[name] - top


def _many_short_documents(src, data: dict) -> None:
    """One packed row made of one document of 3 or more tokens followed by single-token documents, so
    that there are more documents than the longest has tokens (where an aggregator's per-document
    slots, numbered by document and rank, would collide if numbered wrongly); ids stay contiguous,
    increasing and global across rows."""
    ids = data["document_ids"]
    T = len(ids[0]) if ids else 0
    if T < 5:
        return
    b = src.integer(0, len(ids) - 1)
    L = src.integer(3, T - 2)
    rows, nxt = [], 0
    for k, row in enumerate(ids):
        if k == b:
            new = [nxt] * L + [nxt + 1 + j for j in range(T - L)]
        else:
            new = [nxt + (d - row[0]) for d in row]
        rows.append(new)
        nxt = new[-1] + 1
    data["document_ids"] = rows


def _log_ratios(inputs: dict) -> list:
    """The drawn tokens' log-ratios between any two log-prob inputs (unmasked tokens)."""
    mask = inputs.get("mask")
    names = [n for n in LOGPROB_FIELDS if n in inputs]
    out = []
    if mask is None or len(names) < 2:
        return out
    for b, row in enumerate(mask):
        for t, m in enumerate(row):
            if m:
                for i, a in enumerate(names):
                    for c in names[i + 1:]:
                        x = inputs[a][b][t] - inputs[c][b][t]
                        if math.isfinite(x) and x != 0 and x not in out:
                            out.append(x)
    return out


def _derived_list(src, name: str, inputs: dict):
    mask = inputs.get("mask")
    if mask is None:
        return None
    B = len(mask)
    if name == "micro_batch_sizes":
        return pst.micro_batch_sizes(src, B) if B else None
    if name == "sequence_token_counts":
        return [sum(row) + src.integer(0, 2) for row in mask]
    if name == "sequence_lengths":       # each row's length: from 1 + its last unmasked position to T
        T = len(mask[0]) if mask and mask[0] is not None else 0
        last = [max((t + 1 for t, m in enumerate(row) if m), default=0) for row in mask]
        return [T - src.integer(0, max(0, T - max(1, lo))) for lo in last] if T else None
    if name == "group_token_counts" and "group_ids" in inputs:
        # entry i: the whole group of sequence i's token count, the same for every member, at or above
        # the count in this batch (the group has tokens on other shards)
        local: dict = {}
        for g, row in zip(inputs["group_ids"], mask):
            local[g] = local.get(g, 0) + sum(bool(m) for m in row)
        whole = {g: n + src.integer(0, 2) for g, n in sorted(local.items())}
        return [whole[g] for g in inputs["group_ids"]]
    if name == "document_token_counts" and "document_ids" in inputs:
        # N_d at every unmasked token of document d (null at masked positions), at or above its count here
        local = {}
        for ids, row in zip(inputs["document_ids"], mask):
            for d, m in zip(ids, row):
                if m:
                    local[d] = local.get(d, 0) + 1
        whole = {d: n + src.integer(0, 2) for d, n in sorted(local.items())}
        return [[whole[d] if m else None for d, m in zip(ids, row)] for ids, row in zip(inputs["document_ids"], mask)]
    return None


def _tie_window_level(src, inputs: dict):
    """A level rho of ``mask.entropy_quantile`` whose quantile position h = (1 - rho)(n - 1) lies at the
    edge of the spec's tie window (h within 2^-44 (n - 1) of an integer k is k): just outside it,
    h = k +- n 2^-44, which a window one token wider (2^-44 (n + 1)) would take for k; or, when n - 1 is
    a power of two (then rho is a double exactly), on it, h = k +- (n - 1) 2^-44, which the closed
    window takes for k and an open one would not.  k is any of 0 .. n - 1 (the ends with the side that
    keeps rho in (0, 1]); with two tokens the window is 2^-44 max(n - 1, 1) = 2^-44, where a window of
    2^-44 max(n - 1, 2) would take h = k +- 2^-43.  None with fewer than 2 unmasked tokens."""
    n = sum(bool(m) for row in inputs.get("mask") or [] for m in row)
    if n < 2:
        return None
    k = src.integer(0, n - 1)
    side = 1 if coin(src) else -1
    if k == 0 or k == n - 1:        # h = 0 is rho = 1 (h - 0 < 0 is rho > 1); h = n - 1 is rho = 0
        side = 1 if k == 0 else -1
    on_edge = (n - 1) & (n - 2) == 0 and coin(src)
    return 1 - (k + side * (n - 1 if on_edge else n) * 2.0 ** -44) / (n - 1)


def draw(src, plan: Plan, dtype: str) -> dict:
    """One example of ``plan``'s formula: ``{"params", "inputs"}``."""
    params = plan.draw_params(src)
    fid = plan.fid
    inputs = batch(src, fid, fields_for(fid, params), params, dtype)
    f = plan.formula
    # int_list parameters that follow the batch (counts per row, micro-batch sizes)
    for p in f.params:
        if p.kind == "int_list" and p.name in params and coin(src, 3):
            v = _derived_list(src, p.name, inputs)
            if v is not None and all(dom.admits(v) for dom in plan.domains.get(p.name, ())):
                params[p.name] = v
    # global counts at or above the batch's own (a count below it is outside the spec)
    for p in f.params:
        if p.kind == "int" and p.name.startswith("num_") and params.get(p.name) is not None:
            v = _derived_count(src, p.name, inputs)
            if v is not None and all(dom.admits(v) for dom in plan.domains.get(p.name, ())):
                params[p.name] = v
    # the entropy quantile's level at the edge of its tie window
    if fid == "mask.entropy_quantile" and coin(src, 4):
        v = _tie_window_level(src, inputs)
        if v is not None and _in_range(next(p for p in f.params if p.name == "top_entropy_quantile"), v) and \
                all(dom.admits(v) for dom in plan.domains.get("top_entropy_quantile", ())):
            params["top_entropy_quantile"] = v
    # a log-space bound exactly at a drawn log-ratio (the equality case), either sign
    ratios = _log_ratios(inputs)
    for p in f.params:
        if p.kind == "real" and _is_log_space(p.name) and ratios and coin(src, 4):
            x = abs(src.choice(ratios))
            v = -x if (p.name.endswith("_min")) else x
            if _in_range(p, v) and all(dom.admits(v) for dom in plan.domains.get(p.name, ())):
                params[p.name] = v
    _order_bounds(params)
    return {"params": non_default(fid, params), "inputs": _bf16(inputs, f)}


def broken(src, fid: str, example: dict) -> dict | None:
    """The example made invalid in one way the spec rejects: one of the expected-error classes of the
    corpus (``conformance/corpus/cases/errors.py``: a parameter just outside its range, bounds the wrong
    way round, an unknown parameter, a required input left out, a mask with a row too few, a ragged
    row, NaN at an unmasked position, and the formula-specific conditions: a global count below the
    batch's, a per-sequence list of the wrong length, ...), applied to this drawn example instead of
    the formula's first example case.  ``{"params", "inputs", "expect_error": {"argument", "rule"}}``;
    None when no class applies.  Whether the spec rejects it is the reference's to say (judge.record)."""
    from ..corpus.cases.case import Case
    from ..corpus.cases.errors import error_cases, specific_cases

    base = Case(f"{fid}/fuzz-base", fid, "example", "a drawn example", example["inputs"], example["params"])
    # half the time a formula-specific condition (or a per-sequence list one entry off), which the generic
    # classes, the same for every formula and more numerous, would otherwise crowd out
    variants = (specific_cases([base]) + _lists_one_off(src, fid, example)) if coin(src) else []
    variants = variants or error_cases([base])
    if not variants:
        return None
    c = variants[src.integer(0, len(variants) - 1)]
    return {"params": c.params, "inputs": c.inputs, "expect_error": dict(c.expect_error)}


def _lists_one_off(src, fid: str, example: dict) -> list:
    """Each per-sequence list parameter of the formula (``sequence_token_counts``, ...; the example's, or
    one drawn for its batch) with one entry too few, one too many, and, for three sequences or more, a
    single entry (which broadcasts): the spec asks for one entry per sequence."""
    from ..corpus.cases.case import Case

    out = []
    for p in REGISTRY[fid].params:
        if p.kind != "int_list" or "list [B]" not in p.range_text():
            continue
        v = example["params"].get(p.name)
        if not isinstance(v, list):
            v = _derived_list(src, p.name, example["inputs"])
        if not isinstance(v, list) or not v:
            continue
        wrong = [("short", v[:-1]), ("long", v + v[-1:])] + ([("single", v[:1])] if len(v) > 2 else [])
        for slug, w in wrong:
            out.append(Case(f"{fid}/fuzz-{p.name}-{slug}", fid, "error", "", example["inputs"],
                            {**example["params"], p.name: w},
                            expect_error={"argument": p.name, "rule": "one entry per sequence"}))
    return out


def _bf16(inputs: dict, f) -> dict:
    """Real inputs rounded to bfloat16 (the strategies' junk 3e38 is not a bfloat16 number): what the
    adapter gets is what a golden record of the example holds."""
    import numpy as np
    import torch

    out = {}
    for name, value in inputs.items():
        if f.input(name).kind not in ("bool", "int"):
            a = np.asarray(value, dtype=np.float64)
            value = torch.from_numpy(a).to(torch.bfloat16).double().numpy().tolist() if a.size else value
        out[name] = value
    return out


def _order_bounds(params: dict) -> None:
    """A lower and an upper bound drawn the wrong way round are swapped (the spec rejects lo > hi)."""
    pairs = [(k, k[:-4] + "_max") for k in params if k.endswith("_min")] + [("lower", "upper")]
    for lo_name, hi_name in pairs:
        lo, hi = params.get(lo_name), params.get(hi_name)
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo >= hi:
            if lo == hi:
                params[lo_name] = None
            else:
                params[lo_name], params[hi_name] = hi, lo


def _derived_count(src, name: str, inputs: dict):
    mask = inputs.get("mask")
    extra = src.integer(0, 2)
    if name == "num_sequences":
        n = len(mask) if mask is not None else len(inputs.get("rewards", []))
    elif name == "num_tokens" and mask is not None:
        n = sum(sum(row) for row in mask)
    elif name == "num_groups" and "group_ids" in inputs:
        n = len(set(inputs["group_ids"]))
    elif name == "num_documents" and "document_ids" in inputs:
        n = len({d for row in inputs["document_ids"] for d in row})
    else:
        return None
    return n + extra


_CONFLICT = re.compile(r"(?:parameter )?'(\w+)' (?:applies only to|has no meaning for|must be null)")


def repaired(fid: str, example: dict, message: str) -> dict | None:
    """The example with the parameter that the spec's message says conflicts with another set back to
    its default (None: no such parameter)."""
    m = _CONFLICT.search(message)
    if not m or m.group(1) not in example["params"]:
        return None
    params = dict(example["params"])
    del params[m.group(1)]
    return {"params": params, "inputs": example["inputs"]}


def non_default(fid: str, params: dict) -> dict:
    """The parameters that differ from the registry's defaults (what a case definition writes)."""
    defaults = {p.name: p.default for p in REGISTRY[fid].params}
    return {k: v for k, v in params.items()
            if k not in defaults or type(v) is not type(defaults[k]) or v != defaults[k]}


__all__ = ["Plan", "draw", "broken", "fields_for", "batch", "preset_values", "non_default"]
