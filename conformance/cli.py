"""The ``pgspec`` command line."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys

from .cli_common import FORMULAS_HELP, MIN_FREE_BYTES, _adapter_call, _report_path_problem, _say, seconds_arg  # noqa: F401


def _globs(spec: str) -> list[str]:
    """A comma-separated list of globs (``'kl.*,loss.grpo'``), as every ``--formulas`` takes it."""
    return [g.strip() for g in spec.split(",") if g.strip()]


def _formulas(args) -> int:
    from pgspec.reference import REGISTRY

    globs = _globs(args.formulas)
    selected = [f for fid, f in sorted(REGISTRY.items()) if any(fnmatch.fnmatchcase(fid, g) for g in globs)]
    if not selected:
        from .base.suggest import formula_globs_hint

        print(f"pgspec: no formula matches {args.formulas!r}; known IDs: {', '.join(sorted(REGISTRY))}"
              f"{formula_globs_hint(globs, REGISTRY)}", file=sys.stderr)
        return 2
    if args.json:
        json.dump([f.to_json() for f in selected], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # IDs, input, parameter and output names are never split: the ID column is as wide as the
    # longest ID (the title wraps under it); inputs, parameters and outputs are listed one per line.
    table = Table(title=f"pgspec formulas ({len(selected)})", box=box.SIMPLE_HEAD, leading=1)
    table.add_column("id / title", min_width=max(len(f.id) for f in selected), ratio=1)
    table.add_column("inputs -> outputs", no_wrap=True)
    table.add_column("params (default)", no_wrap=True)
    for f in selected:
        table.add_row(
            f"[bold]{escape(f.id)}[/bold]\n[dim]{escape(f.title)}[/dim]",
            "\n".join([*(escape(i.name + ("*" if i.name in f.differentiable else "") + ("?" if i.optional else ""))
                        for i in f.inputs), *(f"-> [bold]{escape(o.name)}[/bold]" for o in f.outputs)]),
            "\n".join(escape(f"{p.name}={p.default!r}") for p in f.params) or "-",
        )
    console = Console()
    console.print(table)
    # the legend as plain text, wrapped at the console's width between words (as a rich caption it
    # was cut to the table's width, losing letters when piped)
    import textwrap

    legend = ("* differentiable input (the corpus has its gradient); ? optional input; -> output, a name the "
              "adapter returns (pgspec formulas --json has their shapes, the parameters' ranges and the spec "
              "anchors)")
    print(textwrap.fill(legend, width=max(40, min(console.width, 100))))
    return 0


def _golden(args) -> int:
    from .corpus import golden

    if args.action == "generate":
        import time

        start = time.perf_counter()
        files = golden.generate_all(reuse=False)   # always evaluated afresh (and stored in the record cache)
        golden.write_all(files)
        n = sum(len(__import__("json").loads(d)["cases"]) for d in files.values())
        print(f"wrote {len(files)} golden files ({n} cases) to {golden.GOLDEN_DIR} "
              f"in {time.perf_counter() - start:.1f} s")
        return 0
    if args.action == "coverage":
        from .corpus import coverage
        from .run.properties import strategy_coverage

        if coverage.main():
            return 1
        rows, bad = strategy_coverage.option_coverage()
        print()
        ok = coverage.report(strategy_coverage.option_table(rows), bad, "property-strategy gap(s)",
                             "the property examples draw every option on both sides of its binding region, "
                             "and the clamp property covers every clamped formula")
        return 0 if ok else 1
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
    from .base.gcpause import RunCollector

    collector = RunCollector()
    try:
        return _run_checked(args, collector)
    finally:
        collector.restore()


def _run_checked(args, collector) -> int:  # noqa: C901 - one linear script of checks, then the run
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from . import report
    from .run import runner
    from .run.runner import RunError
    from .judge.tolerance import parse_dtypes

    console = Console(stderr=True)
    # every argument is checked before anything runs: a mistake costs a second, not a whole run
    try:
        dtypes = parse_dtypes(args.dtype)
    except ValueError as e:
        raise RunError(str(e)) from None
    reports = []
    for spec in args.report or []:
        kind, _, path = spec.partition(":")
        if kind not in ("json", "md", "html") or not path:
            raise RunError(f"--report takes json:PATH, md:PATH or html:PATH, got {spec!r}")
        if any(os.path.abspath(path) == os.path.abspath(p) for _, p in reports):
            raise RunError(f"--report {spec!r}: {path} is given twice")
        problem = _report_path_problem(path)
        if problem:
            raise RunError(f"--report {spec!r}: {problem}")
        reports.append((kind, path))
    python, loaded = _checkout_adapter(args)
    if python:
        args.python = python
    if args.python:
        from .run.isolated import IsolatedAdapter

        _say(f"pgspec run: starting the worker ({args.python}); it has {args.startup_timeout:g} s "
             f"(--startup-timeout) to load adapter {args.adapter!r}")
        adapter = IsolatedAdapter(args.python, args.adapter,
                                  timeout=args.case_timeout if args.case_timeout is not None else 300.0,
                                  startup_timeout=args.startup_timeout)
    else:
        adapter = loaded if loaded is not None else runner.load_adapter(args.adapter)
        from .run import untrusted

        untrusted.CASE_TIMEOUT = args.case_timeout     # in this process: SIGALRM (untrusted.time_limit)
    try:
        ok, why = _adapter_call(args.adapter, adapter, "available")
        if not ok:
            raise RunError(f"adapter {args.adapter!r} is not available: {why}")
        ok, why = _adapter_call(args.adapter, adapter, "device_available", args.device)
        if not ok:
            raise RunError(f"device {args.device!r} is not available: {why}")
        runner.check_declarations(adapter)
        problems: list = []
        cases = runner.select_cases(args.formulas, problems=problems)
        for p in problems:
            _say(f"pgspec run: golden file problem (its family is not run): {p}")
        capabilities = _adapter_call(args.adapter, adapter, "capabilities")
        supported = [d for d in dtypes if d in tuple(adapter.dtypes)]
        runnable = [c for c in cases if c["formula"] in capabilities]
        if not cases:
            raise RunError("nothing to run: every golden file the selection needs is corrupted (above)")
        if not runnable:
            raise RunError(f"nothing to run: adapter {adapter.name!r} implements none of the {len(cases)} selected "
                           f"cases' formulas ({', '.join(sorted({c['formula'] for c in cases})[:8])})")
        if not supported:
            raise RunError(f"nothing to run: adapter {adapter.name!r} supports dtypes {', '.join(adapter.dtypes)}, "
                           f"none of {', '.join(dtypes)}")
        summary = runner.RunSummary()
        columns = (TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        # the bar counts results, as the last line does ("N results in all"): each golden case in each
        # dtype, then each property check of a selected formula in each dtype
        checks = 0
        if args.properties:
            from .run.properties import planned

            checks = len(planned(args.formulas))
        with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as progress:
            total = (len(cases) + checks) * len(dtypes)
            task = progress.add_task(f"{adapter.name} on {args.device}", total=total)
            isolated = getattr(adapter, "run_case", None)
            collector.keep()
            for k, dtype in enumerate(dtypes, 1):
                # what runs now: the dtype, its place among them and the phase
                progress.update(task, description=f"{adapter.name} on {args.device}: golden cases, {dtype} "
                                                  f"({k} of {len(dtypes)} dtypes)")
                progress.refresh()      # every phase is drawn, however fast it runs
                if isolated is not None:
                    for case in cases:
                        summary.results.append(_one_case(adapter, isolated, case, dtype, args.device))
                        progress.advance(task)
                else:
                    # the comparisons of a dtype's cases are made together (runner.run_cases)
                    summary.results.extend(runner.run_cases(
                        adapter, cases, dtype, args.device,
                        on_error=lambda case, e, dtype=dtype: _case_error_row(adapter, case, dtype, args.device, e),
                        advance=(lambda: progress.advance(task)) if console.is_terminal else None))
                collector.keep()
            if args.properties:
                for k, dtype in enumerate(dtypes, 1):
                    progress.update(task, description=f"{adapter.name} on {args.device}: property checks, {dtype} "
                                                      f"({k} of {len(dtypes)} dtypes)")
                    progress.refresh()
                    rows = _properties(adapter, dtype, args.device, args.formulas, args.adapter)
                    summary.results.extend(rows)
                    # a crash of the checks is one error row: the total follows, so that it stays the line's
                    total += len(rows) - checks
                    progress.update(task, total=total, advance=len(rows))
    finally:
        if getattr(adapter, "run_case", None) is not None:
            adapter.close()
    summary.finalize()
    report.print_matrix(summary, adapter, args.device, dtypes)
    code = summary.exit_code()
    for kind, path in reports:
        try:
            report.write(kind, path, summary, adapter, args.device, dtypes)
        except OSError as e:
            _say(f"pgspec run: cannot write the {kind} report to {path}: {e.strerror or e} "
                 "(nothing was written there)")
            code = 2
        else:
            _say(f"wrote {kind} report to {path}")
    ran = [r for r in summary.results if r.outcome not in ("unsupported", "not-applicable")]
    if not ran:
        _say(f"pgspec run: nothing was run: all {len(summary.results)} (case, dtype) pairs are unsupported "
             "or not applicable (see the table)")
        code = 2
    if problems:
        _say(f"pgspec run: {len(problems)} golden file(s) are corrupted (above); the run fails")
        code = 2
    return code


def _one_case(adapter, isolated, case, dtype, device):
    """One case's result; whatever goes wrong in it stays in it (the run goes on)."""
    from .run import runner

    try:
        if isolated is not None:
            return isolated(case, dtype, device)
        return runner.run_case(adapter, case, dtype, device)
    except BaseException as e:  # noqa: BLE001 - one case's crash never stops the run
        if isinstance(e, KeyboardInterrupt):
            raise
        return _case_error_row(adapter, case, dtype, device, e)


def _case_error_row(adapter, case, dtype, device, e):
    return _error_row(adapter, device, dtype, case["id"], case["formula"], case.get("family", "?"),
                      case.get("category", "?"), e)


def _properties(adapter, dtype, device, formulas, spec):
    from .run import runner

    try:
        return runner.property_results(adapter, dtype, device, formulas, adapter_spec=spec)
    except BaseException as e:  # noqa: BLE001 - a crash in the property checks is one error row
        if isinstance(e, KeyboardInterrupt):
            raise
        return [_error_row(adapter, device, dtype, "prop.all/*", "*", "prop.all", "property", e)]


def _error_row(adapter, device, dtype, case_id, formula, family, category, e):
    import traceback

    from .run.logs import save
    from .run.runner import CaseResult, _one_line

    path = save(traceback.format_exc(), "case-error")
    where = f"; the traceback is saved to {path}" if path else ""
    return CaseResult(adapter.name, adapter.version, device, dtype, case_id, formula, family, category, "error",
                      message=f"{_one_line(e)}{where}")


def _checkout_adapter(args):
    """``--source PATH``: the checkout of a framework loaded from git (nemo_rl, slime, fast_llm,
    megatron), handed to the adapter through its environment variable (PGSPEC_<NAME>_SOURCE).
    Such adapters always run in a worker process (the isolated mode), so their stand-in modules
    never reach another adapter: the interpreter is --python, else the adapter's own
    PGSPEC_<NAME>_PYTHON, else this one.  Returns (the interpreter, None) for such an adapter, and
    (None, the adapter loaded to ask, or None when it was not) for the others, so that a built-in
    adapter is loaded once."""
    from .run import runner

    if args.source is not None and not os.path.isdir(args.source):
        raise runner.RunError(f"--source: {args.source} is not a directory")
    adapter = runner.load_adapter(args.adapter) if args.adapter in runner.BUILTIN_ADAPTERS else None
    if adapter is None or not getattr(adapter, "requires_isolation", False):
        if args.source is not None:
            raise runner.RunError(f"--source is for the adapters loaded from a checkout, not {args.adapter!r}")
        return None, adapter
    name = args.adapter.upper()
    if args.source is not None:
        os.environ[f"PGSPEC_{name}_SOURCE"] = os.path.abspath(args.source)
    return args.python or os.environ.get(f"PGSPEC_{name}_PYTHON") or sys.executable, None


def _adapters(args) -> int:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from .run import runner

    table = Table(title="pgspec adapters", box=box.SIMPLE_HEAD)
    table.add_column("name", no_wrap=True, style="bold")
    table.add_column("available", no_wrap=True)
    for col in ("framework", "version"):
        table.add_column(col, overflow="fold")
    for col in ("formulas", "declarations"):
        table.add_column(col, justify="right", no_wrap=True)
    missing = []
    for name in sorted(runner.BUILTIN_ADAPTERS):
        try:
            adapter = runner.load_adapter(name)
            ok, why = adapter.available()
            table.add_row(name, "yes" if ok else "no (1)", escape(adapter.framework), escape(adapter.version),
                          str(len(adapter.capabilities())), str(len(adapter.deviations)))
        except Exception as e:  # noqa: BLE001 - an adapter whose framework is missing is listed as such
            ok, why = False, str(e)
            table.add_row(name, "no (1)", "-", "-", "-", "-")
        if not ok:
            missing.append((name, why))
    console = Console()
    console.print(table)
    if missing:
        # printed whole (never cut to a column): the install command is what the user needs
        console.print("(1) not available here; how to install:")
        for name, why in missing:
            console.print(f"  {escape(name)}: {escape(why)}", soft_wrap=True, highlight=False)
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pgspec")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    # every option's help states its default once (cli_help.HelpFormatter); each subcommand has a
    # description and examples (cli_help.SUBCOMMANDS); a mistyped name gets a 'did you mean'
    from .cli_help import DESCRIPTION, EPILOG, SUBCOMMANDS, HelpFormatter, Parser

    parser = Parser(prog="pgspec", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"pgspec {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    def command(name):
        return sub.add_parser(name, formatter_class=HelpFormatter, **SUBCOMMANDS[name])

    p = command("formulas")
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--formulas", default="*", metavar="GLOBS", help="formula ID globs, comma-separated (e.g. 'kl.*,loss.grpo')")
    p.set_defaults(func=_formulas)
    g = command("golden")
    g.add_argument("action", choices=("generate", "verify", "coverage"),
                   help="generate: write the corpus; verify: regenerate in memory and require byte equality; "
                        "coverage: which side of every bounding parameter binds in which cases, which regimes (gates at "
                        "equality, composed bounds in both orders, float64-only effects) the cases witness")
    g.add_argument("--no-cache", action="store_true",
                   help="verify: evaluate every case afresh instead of taking unchanged ones from the record cache")
    g.set_defaults(func=_golden)
    r = command("run")
    r.add_argument("--adapter", default="torch",
                   help="built-in adapter name (pgspec adapters lists them), or module:object for your own adapter "
                        "(the current folder is importable)")
    r.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device the adapter's tensors live on")
    r.add_argument("--dtype", default="float64,float32,bfloat16",
                   help="comma-separated dtypes: float64, float32, bfloat16, float16 or fp64, fp32, bf16, fp16")
    r.add_argument("--formulas", default="*", metavar="GLOBS", help=FORMULAS_HELP)
    r.add_argument("--report", action="append", metavar="KIND:PATH",
                   help="json:PATH, md:PATH or html:PATH, repeatable (default: none, the table on the terminal only)")
    r.add_argument("--properties", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the property checks of spec/properties.md")
    r.add_argument("--python", metavar="PATH", default=None,
                   help="run the adapter in this other interpreter (its own venv) over a JSON-lines protocol "
                        "(default: in this process, or PGSPEC_<NAME>_PYTHON for the adapters loaded from a checkout)")
    r.add_argument("--source", metavar="PATH", default=None,
                   help="the framework checkout for nemo_rl, slime, fast_llm, megatron (default: "
                        "$PGSPEC_<NAME>_SOURCE)")
    r.add_argument("--case-timeout", type=seconds_arg, default=None, metavar="SECONDS",
                   help="a case that takes longer becomes an error outcome: with --python the worker is killed, in "
                        "this process the adapter's Python code is interrupted (default: 300 with --python, no limit "
                        "in this process; docs/bad-input.md)")
    r.add_argument("--startup-timeout", type=seconds_arg, default=300.0, metavar="SECONDS",
                   help="with --python: the worker must load the adapter within this time")
    r.set_defaults(func=_run)
    a = command("adapters")
    a.set_defaults(func=_adapters)
    c = command("check")
    c.add_argument("--formula", default=None,
                   help="formula or recipe ID (`pgspec check --list` lists those with an oracle); required, no default")
    c.add_argument("--list", action="store_true", help="list the formulas with an oracle, and what each needs")
    c.add_argument("--adapter", default="torch", help="built-in adapter name or module:object")
    c.add_argument("--shape", default="64x32768", help="BxT")
    c.add_argument("--vocab", type=int, default=None,
                   help="vocabulary size V of the linear head: logprob.token (required), loss.grpo (from hidden "
                        "states and the head, through the adapter's fused head) (default: none, no head)")
    c.add_argument("--hidden", type=int, default=None,
                   help="width H of the linear head whose exact logits log-prob checks use (default: 64)")
    c.add_argument("--dtype", default="float32",
                   help="the adapter's dtype, or several comma-separated (the oracle is evaluated once for all); "
                        "fp32, bf16, fp16, fp64 name them too")
    c.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="device of the adapter's tensors")
    c.add_argument("--seed", type=int, default=0, help="seed of the input generator")
    c.add_argument("--chunk", type=int, default=8, help="sequences per chunk of the oracle's scale pass")
    c.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="a formula parameter (JSON value), repeatable (default: none, each parameter at its spec value)")
    c.add_argument("--json", metavar="PATH", default=None, help="also write the result as JSON (default: none)")
    c.add_argument("--sampler", action="store_true",
                   help="give loss.vespo the sampler's log-probs, which it folds into phi (TRL's and Liger's vLLM "
                        "correction); the other losses get them where their options read them")
    c.add_argument("--max-memory", metavar="GIB", default=None,
                   help="the memory the check may use, in GiB: a shape whose estimate exceeds it is refused before "
                        "anything is allocated (default: the memory available, docs/bad-input.md)")
    c.set_defaults(func=_check)
    from .fuzz.command import add_arguments as fuzz_arguments

    z = command("fuzz")
    fuzz_arguments(z)
    z.set_defaults(func=_fuzz)
    return parser


def _fuzz(args) -> int:
    from .fuzz.command import run

    return run(args)


def _check(args) -> int:
    from . import check
    from .check import branches as cb
    from .run import runner
    from .judge import tolerance

    if args.list:
        print(check.describe_formulas())
        return 0
    try:
        if args.formula is None:
            raise check.CheckError("--formula is required (`pgspec check --list` lists the formulas with an oracle)")
        if args.json and (why := _report_path_problem(args.json)):
            raise check.CheckError(f"--json: {why}")
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
        try:
            dtypes = tolerance.parse_dtypes(args.dtype)
        except ValueError as e:
            raise check.CheckError(str(e)) from None
        max_memory = None
        if args.max_memory is not None:
            from .check.memory import parse_max_memory

            try:
                max_memory = parse_max_memory(args.max_memory)
            except ValueError as e:
                raise check.CheckError(f"--max-memory {e}") from None
        adapter = runner.load_adapter(args.adapter)
        results = check.run_checks(adapter, args.formula, B, T, dtypes, args.device, args.seed, params, args.chunk,
                                   vocab=args.vocab, hidden=args.hidden, sampler=args.sampler, max_memory=max_memory,
                                   progress=lambda line: print(f"pgspec check: {line}", file=sys.stderr, flush=True))
    except (check.CheckError, runner.RunError) as e:
        print(f"pgspec check: {e}", file=sys.stderr)
        return 2
    shared = f", shared by {', '.join(dtypes)}" if len(dtypes) > 1 else ""
    for res in results:
        for o in res.outputs:
            print(f"{res.formula} {res.dtype} {o.output}: {o.compared} elements, worst error ratio {o.worst_ratio:.3g}, "
                  f"{o.failures} out of bound")
        size = f"{B}x{T}" + (f" V={res.vocab} H={res.hidden} via {res.path or '-'}" if res.vocab else "")
        print(f"pgspec check {res.adapter} {res.formula} {res.dtype} {size} seed {res.seed}: {_check_outcome(res)} "
              f"(adapter {res.adapter_seconds:.2f} s, oracle {res.oracle_seconds:.2f} s{shared})"
              f"{': ' + res.message if res.message else ''}")
        if res.declaration:
            d = res.declaration
            print(f"  {'declared' if res.outcome in ('bug', 'convention') else 'declared, not shown by this check'}: "
                  f"{d['declaration']} of {d['source']} ({d['kind']}): {d['reason']} ({d['link']})")
    judged = next((res for res in results if res.branches), None)
    if judged is not None:      # the same inputs for every dtype
        print(f"branches judged{' (every dtype)' if len(results) > 1 else ''}, tokens or rows on each side:")
        for line in cb.describe(judged.branches):
            print(f"  {line}")
        if judged.unreached:
            print(f"not judged (no token or row of the check's inputs takes it): {'; '.join(judged.unreached)}")
    if args.json:
        # one dtype: its result; several: the list of their results, in the order given
        doc = results[0].to_json() if len(results) == 1 else [res.to_json() for res in results]
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
    if all(res.outcome == "unsupported" for res in results):
        # as `pgspec run`: a check that checked nothing is not a pass
        print(f"pgspec check: nothing was checked: {args.adapter} supports {args.formula} in none of the dtypes "
              f"given ({', '.join(res.dtype for res in results)}; see above)", file=sys.stderr)
        return 2
    # as `pgspec run`: a failure the adapter declares (a known bug, a convention) is not an unexpected one
    return max({"pass": 0, "unsupported": 0, "bug": 0, "convention": 0}.get(res.outcome, 1) for res in results)


def _check_outcome(res) -> str:
    return {"bug": "known bug", "convention": "convention"}.get(res.outcome, res.outcome)


ISSUES_URL = "the pgspec issue tracker"
EXIT_INTERNAL = 3


class Terminated(KeyboardInterrupt):
    """SIGTERM (a CI job's timeout, ``kill``): raised where the program is, like Ctrl-C, so that every
    ``finally`` runs and a ``--python`` worker or a process pool is ended with pgspec."""


def _on_sigterm(signum, frame):
    raise Terminated()


def _handle_sigterm():
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):   # not settable here (an embedding interpreter): the default stays
        return None


def main(argv=None) -> int:
    """Exit codes: 0 success; 1 conformance failures (fail, error, stale deviation); 2 a usage or input
    error, or a limit of the environment such as a full disk or out of memory (one line on stderr, no
    traceback); 3 an internal error of pgspec (traceback saved to a file); 130 interrupted (Ctrl-C).
    A reader that closes stdout early (``pgspec formulas --json | head -1``) changes none of them: the
    rest of the output is dropped, silently."""
    stdout, sys.stdout = sys.stdout, _PipeSafe(sys.stdout)   # the help, the tables, the JSON: all of stdout
    try:
        return _main(argv)
    finally:
        sys.stdout = stdout


def _main(argv) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):    # a bare `pgspec`: the help, as a usage error
        parser.print_help()
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed the usage and one error line
        return e.code if isinstance(e.code, int) else 2
    if args.command is None:    # options only (`pgspec --no-such`): argparse has already refused those
        parser.print_help()
        return 2
    mode = os.environ.get("PGSPEC_COMPARE")
    if mode not in (None, "fast", "exact"):     # read as the comparison core is imported: checked first
        print(f"pgspec {args.command}: PGSPEC_COMPARE must be 'fast' (the default) or 'exact' (every element compared "
              f"in mpmath, spec/tolerance.md), got {mode!r}", file=sys.stderr)
        return 2
    from .base.settings import SettingError, check_environment

    try:    # every PGSPEC_* variable against its range, before any work (docs/bad-input.md)
        for warning in check_environment():
            print(warning, file=sys.stderr)
    except SettingError as e:
        print(f"pgspec {args.command}: {e}", file=sys.stderr)
        return 2
    from .base.gcpause import gc_paused

    with gc_paused():   # the reference and the runner: modules, long-lived, no cycles to collect
        from .verdicts.declarations import DeclarationError
        from .corpus.golden import GoldenError
        from .corpus.namemap import PresetError
        from .run.runner import RunError

    previous = _handle_sigterm()
    try:
        code = args.func(args)
        sys.stdout.flush()      # a reader that closed the pipe is told here, not at the interpreter's exit
        return code
    except BrokenPipeError:     # a write that did not go through sys.stdout: the reader has what it wanted
        _stdout_to_devnull()
        return 0
    except (RunError, GoldenError, PresetError, DeclarationError) as e:
        # a usage error, or a contributor's file (a presets or declarations file) that is malformed: the
        # message names the file and the line; not pgspec's bug
        print(f"pgspec {args.command}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:     # Ctrl-C, or SIGTERM (Terminated): the workers were closed on the way out
        terminated = isinstance(e, Terminated)
        print(f"pgspec {args.command}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except OSError as e:  # the environment (a full disk, a permission), not a bug
        where = f": {e.filename}" if e.filename else ""
        print(f"pgspec {args.command}: {e.strerror or e}{where}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001
        if _out_of_memory(e):   # the machine's limit (host or device memory), not a bug
            hint = ("; memory grows with --shape B x T (and with V x H under --vocab): give a smaller one"
                    if args.command == "check" else "")
            print(f"pgspec {args.command}: out of memory ({_first_line(e)}){hint}", file=sys.stderr)
            return 2
        # a bug of pgspec: say so, save the traceback
        import traceback

        from .run.logs import save
        from .run.runner import _one_line

        text = traceback.format_exc()
        path = save(f"pgspec {' '.join(sys.argv[1:] if argv is None else map(str, argv))}\n\n{text}", "internal-error")
        print(f"pgspec {args.command}: internal error (a bug in pgspec, not in your input): {_one_line(e)}", file=sys.stderr)
        if path:
            print(f"the traceback is saved to {path}; please report it to {ISSUES_URL} with that file", file=sys.stderr)
        else:
            print(text + f"please report this traceback to {ISSUES_URL}", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        if previous is not None:    # main() called in-process (tests, an embedding program): as it was
            import signal

            signal.signal(signal.SIGTERM, previous)


class _PipeSafe:
    """stdout, whose reader may close it early (`pgspec formulas --json | head -1`): the rest of the
    output then goes to /dev/null, silently, and the command ends with its own exit code (a run's
    verdict stands).  Python ignores SIGPIPE, so a write raises BrokenPipeError instead; rich's own
    handling of it exits with 1, the traceback-free but wrong answer to a reader that had enough."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _stdout_to_devnull()
            return len(text)

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            _stdout_to_devnull()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _stdout_to_devnull() -> None:
    """After a broken pipe: what is left in stdout's buffer goes nowhere, silently (Python's own
    advice for SIGPIPE, which it ignores), instead of an 'Exception ignored' at the exit's flush."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):   # stdout is not a file (captured): nothing to redirect
        pass


def _out_of_memory(e: BaseException) -> bool:
    """Host memory (MemoryError) or a device's (torch.cuda.OutOfMemoryError, a RuntimeError)."""
    return isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError"


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
