"""`pgspec fuzz`: the command (argument checks, workers, progress, the report and ``--save``)."""

from __future__ import annotations

import fnmatch
import json
import math
import os
import re
import sys
import time
from pathlib import Path

DEFAULT_DTYPES = "float64,float32"
# a fuzz example has at most 4 x 8 tokens: a call that takes minutes hangs (a compiling framework's first
# call takes seconds); as `pgspec run --python`'s default, which is 300 s
DEFAULT_CASE_TIMEOUT = 300.0
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(s|m|h|)\s*$")


def parse_budget(text: str) -> float:
    """'90', '90s', '10m', '1.5h' -> seconds (argparse type: a bad value is a usage error, exit 2)."""
    import argparse

    m = _DURATION.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"must be a duration such as 90s, 10m or 1h, got {text!r}")
    value = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return value


def add_arguments(p) -> None:
    from ..cli_common import FORMULAS_HELP, seconds_arg

    p.add_argument("--adapter", default="torch",
                   help="built-in adapter name (pgspec adapters lists them), or module:object for your own adapter")
    p.add_argument("--formulas", default="*", metavar="GLOBS", help=FORMULAS_HELP.replace("formula or case ID", "formula ID"))
    p.add_argument("--dtype", default=DEFAULT_DTYPES,
                   help="comma-separated dtypes: float64, float32, bfloat16, float16 or fp64, fp32, bf16, fp16")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device the adapter's tensors live on")
    p.add_argument("--budget", type=parse_budget, default=600.0, metavar="DURATION",
                   help="time for the whole search, e.g. 90s, 10m, 1h (default: 10m)")
    p.add_argument("--budget-per-formula", type=parse_budget, default=None, metavar="DURATION",
                   help="time for each (formula, dtype) (default: the budget shared evenly among them)")
    p.add_argument("--examples", type=_positive_int, default=None, metavar="N",
                   help="at most N examples per (formula, dtype): with --seed, a reproducible search (default: no cap, "
                        "the budget decides)")
    p.add_argument("-n", "--workers", type=_positive_int, default=1, metavar="N",
                   help="worker processes, each searching one (formula, dtype) at a time")
    p.add_argument("--seed", type=int, default=0, help="seed of the search")
    p.add_argument("--save", metavar="DIR", default=None,
                   help="write each new counterexample as a case definition (conformance/cases form) under DIR "
                        "(default: none)")
    p.add_argument("--json", metavar="PATH", default=None, help="also write the whole report as JSON (default: none)")
    p.add_argument("--case-timeout", type=seconds_arg, default=DEFAULT_CASE_TIMEOUT, metavar="SECONDS",
                   help="time limit of one adapter call: a call that does not return within it is the example's "
                        f"error, a counterexample (default: {DEFAULT_CASE_TIMEOUT:g})")
    p.add_argument("--no-database", action="store_true",
                   help="neither replay nor keep failing examples in the example database (<pgspec cache>/fuzz)")


def _positive_int(text: str) -> int:
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def select_formulas(globs_text: str, implemented) -> list:
    from pgspec.reference import REGISTRY

    from ..run.runner import RunError
    from ..base.suggest import formula_globs_hint

    globs = [g.strip() for g in globs_text.split(",") if g.strip()]
    if not globs:
        raise RunError(f"--formulas: no glob given (got {globs_text!r}); e.g. --formulas 'kl.*'")
    dead = [g for g in globs if not any(fnmatch.fnmatchcase(fid, g) for fid in REGISTRY)]
    if dead:
        raise RunError(f"--formulas: {', '.join(repr(g) for g in dead)} matches no formula ID"
                       f"{formula_globs_hint(dead, REGISTRY)}")
    chosen = [fid for fid in sorted(REGISTRY) if any(fnmatch.fnmatchcase(fid, g) for g in globs)]
    return chosen, [fid for fid in chosen if fid in implemented]


def run(args) -> int:
    from ..cli_common import _adapter_call, _report_path_problem, _say
    from ..run.loading import load_adapter
    from ..run.runner import RunError
    from ..judge.tolerance import parse_dtypes

    try:
        dtypes = parse_dtypes(args.dtype)
    except ValueError as e:
        raise RunError(str(e)) from None
    if args.save is not None:
        save = Path(args.save)
        if save.exists() and not save.is_dir():
            raise RunError(f"--save: {args.save} exists and is not a directory")
    if args.json and (why := _report_path_problem(args.json)):
        raise RunError(f"--json: {why}")
    adapter = load_adapter(args.adapter)
    ok, why = _adapter_call(args.adapter, adapter, "available")
    if not ok:
        raise RunError(f"adapter {args.adapter!r} is not available: {why}")
    ok, why = _adapter_call(args.adapter, adapter, "device_available", args.device)
    if not ok:
        raise RunError(f"device {args.device!r} is not available: {why}")
    capabilities = _adapter_call(args.adapter, adapter, "capabilities")
    chosen, formulas = select_formulas(args.formulas, capabilities)
    if not formulas:
        raise RunError(f"nothing to fuzz: adapter {adapter.name!r} implements none of the {len(chosen)} selected "
                       f"formulas ({', '.join(chosen[:8])})")
    supported = [d for d in dtypes if d in tuple(adapter.dtypes)]
    if not supported:
        raise RunError(f"nothing to fuzz: adapter {adapter.name!r} supports dtypes {', '.join(adapter.dtypes)}, "
                       f"none of {', '.join(dtypes)}")
    decl = getattr(adapter, "deviations", None)
    tasks = [(fid, d) for fid in formulas for d in supported
             if not (decl is not None and hasattr(decl, "unsupported_for") and decl.unsupported_for(fid))]
    if not tasks:
        raise RunError(f"nothing to fuzz: adapter {adapter.name!r} declares every selected formula unsupported")
    per = args.budget_per_formula or max(1.0, args.budget * args.workers / len(tasks))
    deadline = time.time() + args.budget
    reports = _search(adapter, args, tasks, per, deadline)
    return _conclude(adapter, args, reports, supported, time.time() - (deadline - args.budget))


def _task(spec, fid, dtype, per, deadline, args_dict):
    """One (formula, dtype) in a worker process: its FormulaReport as JSON."""
    from ..run.loading import load_adapter

    adapter = load_adapter(spec)
    return _one(adapter, spec, fid, dtype, per, deadline, args_dict).to_json()


def _one(adapter, spec, fid, dtype, per, deadline, a):
    from ..run.untrusted import case_timeout
    from . import engine

    try:
        with case_timeout(a["case_timeout"], "--case-timeout"):
            return engine.fuzz_formula(adapter, fid, dtype, budget=min(per, max(0.0, deadline - time.time())),
                                       seed=a["seed"], max_examples=a["examples"], device=a["device"],
                                       adapter_spec=spec, database=not a["no_database"],
                                       stop=lambda: time.time() >= deadline)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # noqa: BLE001 - pgspec's own problem with one formula: reported, the others go on
        import traceback

        from ..run.logs import save

        path = save(traceback.format_exc(), "fuzz-error")
        r = engine.FormulaReport(fid, dtype)
        r.error = f"{type(e).__name__}: {e}" + (f" (traceback: {path})" if path else "")
        return r


def _search(adapter, args, tasks, per, deadline) -> list:
    from . import engine

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    a = {"seed": args.seed, "examples": args.examples, "device": args.device, "no_database": args.no_database,
         "case_timeout": args.case_timeout}
    reports = []
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        bar = progress.add_task(f"fuzzing {adapter.name}", total=len(tasks))
        if args.workers == 1:
            for fid, dtype in tasks:
                progress.update(bar, description=f"fuzzing {adapter.name}: {fid} ({dtype})")
                reports.append(_one(adapter, args.adapter, fid, dtype, per, deadline, a))
                progress.advance(bar)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn"),
                                     initializer=_init_worker) as pool:
                try:
                    futures = {pool.submit(_task, args.adapter, fid, dtype, per, deadline, a): (fid, dtype)
                               for fid, dtype in tasks}
                    for fut in as_completed(futures):
                        fid, dtype = futures[fut]
                        try:
                            reports.append(_from_json(fut.result()))
                        except Exception as e:  # noqa: BLE001 - a worker that died: that formula's error
                            r = engine.FormulaReport(fid, dtype)
                            r.error = f"worker failed: {type(e).__name__}: {e}"
                            reports.append(r)
                        progress.advance(bar)
                except BaseException:
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise
    order = {t: k for k, t in enumerate(tasks)}
    return sorted(reports, key=lambda r: order[(r.formula, r.dtype)])


def _init_worker():
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:     # pragma: no cover - the adapter's load says so
        pass


def _from_json(d: dict):
    from . import engine

    r = engine.FormulaReport(d["formula"], d["dtype"])
    for k, v in d.items():
        if k != "findings":
            setattr(r, k, v)
    r.findings = [engine.Finding(**f) for f in d["findings"]]
    return r


def _headline(message: str) -> str:
    """A result message's one line: a traceback's last line (the exception), else the first."""
    lines = [x for x in (message or "").splitlines() if x.strip()]
    if not lines:
        return ""
    return lines[-1].strip() if lines[0].startswith("Traceback") else lines[0]


def _short(x, limit=600) -> str:
    text = json.dumps(x, default=str)
    return text if len(text) <= limit else text[:limit] + " ..."


def _conclude(adapter, args, reports, dtypes, seconds) -> int:
    findings = [f for r in reports for f in r.findings]
    out = sys.stdout
    for f in findings:
        exp = f.expected or {}
        print(f"NEW {f.outcome}: {f.formula} ({f.dtype}) on {adapter.name}", file=out)
        print(f"  params:   {_short(f.params)}", file=out)
        print(f"  inputs:   {_short(f.inputs)}", file=out)
        if exp:
            print(f"  expected: {exp.get('output')}{exp.get('index')} = {exp.get('ref')} (bound {exp.get('bound')})",
                  file=out)
            print(f"  got:      {f.got}", file=out)
        print(f"  message:  {_headline(f.message)}", file=out)
        if f.declaration:
            print(f"  (matched {f.declaration.get('declaration')} of {f.declaration.get('source')}, which does not "
                  "explain it: see the message)", file=out)
        if f.fits:
            print(f"  fits:     {f.fits.get('declaration')} of {f.fits.get('source')} ({f.fits.get('kind')}"
                  f"{', ' + f.fits['cause'] if f.fits.get('cause') else ''}) would explain it, were it declared for "
                  f"{f.formula} and not for corpus case IDs only: if this is its root cause, its scope is narrower "
                  f"than the cause ({f.fits.get('reason', '')[:160]})", file=out)
        print(f"  replay:   {f.replay}", file=out)
    explained: dict = {}
    for r in reports:
        for label, n in r.explained.items():
            explained[label] = explained.get(label, 0) + n
    for label, n in sorted(explained.items()):
        print(f"declared: {label} ({n} example{'s' if n != 1 else ''})", file=out)
    for r in reports:
        if r.not_rejected:
            args_ = sorted({f"{e['argument']}: {e['rule']}" for e in r.not_rejected_examples})
            print(f"validation: {r.formula} ({r.dtype}) on {adapter.name} returned on {r.not_rejected} of "
                  f"{r.rejected + r.not_rejected} invalid examples (e.g. {'; '.join(args_)}); spec/verdicts.md, "
                  "\"Validation\": data, not a counterexample", file=out)
    errors = [r for r in reports if r.error]
    for r in errors:
        print(f"pgspec fuzz: {r.formula} ({r.dtype}) was not searched: {r.error}", file=sys.stderr)
    saved = []
    if args.save and findings:
        saved = save_cases(Path(args.save), findings, adapter.name)
        for path in saved:
            print(f"wrote {path}", file=sys.stderr)
    examples = sum(r.examples for r in reports)
    unconfirmed = sum(r.unconfirmed for r in reports)
    rejected, not_rejected = sum(r.rejected for r in reports), sum(r.not_rejected for r in reports)
    formulas = len({r.formula for r in reports})
    hit = ", ".join(f"{f.formula} {f.dtype}" for f in findings[:6]) + (" ..." if len(findings) > 6 else "")
    fitting = sum(1 for f in findings if f.fits)
    print(f"pgspec fuzz {adapter.name}: {formulas} formulas x {len(dtypes)} dtypes, {examples} examples in "
          f"{seconds:.0f} s: {len(findings)} new counterexample{'s' if len(findings) != 1 else ''}"
          f"{' (' + hit + ')' if hit else ''}"
          f"{f', {fitting} of them fitting a rule declared for corpus cases only' if fitting else ''}; "
          f"{len(explained)} declared rule{'s' if len(explained) != 1 else ''} hit; "
          f"{unconfirmed} oracle disagreement{'s' if unconfirmed != 1 else ''} the reference did not confirm"
          + (f"; rejects {rejected} of {rejected + not_rejected} invalid examples" if rejected + not_rejected else "")
          + (f"; {len(errors)} not searched (pgspec errors)" if errors else ""), file=out)
    if args.json:
        doc = {"adapter": adapter.name, "version": getattr(adapter, "version", ""), "seconds": seconds,
               "seed": args.seed, "reports": [r.to_json() for r in reports]}
        Path(args.json).write_text(json.dumps(doc, indent=1, default=str) + "\n")
    if errors:
        return 3
    return 1 if findings else 0


# --save ------------------------------------------------------------------------------------------
def _literal(x):
    """A JSON-ish value as a Python literal of a case definition (non-finite reals as strings)."""
    if isinstance(x, dict):
        return {k: _literal(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_literal(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def case_source(findings: list, adapter_name: str) -> str:
    import pprint

    lines = ['"""Counterexamples found by `pgspec fuzz --adapter ' + adapter_name + '` (conformance/cases form).',
             "",
             "Each is a minimal example on which the adapter disagreed with the reference beyond the tolerance",
             "model and that no declaration explains.  Move a case into conformance/corpus/cases/<family>.py (give it",
             "a descriptive ID and description) and run `pgspec golden generate`: the generator computes its",
             'golden values."""', "", "from pgspec.conformance.corpus.cases.case import Case", "", "", "def cases():",
             "    return ["]
    seen = set()
    for f in findings:
        if f.case_id in seen:     # the same example found in two dtypes: one case serves every dtype
            continue
        seen.add(f.case_id)
        first = _headline(f.message)
        desc = (f"found by pgspec fuzz: {adapter_name} ({f.dtype}) {f.outcome}s here; {first}")[:300]
        lines.append(f"        Case({f.case_id!r}, {f.formula!r}, {'error' if f.expect_error else 'edge'!r},")
        lines.append(f"             {desc!r},")
        lines.append("             " + pprint.pformat(_literal(f.inputs), width=100, compact=True).replace("\n", "\n             ") + ",")
        end = "),"
        if f.expect_error:
            end = ",\n             expect_error=" + repr({k: f.expect_error[k] for k in ("argument", "rule")}) + "),"
        lines.append("             params=" + pprint.pformat(_literal(f.params), width=100, compact=True).replace("\n", "\n             ") + end)
    lines.append("    ]")
    return "\n".join(lines) + "\n"


def save_cases(directory: Path, findings: list, adapter_name: str) -> list:
    directory.mkdir(parents=True, exist_ok=True)
    by_formula: dict = {}
    for f in findings:
        by_formula.setdefault(f.formula, []).append(f)
    paths = []
    for fid, fs in sorted(by_formula.items()):
        path = directory / f"fuzz_{adapter_name}_{fid.replace('.', '_')}.py"
        path.write_text(case_source(fs, adapter_name))
        paths.append(path)
    return paths
