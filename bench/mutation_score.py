"""Mutation score of the conformance suite: how many wrong torch backends does `pgspec run` catch?

    python bench/mutation_score.py                 # 160 mutants, sampled evenly over the ten family files
    python bench/mutation_score.py --mutants 40 --seed 3 --timeout 300 --list

Each mutant is the built-in torch backend with one automatic change to one of its ten family files
(``adapters/torch/<family>.py``), made with Python's ``ast``:

    operator     a + b <-> a - b, a * b <-> a / b
    comparison   < <-> <=, > <-> >=, == <-> !=
    constant     a numeric literal n -> n + 1 (0 -> 1, 1 -> 2, 0.5 -> 1.5, ...)
    clamp-side   torch.clamp(x, min=a, max=b) / x.clamp(a, b): one bound dropped
    minmax       torch.minimum <-> torch.maximum, torch.min <-> torch.max, .amin <-> .amax
    detach       x.detach() -> x
    stop-gradient  a * b -> a.detach() * b, and -> a * b.detach() (a stop-gradient on one factor)
    detach-added   f(x) -> f(x.detach()) for torch.exp, log, expm1, log1p, sigmoid, tanh, sqrt, softplus
    dimension    dim=-1 <-> dim=0, .sum(-1) -> .sum(0), keepdim flipped
    denominator  a / b -> a / (b + 1)
    boolean      and <-> or, `not x` -> x
    jacobian     f(x) -> sg[f(x)] + roll(f(x) - sg[f(x)]) for the torch functions of detach-added: the
                 same values, the gradient of each element moved to the next one (flattened, cyclic):
                 a per-token Jacobian that is a permutation, right in its column sums, so that only a
                 non-uniform cotangent sees it.  Opt-in (``--kinds jacobian``): its sites come after
                 all the others, so the default samples of every seed stay as they were reported.

Each mutant runs in its own process (the mutated module is served by an import hook, so the
repository is never written), bounded in time (--timeout) and memory (--memory-gb), against the
golden cases of the mutated family and of the loss recipes, in float64 and in bfloat16 (the dtype
the backend's own declarations speak of), plus the property checks of those formulas, judged with the
backend's declarations as `pgspec run` judges it.  A mutant is *killed* when any result is an
unexpected ``fail``, ``error`` or ``stale-deviation`` (a crash counts), or an invalid input the
backend no longer rejects (``not-rejected``); *absorbed* when it is not
killed but some result a declaration classifies (``bug``, ``convention``) differs from the unmutated
backend's (its outcome, error ratio or failing outputs): a rule took a failure it was not written
for (spec/verdicts.md, "Rules"); and *survives* otherwise.  Survivors that cannot change any result are listed with the reason in
``bench/mutation_equivalents.toml`` (file, line, mutation, why); the others are printed with the
file, line and mutation so that a case can be added that catches them.  Output: the kill rate over
non-equivalent mutants, the sample size and every survivor.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from _args import positive  # bench/_args.py

ROOT = Path(__file__).resolve().parent.parent
TORCH = ROOT / "adapters" / "torch"
FAMILIES = ("logprob", "ratio", "surrogate", "is_", "mask", "kl", "agg", "adv", "dist", "loss")
EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.toml")


@dataclass(frozen=True)
class Mutant:
    family: str
    line: int
    col: int
    kind: str
    text: str          # what changed, e.g. "+ -> -"
    index: int         # the site's index among the file's sites (for re-creation)

    @property
    def key(self) -> str:
        return f"adapters/torch/{self.family}.py:{self.line}:{self.col} {self.kind}: {self.text}"


_BIN = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}
_MINMAX = {"minimum": "maximum", "maximum": "minimum", "min": "max", "max": "min", "amin": "amax", "amax": "amin",
           "clamp_min": "clamp_max", "clamp_max": "clamp_min"}
_SYM = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
        ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def _docstring_nodes(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _in_registry_lookup(node, parents) -> bool:
    """Skip literals and calls at module level (tables, registry wiring): only code inside functions."""
    p = parents.get(id(node))
    while p is not None:
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        p = parents.get(id(p))
    return True


def sites(tree):
    """Every mutation site of a module as (node, kind, text, apply) with apply(node) mutating in place."""
    parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[id(child)] = node
    docs = _docstring_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if _in_registry_lookup(node, parents):
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and \
                not isinstance(node.left, ast.Constant) and not isinstance(node.right, ast.Constant):
            for side in ("left", "right"):
                out.append((node, "stop-gradient", f"a * b -> {'a.detach() * b' if side == 'left' else 'a * b.detach()'}",
                            lambda n, side=side: setattr(n, side, _detached(getattr(n, side)))))
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            new = _BIN[type(node.op)]
            out.append((node, "operator", f"{_SYM[type(node.op)]} -> {_SYM[new]}",
                        lambda n, new=new: setattr(n, "op", new())))
            if isinstance(node.op, ast.Div):
                out.append((node, "denominator", "a / b -> a / (b + 1)",
                            lambda n: setattr(n, "right", ast.BinOp(n.right, ast.Add(), ast.Constant(1)))))
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _CMP:
            new = _CMP[type(node.ops[0])]
            out.append((node, "comparison", f"{_SYM[type(node.ops[0])]} -> {_SYM[new]}",
                        lambda n, new=new: n.ops.__setitem__(0, new())))
        elif (isinstance(node, ast.Constant) and type(node.value) in (int, float) and id(node) not in docs
              and not (isinstance(parents.get(id(node)), ast.keyword) and parents[id(node)].arg == "dim")):
            out.append((node, "constant", f"{node.value!r} -> {node.value + 1!r}",
                        lambda n: setattr(n, "value", n.value + 1)))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else (f.id if isinstance(f, ast.Name) else None)
            if name == "clamp":
                for kw in list(node.keywords):
                    if kw.arg in ("min", "max"):
                        out.append((node, "clamp-side", f"clamp({kw.arg}=...) dropped",
                                    lambda n, arg=kw.arg: setattr(n, "keywords", [k for k in n.keywords if k.arg != arg])))
                first = 1 if _is_torch(f) else 0
                for k in range(first, len(node.args)):
                    out.append((node, "clamp-side", f"clamp positional bound {k - first + 1} -> None",
                                lambda n, k=k: n.args.__setitem__(k, ast.Constant(None))))
            if name in _MINMAX and isinstance(f, ast.Attribute):
                new = _MINMAX[name]
                out.append((node, "minmax", f"{name} -> {new}", lambda n, new=new: setattr(n.func, "attr", new)))
            if name in _ELEMENTARY and _is_torch(f) and len(node.args) == 1 and not node.keywords:
                out.append((node, "detach-added", f"torch.{name}(x) -> torch.{name}(x.detach())",
                            lambda n: n.args.__setitem__(0, _detached(n.args[0]))))
            if name == "detach" and isinstance(f, ast.Attribute) and not node.args:
                out.append((node, "detach", "x.detach() -> x", None))
            for kw in node.keywords:
                if kw.arg == "dim" and isinstance(kw.value, (ast.Constant, ast.UnaryOp)):
                    out.append((node, "dimension", "dim flipped (-1 <-> 0)",
                                lambda n, kw=kw: setattr(kw, "value", ast.Constant(0 if _lit(kw.value) != 0 else -1))))
                if kw.arg == "keepdim" and isinstance(kw.value, ast.Constant):
                    out.append((node, "dimension", f"keepdim={kw.value.value} flipped",
                                lambda n, kw=kw: setattr(kw, "value", ast.Constant(not kw.value.value))))
            if name in ("sum", "mean", "amax", "amin", "logsumexp", "cumsum") and node.args and \
                    isinstance(f, ast.Attribute) and isinstance(node.args[0], (ast.Constant, ast.UnaryOp)) and \
                    _lit(node.args[0]) in (-1, 1):
                out.append((node, "dimension", f".{name}({_lit(node.args[0])}) -> .{name}(0)",
                            lambda n: n.args.__setitem__(0, ast.Constant(0))))
        elif isinstance(node, ast.BoolOp):
            new = ast.Or if isinstance(node.op, ast.And) else ast.And
            out.append((node, "boolean", f"{type(node.op).__name__.lower()} -> {new.__name__.lower()}",
                        lambda n, new=new: setattr(n, "op", new())))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((node, "boolean", "not x -> x", None))
    for node in ast.walk(tree):     # the opt-in kinds last, so that every other site keeps its index
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _ELEMENTARY \
                and _is_torch(node.func) and len(node.args) == 1 and not node.keywords \
                and not _in_registry_lookup(node, parents):
            out.append((node, "jacobian", f"torch.{node.func.attr}(x): gradient moved to the next element", None))
    return out, parents


OPT_IN = frozenset({"jacobian"})


def _gradient_rolled(call):
    """``e.detach() + (e - e.detach()).flatten().roll(1).reshape(e.shape)`` for e = ``call``: the value
    of e exactly (e - e.detach() is 0), d out[i] / d e[i - 1] = 1 in flattened order."""
    import copy

    def e():
        return copy.deepcopy(call)

    def attr(value, name, *args):
        return ast.Call(ast.Attribute(value, name, ast.Load()), list(args), [])

    moved = attr(attr(attr(ast.BinOp(e(), ast.Sub(), _detached(e())), "flatten"), "roll", ast.Constant(1)),
                 "reshape", ast.Attribute(e(), "shape", ast.Load()))
    return ast.BinOp(_detached(e()), ast.Add(), moved)


_ELEMENTARY = ("exp", "log", "expm1", "log1p", "sigmoid", "tanh", "sqrt", "softplus")


def _detached(expr):
    """``(expr).detach()``: a stop-gradient on expr (a tensor, or a number whose detach fails: a crash,
    which kills the mutant, so only tensor operands count)."""
    return ast.Call(ast.Attribute(expr, "detach", ast.Load()), [], [])


def _is_torch(f):
    return isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "torch"


def _lit(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


class _Replace(ast.NodeTransformer):
    """Replace one node (by identity) with another."""

    def __init__(self, target, replacement):
        self.target, self.replacement = target, replacement

    def generic_visit(self, node):
        for name, value in ast.iter_fields(node):
            if isinstance(value, list):
                for k, item in enumerate(value):
                    if item is self.target:
                        value[k] = self.replacement
            elif value is self.target:
                setattr(node, name, self.replacement)
        return super().generic_visit(node)


def mutate(family: str, index: int) -> tuple[str, Mutant]:
    """The mutated source of adapters/torch/<family>.py at site ``index``, and the mutant (index -1:
    the unmutated source, for the baseline)."""
    path = TORCH / f"{family}.py"
    if index < 0:
        return path.read_text(), Mutant(family, 0, 0, "none", "unmutated", -1)
    tree = ast.parse(path.read_text())
    found, _ = sites(tree)
    node, kind, text, apply = found[index]
    m = Mutant(family, node.lineno, node.col_offset, kind, text, index)
    if apply is not None:
        apply(node)
    elif kind == "detach":
        _Replace(node, node.func.value).visit(tree)
    elif kind == "jacobian":
        _Replace(node, _gradient_rolled(node)).visit(tree)
    else:  # not x -> x
        _Replace(node, node.operand).visit(tree)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree), m


def all_mutants(opt_in: bool = False) -> dict[str, list[Mutant]]:
    """Every file's mutants, by site index; the opt-in kinds (``OPT_IN``) only when asked."""
    out = {}
    for fam in FAMILIES:
        tree = ast.parse((TORCH / f"{fam}.py").read_text())
        found, _ = sites(tree)
        out[fam] = [Mutant(fam, n.lineno, n.col_offset, k, t, i) for i, (n, k, t, _) in enumerate(found)
                    if opt_in or k not in OPT_IN]
    return out


def sample(n: int, seed: int, kinds: set | None = None) -> list[Mutant]:
    """n mutants spread evenly over the ten files (round robin), each file's sites shuffled by seed
    (of the given ``kinds`` only, when given)."""
    rng = random.Random(seed)
    pools = {f: rng.sample(ms, len(ms)) for f, ms in all_mutants(opt_in=bool(kinds and kinds & OPT_IN)).items()}
    if kinds is not None:
        unknown = kinds - {m.kind for ms in pools.values() for m in ms}
        if unknown:
            raise SystemExit(f"--kinds: no mutant of kind(s) {sorted(unknown)}")
        pools = {f: [m for m in ms if m.kind in kinds] for f, ms in pools.items()}
    out = []
    while len(out) < n and any(pools.values()):
        for fam in FAMILIES:
            if pools[fam] and len(out) < n:
                out.append(pools[fam].pop())
    return out


_FAMILY_OF = {"is_": "is"}

WORKER = r'''
import importlib.abc, importlib.util, json, resource, sys
family, index, memory = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (int(memory * 2**30), int(memory * 2**30)))
sys.path.insert(0, sys.argv[4])
import mutation_score as ms
source, mutant = ms.mutate(family, index)
name = f"pgspec.adapters.torch.{family}"

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == name:
            return importlib.util.spec_from_loader(fullname, self, origin=f"<mutant {mutant.key}>")
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.__file__ = str(ms.TORCH / f"{family}.py")
        exec(compile(source, module.__file__, "exec"), module.__dict__)

sys.meta_path.insert(0, Finder())
from pgspec.conformance.run import runner, properties
fam = {"is_": "is"}.get(family, family)
adapter = runner.load_adapter("torch")          # with its own declarations, as `pgspec run` judges it
globs = f"{fam}.*,loss.*"
rows = {}
killed = []
KILLS = ("fail", "error", "stale-deviation", "not-rejected")
for dtype in ("float64", "bfloat16"):
    results = []
    # case by case, so that a mutant caught early is not run on to a case where it hangs
    for case in runner.select_cases(globs):
        r = runner.run_case(adapter, case, dtype, "cpu")
        # not-applicable is no verdict; the backend rejects every invalid input, so a mutant that makes
        # it accept one is caught (validation is its own axis, not a failure, for frameworks)
        if r.outcome in KILLS:
            killed.append(f"{r.case_id} ({dtype}): {r.outcome}")
            break
        results.append(r)
    if killed:
        break
    results += runner.property_results(adapter, dtype, "cpu", globs)
    for r in runner.RunSummary(results).finalize().results:     # stale rules, once the dtype's run is whole
        if r.outcome in KILLS:
            killed.append(f"{r.case_id} ({dtype}): {r.outcome}")
            break
        if r.outcome in ("bug", "convention"):
            rows[f"{r.case_id} ({dtype})"] = [r.outcome, repr(r.error_ratio), r.failed_outputs]
    if killed:
        break
print(json.dumps({"killed": killed, "declared": rows}))
'''


def _worker(family: str, index: int, timeout: float, memory: float):
    """The worker's JSON answer, or (None, why) when it timed out or crashed."""
    try:
        p = subprocess.run([sys.executable, "-c", WORKER, family, str(index), str(memory), str(Path(__file__).parent)],
                           capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return json.loads(lines[-1]), ""


_BASELINE: dict = {}


def baseline(family: str, timeout: float, memory: float) -> dict:
    """The declared results ({"case (dtype)": [outcome, ratio, outputs]}) of the unmutated backend
    on the family's globs (site index -1: no mutation)."""
    if family not in _BASELINE:
        answer, why = _worker(family, -1, timeout, memory)
        if answer is None or answer["killed"]:
            raise SystemExit(f"the unmutated backend does not pass {family}: {why or answer['killed'][0]}")
        _BASELINE[family] = answer["declared"]
    return _BASELINE[family]


def run_mutant(m: Mutant, timeout: float, memory: float) -> tuple[str, str]:
    """('killed' | 'absorbed' | 'survived' | 'timeout', detail)."""
    answer, why = _worker(m.family, m.index, timeout, memory)
    if answer is None and why == "timeout":
        return "timeout", f"no verdict within {timeout:.0f} s (counted as not killed; rerun with a larger --timeout)"
    if answer is None:
        return "killed", f"the mutant crashed on import or in the harness: {why}"
    if answer["killed"]:
        return "killed", answer["killed"][0]
    base = baseline(m.family, timeout, memory)
    changed = sorted(k for k, v in answer["declared"].items() if base.get(k) != v)
    if changed:
        return "absorbed", f"{len(changed)} declared result(s) changed, e.g. {changed[0]}: {answer['declared'][changed[0]]}"
    return "survived", ""


def load_equivalents() -> dict[str, str]:
    if not EQUIVALENTS.exists():
        return {}
    data = tomllib.loads(EQUIVALENTS.read_text())
    return {e["mutant"]: e["why"] for e in data.get("equivalent", [])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutants", type=positive, default=160, help="sample size (default 160)")
    ap.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant (default 240)")
    ap.add_argument("--memory-gb", type=float, default=4.0, help="address-space limit per mutant (default 4)")
    ap.add_argument("--list", action="store_true", help="list the sampled mutants and exit")
    ap.add_argument("--only", action="append", default=[], metavar="KEY",
                    help="run only the mutants whose key contains KEY (repeatable), from all sites, e.g. to recheck survivors")
    ap.add_argument("--kinds", default=None, metavar="K1,K2",
                    help="sample only mutants of these kinds (e.g. stop-gradient,detach-added,detach; "
                         "jacobian is only sampled when named here)")
    ap.add_argument("--json", type=Path, default=None, help="also write every mutant's outcome as JSON")
    args = ap.parse_args(argv)
    total_sites = sum(len(v) for v in all_mutants().values())
    if args.only:
        chosen = [m for ms in all_mutants(opt_in=True).values() for m in ms if any(k in m.key for k in args.only)]
    else:
        chosen = sample(args.mutants, args.seed, None if args.kinds is None else set(args.kinds.split(",")))
    print(f"{len(chosen)} mutants sampled (seed {args.seed}) from {total_sites} sites in {len(FAMILIES)} files")
    if args.list:
        for m in chosen:
            print(" ", m.key)
        return 0
    equivalents = load_equivalents()
    rows = []
    start = time.perf_counter()
    for k, m in enumerate(chosen, 1):
        t0 = time.perf_counter()
        outcome, detail = run_mutant(m, args.timeout, args.memory_gb)
        if outcome == "survived" and m.key in equivalents:
            outcome, detail = "equivalent", equivalents[m.key]
        rows.append({"mutant": m.key, "outcome": outcome, "detail": detail, "seconds": time.perf_counter() - t0})
        print(f"[{k}/{len(chosen)}] {outcome:10s} {m.key}  ({time.perf_counter() - t0:.0f} s) {detail}", flush=True)
    killed = sum(r["outcome"] == "killed" for r in rows)
    equivalent = sum(r["outcome"] == "equivalent" for r in rows)
    absorbed = [r for r in rows if r["outcome"] == "absorbed"]
    survived = [r for r in rows if r["outcome"] in ("survived", "timeout")]
    relevant = len(rows) - equivalent
    print()
    timeouts = sum(r["outcome"] == "timeout" for r in rows)
    print(f"mutants: {len(rows)}; killed {killed}; absorbed by a declaration {len(absorbed)}; equivalent {equivalent}; "
          f"survived {len(survived) - timeouts}; timed out {timeouts}; "
          f"kill rate over non-equivalent mutants: {killed}/{relevant} = {100 * killed / max(1, relevant):.1f}%; "
          f"{time.perf_counter() - start:.0f} s")
    for r in absorbed:
        print(f"  ABSORBED {r['mutant']}: {r['detail']}")
    for r in survived:
        print(f"  {'SURVIVED' if r['outcome'] == 'survived' else 'TIMEOUT '} {r['mutant']}")
    for r in rows:
        if r["outcome"] == "equivalent":
            print(f"  equivalent {r['mutant']}: {r['detail']}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
