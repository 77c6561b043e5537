"""Harness overhead of `pgspec run`: wall time / time spent inside the adapter's own work.

    python bench/harness_overhead.py [--adapter torch] [--dtype float64,float32,bfloat16]
                                     [--no-properties] [--verify] [--phases] [--repeat N]

Runs `pgspec run` in this process (the default run unless told otherwise) with the adapter's
methods (``call``, ``available``, ``device_available``, ``capabilities``) and ``torch.autograd.grad``
(the adapter's backward) timed, the outermost entry only, and prints:

- the wall time of the run (from before pgspec and torch are imported, in the order the `pgspec`
  script imports them, to the summary line), the time inside adapter calls and backward passes, and
  their ratio (target <= 1.5 on the default run); and the same ratio with the import of torch (what
  the adapter under test runs on, imported as the run loads the adapter) counted as the adapter's
  work; the harness's own time (neither the adapter's work nor that import), wall and CPU, and the
  ratio a harness costing nothing would give (the import of torch alone);
- the comparison core's counts: elements compared, decided in float64, exact fall-backs (margin
  within the rounding slack), non-finite elements decided exactly, exact ratio evaluations;
- with ``--verify``: the wall time of `pgspec golden verify` in a fresh process (target <= 60 s).
- with ``--repeat N``: N runs, each in a fresh process, each run's figures and their medians (one
  run's figures drift with the machine's load).
- with ``--phases``: where the run's time goes, phase by phase (loading, each dtype's cases and
  property checks, the table), each phase's wall time split into the adapter's work and the
  harness's own; and the harness's own time split by what it does: the comparison core (preparing
  references, gathering results, comparing, exact evaluations), making the input tensors, and the
  rest (timing these adds about a microsecond per call to the harness).

Two things are cached on disk between runs (under PGSPEC_CACHE): the reference results of the
property checks' fixed examples, with their preparation for the comparison (see
conformance/run/properties/_common.py), and each golden file's prepared references, named by the file's
sha256 (conformance/judge/compare.py); ``--cold`` runs with an empty cache (PGSPEC_CACHE set to a new
temporary directory) to show the first run's cost.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import subprocess
import sys
import tempfile
import time

from _args import positive  # bench/_args.py

TARGET_RATIO = 1.5
TARGET_VERIFY = 60.0


def _compile_pgspec() -> str:
    """pgspec's modules compiled to bytecode, as any installation has them after its first import.
    Where the environment sets PYTHONDONTWRITEBYTECODE, Python never writes that cache, and every run
    would compile pgspec's modules again on import (0.3 to 0.4 s on the 2-core machine): not a cost of
    the harness. So they are compiled here first, before anything is timed."""
    if not sys.dont_write_bytecode:
        return ""
    import compileall
    import importlib.util

    ok = 0
    for name in ("pgspec.conformance", "pgspec.reference", "pgspec.adapters"):
        spec = importlib.util.find_spec(name)
        for d in (spec.submodule_search_locations or []) if spec else []:
            ok += bool(compileall.compile_dir(d, quiet=1))
    return ("PYTHONDONTWRITEBYTECODE is set: pgspec's modules were compiled to bytecode before timing, as an "
            "installation or a first import leaves them" if ok else "")


def _time_phases(phases: list, inside: dict, runner) -> None:
    """Time the run's phases (runner's functions, as cli.main calls them) into ``phases``."""
    from pgspec.conformance import report

    def timed(module, name, label):
        real = getattr(module, name)

        def wrapper(*a, **k):
            t, before = time.perf_counter(), inside["call"] + inside["backward"] + inside["methods"]
            try:
                return real(*a, **k)
            finally:
                dtype = next((x for x in a if x in ("float64", "float32", "bfloat16", "float16")), "")
                phases.append((f"{label} {dtype}".strip(), time.perf_counter() - t,
                               inside["call"] + inside["backward"] + inside["methods"] - before))

        setattr(module, name, wrapper)

    timed(runner, "load_adapter", "load the adapter")
    timed(runner, "check_declarations", "check the declarations")
    timed(runner, "select_cases", "select the cases")
    timed(runner, "run_cases", "cases")
    timed(runner, "property_results", "property checks")
    timed(report, "print_matrix", "the table")


# The harness's own work, by what it does (``--phases``): each entry point of the comparison core and
# of the call convention, (module, function) as the runner and the property checks reach them
# (module attributes), timed where it is entered first (a nested entry is inside its caller's time).
_PARTS = {
    "the comparison core": [("compare", name) for name in (
        "compare_cases", "gather_case", "compare_output", "compare_prepared", "prepare", "_gather",
        "compare_deferred", "largest_ratio")],
    # the runner's to_tensors is reached only from inside case_tensors
    "the input tensors": [("runner", "case_tensors"), ("compare", "to_tensors")],
}


def _time_parts(parts: dict, inside: dict, runner, compare) -> None:
    """Time the harness's parts (``_PARTS``) into ``parts``: wall time minus any adapter work inside."""
    modules = {"compare": compare, "runner": runner}
    depth = [0]

    def adapter_time():
        return inside["call"] + inside["backward"] + inside["methods"]

    for label, entries in _PARTS.items():
        parts[label] = 0.0
        for module, name in entries:
            real = getattr(modules[module], name)

            def wrapper(*a, _real=real, _label=label, **k):
                if depth[0]:
                    return _real(*a, **k)
                depth[0] += 1
                t, before = time.perf_counter(), adapter_time()
                try:
                    return _real(*a, **k)
                finally:
                    depth[0] -= 1
                    parts[_label] += time.perf_counter() - t - (adapter_time() - before)

            setattr(modules[module], name, wrapper)


def _print_parts(parts: dict, harness: float) -> None:
    print(f"the harness's own time, {harness:.2f} s, by what it does:")
    for label, t in parts.items():
        print(f"  {label:<24} {t:6.2f} s")
    print(f"  {'the rest':<24} {harness - sum(parts.values()):6.2f} s  (loading, the property checks' own "
          "work, bookkeeping, the table)")


def _print_phases(phases: list, wall: float, t_torch: float, adapter_time: float) -> None:
    print(f"{'phase':<28} {'wall s':>7} {'adapter s':>9} {'harness s':>9}")
    # the adapter's loading imports torch: its row shows the rest of the loading
    rows = [("import torch", t_torch, t_torch)] + [
        (label, w - t_torch if label == "load the adapter" else w, a) for label, w, a in phases]
    for label, w, a in rows:
        print(f"{label:<28} {w:7.2f} {a:9.2f} {w - a:9.2f}")
    rest = wall - sum(w for _, w, _ in rows)
    rest_adapter = adapter_time - sum(a for _, _, a in phases)
    print(f"{'the rest (pgspec imports...)':<28} {rest:7.2f} {rest_adapter:9.2f} {rest - rest_adapter:9.2f}")
    print("(import torch is counted in the adapter column here: the ratio with it counted)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapter", default="torch")
    parser.add_argument("--dtype", default="float64,float32,bfloat16")
    parser.add_argument("--formulas", default="*")
    parser.add_argument("--no-properties", action="store_true")
    parser.add_argument("--verify", action="store_true", help="also time `pgspec golden verify`")
    parser.add_argument("--cold", action="store_true", help="empty caches (the first run on a machine)")
    parser.add_argument("--phases", action="store_true", help="the time of each phase of the run")
    parser.add_argument("--repeat", type=positive, default=1, metavar="N",
                        help="N runs, each in a fresh process, and the median of each figure")
    parser.add_argument("--figures", metavar="PATH", help=argparse.SUPPRESS)   # --repeat's runs write here
    args = parser.parse_args()
    if args.repeat > 1:
        return _repeat(args)
    if args.cold:
        os.environ["PGSPEC_CACHE"] = tempfile.mkdtemp(prefix="pgspec-cache-")
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    note = _compile_pgspec()
    if note:
        print(note)

    t_start = time.perf_counter()
    c_start = time.process_time()
    load_before = os.getloadavg()[0]
    # what the `pgspec` script does, in its order: import the CLI, whose main() imports the runner
    # with the collector paused and loads the adapter (torch with it) inside the run (see
    # gcpause.RunCollector).  Importing torch first instead would cost a collector pass over all of
    # torch's objects while pgspec's modules are imported (about 0.17 s), which no user's run pays.
    from pgspec.conformance import cli
    from pgspec.conformance.base.gcpause import gc_paused

    with gc_paused():
        from pgspec.conformance.judge import compare
        from pgspec.conformance.run import runner

    inside = {"call": 0.0, "backward": 0.0, "methods": 0.0, "calls": 0, "cpu": 0.0}
    torch_import = {}       # the import of torch, timed where the run makes it: loading the adapter
    depth = [0]     # only the outermost adapter entry is timed (an adapter's call may run autograd itself)

    def timed(fn, key, count=False):
        def wrapper(*a, **k):
            if depth[0]:
                return fn(*a, **k)
            depth[0] += 1
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
                inside[key] += time.perf_counter() - t
                inside["cpu"] += time.process_time() - c
                inside["calls"] += count

        return wrapper

    real_load = runner.load_adapter
    grads = []      # (torch.autograd, the real grad), restored after the run

    def load_timed(spec):
        t, c = time.perf_counter(), time.process_time()
        import torch
        torch_import["wall"], torch_import["cpu"] = time.perf_counter() - t, time.process_time() - c
        if not grads:
            grads.append((torch.autograd, torch.autograd.grad))
            torch.autograd.grad = timed(torch.autograd.grad, "backward")
        adapter = real_load(spec)
        adapter.call = timed(adapter.call, "call", count=True)
        # the adapter's other methods are its own code too (a framework adapter may import its
        # framework in available())
        for name in ("available", "device_available", "capabilities"):
            setattr(adapter, name, timed(getattr(adapter, name), "methods"))
        return adapter

    runner.load_adapter = load_timed
    phases: list = []      # (phase, wall, adapter time inside it)
    parts: dict = {}       # the harness's own time by what it does
    if args.phases:
        _time_phases(phases, inside, runner)
        _time_parts(parts, inside, runner, compare)
    argv = ["run", "--adapter", args.adapter, "--dtype", args.dtype, "--formulas", args.formulas]
    if args.no_properties:
        argv.append("--no-properties")
    compare.STATS.reset()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(argv)
    wall = time.perf_counter() - t_start
    cpu = time.process_time() - c_start
    for module, real_grad in grads:
        module.grad = real_grad
    t_torch, c_torch = torch_import.get("wall", 0.0), torch_import.get("cpu", 0.0)
    adapter_time = inside["call"] + inside["backward"] + inside["methods"]
    summary = out.getvalue().strip().splitlines()[-1] if out.getvalue().strip() else ""
    if rc not in (0, 1) or not adapter_time:      # a usage error (said on stderr) or nothing run: no figures
        print(f"pgspec {' '.join(argv)}: exit {rc}, no adapter work timed; no figures", file=sys.stderr)
        return 2
    ratio = wall / adapter_time if adapter_time else float("inf")
    s = compare.STATS
    print(f"pgspec {' '.join(argv)}: exit {rc}, {summary}")
    print(f"wall {wall:.2f} s (imports included); inside the adapter {adapter_time:.2f} s "
          f"({inside['calls']} calls {inside['call']:.2f} s + backward {inside['backward']:.2f} s + the adapter's "
          f"other methods {inside['methods']:.2f} s)")
    print(f"harness overhead ratio (wall / adapter): {ratio:.2f}  target <= {TARGET_RATIO}  "
          f"{'ok' if ratio <= TARGET_RATIO else 'OVER TARGET'}")
    # torch is what the adapter under test runs on (the built-in backend is torch; a framework adapter
    # imports its framework on top): the ratio with that import counted as the adapter's own work
    with_import = wall / (adapter_time + t_torch) if adapter_time else float("inf")
    print(f"import torch {t_torch:.2f} s wall ({c_torch:.2f} s CPU); ratio with it counted as the adapter's work: "
          f"{with_import:.2f}  {'ok' if with_import <= TARGET_RATIO else 'over target'}")
    # the harness's own time: everything that is neither the adapter's work nor the import of torch
    harness, harness_cpu = wall - adapter_time - t_torch, cpu - inside["cpu"] - c_torch
    print(f"the harness's own time {harness:.2f} s wall ({harness_cpu:.2f} s CPU), {harness / adapter_time:.2f} of the "
          f"adapter's; a harness costing nothing would still give a ratio of {(adapter_time + t_torch) / adapter_time:.2f} "
          f"(the import of torch)")
    # on a shared machine other processes stretch wall times; CPU times show the same ratio unstretched
    cpu_ratio = cpu / inside["cpu"] if inside["cpu"] else float("inf")
    print(f"CPU: process {cpu:.2f} s, inside the adapter {inside['cpu']:.2f} s, ratio {cpu_ratio:.2f}; "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after ({os.cpu_count()} CPUs)")
    print(f"comparison core: {s.elements} elements, {s.fast} decided in float64, {s.fallbacks} exact fall-backs, "
          f"{s.special} non-finite decided exactly, {s.small} in outputs of <= {compare.SMALL} elements compared exactly, "
          f"{s.ratio_evals} exact ratio evaluations")
    if args.phases:
        _print_phases(phases, wall, t_torch, adapter_time)
        _print_parts(parts, harness)
    figures = {"wall": wall, "adapter": adapter_time, "ratio": ratio, "import torch": t_torch,
               "ratio with the import": with_import, "CPU ratio": cpu_ratio, "harness": harness,
               "harness CPU": harness_cpu, "exit": rc}
    if args.figures:
        import json

        with open(args.figures, "w") as fh:
            json.dump(figures, fh)
    else:
        # one run is its own median: the line --repeat N prints, which harness_overhead_frameworks.py
        # reads (with --repeat 1 it found none and printed no figure)
        print(_median_line([figures]))
    if args.verify:
        t = time.perf_counter()
        v = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "golden", "verify"],
                           capture_output=True, text=True)
        dt = time.perf_counter() - t
        last = (v.stdout.strip().splitlines() or [""])[-1]
        print(f"pgspec golden verify: exit {v.returncode}, {dt:.1f} s  target <= {TARGET_VERIFY:.0f} s  "
              f"{'ok' if dt <= TARGET_VERIFY else 'OVER TARGET'}  ({last})")
    return 0


def _median_line(runs: list) -> str:
    import statistics

    median = {name: statistics.median(r[name] for r in runs) for name in runs[0] if name != "exit"}
    return f"median of {len(runs)}: " + ", ".join(f"{name} {value:.2f}" for name, value in median.items())


def _repeat(args) -> int:
    """``--repeat N``: the bench N times, each run in a fresh process (imports included, as a user's
    run pays them), then the median of each figure: on a shared machine one run's figures drift."""
    import json
    import statistics

    argv = [sys.executable, os.path.abspath(__file__), "--adapter", args.adapter, "--dtype", args.dtype,
            "--formulas", args.formulas] + (["--no-properties"] if args.no_properties else []) \
        + (["--cold"] if args.cold else [])
    runs = []
    for k in range(args.repeat):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "figures.json")
            p = subprocess.run(argv + ["--figures", path], capture_output=True, text=True)
            if p.returncode != 0 or not os.path.exists(path):
                print(p.stdout + p.stderr, file=sys.stderr)
                print(f"run {k + 1} failed (exit {p.returncode})", file=sys.stderr)
                return 1
            with open(path) as fh:
                runs.append(json.load(fh))
        r = runs[-1]
        print(f"run {k + 1}: " + ", ".join(f"{name} {value:.2f}" for name, value in r.items() if name != "exit"))
    median = {name: statistics.median(r[name] for r in runs) for name in runs[0] if name != "exit"}
    print(_median_line(runs))
    print(f"harness overhead ratio (median): {median['ratio']:.2f}, with the torch import counted "
          f"{median['ratio with the import']:.2f}  target <= {TARGET_RATIO}  "
          f"{'ok' if median['ratio'] <= TARGET_RATIO else 'OVER TARGET'}")
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
