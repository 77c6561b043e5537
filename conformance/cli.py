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
        files = golden.generate_all()
        golden.write_all(files)
        n = sum(len(__import__("json").loads(d)["cases"]) for d in files.values())
        print(f"wrote {len(files)} golden files ({n} cases) to {golden.GOLDEN_DIR} "
              f"in {time.perf_counter() - start:.1f} s")
        return 0
    if args.action == "coverage":
        from . import coverage

        return coverage.main()
    problems = golden.verify()
    if problems:
        print("pgspec golden verify: FAILED", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"pgspec golden verify: {len(golden.load_manifest()['files'])} files byte-identical to the generator's output")
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
        python = _checkout_adapter(args)
        if python:
            args.python = python
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
        runner.check_declarations(adapter)
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
    summary.finalize()
    report.print_matrix(summary, adapter, args.device, dtypes)
    for spec in args.report or []:
        kind, _, path = spec.partition(":")
        report.write(kind, path, summary, adapter, args.device, dtypes)
        console.print(f"wrote {kind} report to {path}")
    return summary.exit_code()


def _checkout_adapter(args):
    """``--source PATH``: the checkout of a framework loaded from git (nemo_rl, slime, fast_llm,
    megatron), handed to the adapter through its environment variable (PGSPEC_<NAME>_SOURCE).
    Such adapters always run in a worker process (the isolated mode), so their stand-in modules
    never reach another adapter: the interpreter is --python, else the adapter's own
    PGSPEC_<NAME>_PYTHON, else this one.  Returns the interpreter, or None for other adapters."""
    import os

    from . import runner

    if args.source is not None:
        if not os.path.isdir(args.source):
            raise runner.RunError(f"--source: {args.source} is not a directory")
    adapter = runner.load_adapter(args.adapter) if args.adapter in runner.BUILTIN_ADAPTERS else None
    if adapter is None or not getattr(adapter, "requires_isolation", False):
        if args.source is not None:
            raise runner.RunError(f"--source is for the adapters loaded from a checkout, not {args.adapter!r}")
        return None
    name = args.adapter.upper()
    if args.source is not None:
        os.environ[f"PGSPEC_{name}_SOURCE"] = os.path.abspath(args.source)
    return args.python or os.environ.get(f"PGSPEC_{name}_PYTHON") or sys.executable


def _adapters(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from . import runner

    table = Table(title="pgspec adapters")
    for col in ("name", "available", "framework", "version", "formulas", "declarations"):
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
    g.add_argument("action", choices=("generate", "verify", "coverage"),
                   help="generate: write the corpus; verify: regenerate in memory and require byte equality; "
                        "coverage: which side of every bounding parameter binds in which cases")
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
    r.add_argument("--source", metavar="PATH", default=None,
                   help="the framework checkout for nemo_rl, slime, fast_llm, megatron (else PGSPEC_<NAME>_SOURCE)")
    r.add_argument("--case-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="with --python: a case that takes longer becomes an error outcome (default 300)")
    r.set_defaults(func=_run)
    a = sub.add_parser("adapters", help="list adapters with availability and version")
    a.set_defaults(func=_adapters)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
