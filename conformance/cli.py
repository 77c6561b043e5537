"""The ``pgspec`` command line."""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys


def _formulas(args) -> int:
    from pgspec.reference import REGISTRY

    selected = [f for fid, f in sorted(REGISTRY.items()) if fnmatch.fnmatchcase(fid, args.formulas)]
    if not selected:
        print(f"pgspec: no formula matches {args.formulas!r}; known IDs: {', '.join(sorted(REGISTRY))}",
              file=sys.stderr)
        return 2
    if args.json:
        json.dump([f.to_json() for f in selected], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"pgspec formulas ({len(selected)})")
    for col in ("id", "title", "inputs", "params", "grad", "spec"):
        table.add_column(col, overflow="fold")
    for f in selected:
        table.add_row(
            escape(f.id),
            escape(f.title),
            ", ".join(i.name + ("?" if i.optional else "") for i in f.inputs),
            ", ".join(f"{p.name}={p.default!r}" for p in f.params),
            ", ".join(f.differentiable) or "-",
            f.spec,
        )
    Console().print(table)
    return 0


def _golden(args) -> int:
    from . import golden

    if args.action == "generate":
        import time

        start = time.perf_counter()
        files = golden.generate_all(reuse=False)   # always evaluated afresh (and stored in the record cache)
        golden.write_all(files)
        n = sum(len(__import__("json").loads(d)["cases"]) for d in files.values())
        print(f"wrote {len(files)} golden files ({n} cases) to {golden.GOLDEN_DIR} "
              f"in {time.perf_counter() - start:.1f} s")
        return 0
    import time

    start = time.perf_counter()
    cache = not getattr(args, "no_cache", False)
    if sys.stderr.isatty():  # a progress bar on a terminal, the summary line alone otherwise
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("verifying the golden corpus"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("cases", total=None)
            problems = golden.verify(progress=lambda done, total: bar.update(task, completed=done, total=total),
                                     cache=cache)
    else:
        problems = golden.verify(cache=cache)
    took = (f"{golden._STATS['cached'] + golden._STATS['evaluated']} cases, {golden._STATS['evaluated']} evaluated, "
            f"{golden._STATS['cached']} from the record cache; {time.perf_counter() - start:.1f} s")
    if problems:
        print(f"pgspec golden verify: FAILED ({took})", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"pgspec golden verify: {len(golden.load_manifest()['files'])} files byte-identical to the generator's output "
          f"({took})")
    return 0


def _run(args) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import report, runner

    console = Console(stderr=True)
    dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    from .tolerance import DTYPES

    bad = [d for d in dtypes if d not in DTYPES]
    for spec in args.report or []:
        kind, _, path = spec.partition(":")
        if kind not in ("json", "md", "html") or not path:
            console.print(f"pgspec run: --report takes json:PATH, md:PATH or html:PATH, got {spec!r}")
            return 2
    if bad:
        console.print(f"pgspec run: unknown dtype(s) {bad}; choose from {', '.join(DTYPES)}")
        return 2
    try:
        if args.python:
            from .isolated import IsolatedAdapter

            adapter = IsolatedAdapter(args.python, args.adapter, timeout=args.case_timeout)
        else:
            adapter = runner.load_adapter(args.adapter)
        ok, why = adapter.available()
        if not ok:
            console.print(f"pgspec run: adapter {args.adapter!r} is not available: {why}")
            return 2
        ok, why = adapter.device_available(args.device)
        if not ok:
            console.print(f"pgspec run: device {args.device!r} is not available: {why}")
            return 2
        cases = runner.select_cases(args.formulas)
    except runner.RunError as e:
        console.print(f"pgspec run: {e}")
        return 2
    summary = runner.RunSummary()
    columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"{adapter.name} on {args.device}", total=len(cases) * len(dtypes))
        isolated = getattr(adapter, "run_case", None)
        for dtype in dtypes:
            for case in cases:
                if isolated is not None:
                    summary.results.append(isolated(case, dtype, args.device))
                else:
                    summary.results.append(runner.run_case(adapter, case, dtype, args.device))
                progress.advance(task)
        if args.properties:
            for dtype in dtypes:
                progress.update(task, description=f"{adapter.name} on {args.device}: properties ({dtype})")
                summary.results.extend(runner.property_results(adapter, dtype, args.device, args.formulas,
                                                               adapter_spec=args.adapter))
        if isolated is not None:
            adapter.close()
    report.print_matrix(summary, adapter, args.device, dtypes)
    for spec in args.report or []:
        kind, _, path = spec.partition(":")
        report.write(kind, path, summary, adapter, args.device, dtypes)
        console.print(f"wrote {kind} report to {path}")
    return summary.exit_code()


def _adapters(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import runner

    table = Table(title="pgspec adapters")
    for col in ("name", "available", "framework", "version", "formulas", "deviations"):
        table.add_column(col)
    for name in sorted(runner.BUILTIN_ADAPTERS):
        try:
            adapter = runner.load_adapter(name)
            ok, why = adapter.available()
            table.add_row(name, "yes" if ok else f"no: {why}", adapter.framework, adapter.version,
                          str(len(adapter.capabilities())), str(len(adapter.deviations)))
        except Exception as e:  # noqa: BLE001 - an adapter whose framework is missing is listed as such
            table.add_row(name, f"no: {e}", "-", "-", "-", "-")
    Console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pgspec", description="The policy-gradient loss specification.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("formulas", help="list the formula registry")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--formulas", default="*", metavar="GLOB", help="only IDs matching this glob")
    p.set_defaults(func=_formulas)
    g = sub.add_parser("golden", help="generate or verify the golden corpus")
    g.add_argument("action", choices=("generate", "verify"))
    g.add_argument("--no-cache", action="store_true",
                   help="verify: evaluate every case afresh instead of taking unchanged ones from the record cache")
    g.set_defaults(func=_golden)
    r = sub.add_parser("run", help="run the conformance suite against an adapter")
    r.add_argument("--adapter", default="torch", help="built-in adapter name or module:object (default torch)")
    r.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    r.add_argument("--dtype", default="float64,float32,bfloat16", help="comma-separated dtypes")
    r.add_argument("--formulas", default="*", metavar="GLOB", help="formula or case ID globs, comma-separated")
    r.add_argument("--report", action="append", metavar="KIND:PATH", help="json:PATH, md:PATH or html:PATH (repeatable)")
    r.add_argument("--properties", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the property checks of spec/properties.md (default: on)")
    r.add_argument("--python", metavar="PATH", default=None,
                   help="run the adapter in this other interpreter (its own venv) over a JSON-lines protocol")
    r.add_argument("--case-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="with --python: a case that takes longer becomes an error outcome (default 300)")
    r.set_defaults(func=_run)
    a = sub.add_parser("adapters", help="list adapters with availability and version")
    a.set_defaults(func=_adapters)
    c = sub.add_parser("check", help="check a formula at production size against the float64 oracle")
    c.add_argument("--formula", required=True, help="formula or recipe ID (see `pgspec check --list`)")
    c.add_argument("--adapter", default="torch", help="built-in adapter name or module:object (default torch)")
    c.add_argument("--shape", default="64x32768", help="BxT (default 64x32768)")
    c.add_argument("--vocab", type=int, default=None, help="vocabulary size V for log-prob formulas")
    c.add_argument("--dtype", default="float32", help="the adapter's dtype (default float32)")
    c.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--chunk", type=int, default=8, help="sequences per chunk of the oracle's scale pass")
    c.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a formula parameter (JSON value)")
    c.add_argument("--json", metavar="PATH", default=None, help="also write the result as JSON")
    c.set_defaults(func=_check)
    return parser


def _check(args) -> int:
    from . import check, runner

    try:
        if args.vocab is not None:
            raise check.CheckError("--vocab: no log-prob formula has an oracle scale yet "
                                   f"(formulas with one: {', '.join(check.ORACLE_FORMULAS)})")
        B, T = check.parse_shape(args.shape)
        params = {}
        for item in args.param:
            name, sep, value = item.partition("=")
            if not sep:
                raise check.CheckError(f"--param must be NAME=VALUE, got {item!r}")
            try:
                params[name] = json.loads(value)
            except ValueError:
                params[name] = value
        adapter = runner.load_adapter(args.adapter)
        res = check.run_check(adapter, args.formula, B, T, args.dtype, args.device, args.seed, params, args.chunk)
    except (check.CheckError, runner.RunError) as e:
        print(f"pgspec check: {e}", file=sys.stderr)
        return 2
    for o in res.outputs:
        print(f"{res.formula} {o.output}: {o.compared} elements, worst error ratio {o.worst_ratio:.3g}, "
              f"{o.failures} out of bound")
    print(f"pgspec check {res.adapter} {res.formula} {res.dtype} {B}x{T} seed {res.seed}: {res.outcome} "
          f"(adapter {res.adapter_seconds:.2f} s, oracle {res.oracle_seconds:.2f} s){': ' + res.message if res.message else ''}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res.to_json(), fh, indent=1)
    return {"pass": 0, "unsupported": 0}.get(res.outcome, 1)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
