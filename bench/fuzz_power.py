"""Power of `pgspec fuzz` without the corpus: how many mutants of the built-in backend does it kill?

    python bench/fuzz_power.py --mutants 160 --skip-equivalent     # seed 1, one CPU minute per mutant
    python bench/fuzz_power.py --mutants 20 --seconds 30 --corpus --json out.json

The mutants are bench/mutation_score.py's (the same ``sample(n, seed)``: evenly over the ten family
files of ``adapters/torch``).  Each runs in its own process: the unmutated backend is loaded first
and kept as the fuzzer's float64 oracle (``fuzz.judge.set_oracle``), then the backend is imported
again with the one mutated module (the import hook of mutation_score.py) and fuzzed in float64 on the
formulas of the mutated family, of every family whose module imports the mutated one (``dist`` and
``surrogate`` call ``agg``'s code, ``mask`` calls ``is_``'s), and on the ``loss.*`` recipes.  The budget, ``--seconds`` of the process's CPU time (on a shared machine wall time says little
about power), is shared by those formulas round by round: one round of 25 examples of every formula
(hypothesis seed = the round number, as the engine's own rounds), then the next round, until the
budget is spent or a counterexample is found; counterexamples are not shrunk (``--shrink`` to shrink
them).  ``golden.load_all`` raises in that process: the fuzzer never reads the golden files.

An adapter call that does not return within 5 s is the example's error (``pgspec fuzz
--case-timeout``), so a mutant that loops forever on one example is killed by that example.
A mutant is *killed* when the fuzzer confirms a counterexample (the runner's ``fail`` or ``error`` on
the example made a golden record, with the backend's declarations applied) on which the unmutated
backend passes (the same example confirmed again against it), or when it returns on one of the
fuzzer's invalid examples (``not-rejected``, ``fuzz.examples.broken``) that the unmutated backend
rejects, as mutation_score.py counts a corpus case's ``not-rejected``; a mutant that crashes on import is
killed too, one that runs past ``--timeout`` CPU seconds (an endless loop) is a ``timeout``, not
killed.  ``--baseline`` first prints what the fuzz of the unmutated backend finds on every formula.

With ``--corpus`` each mutant is also run as mutation_score.py runs it (the golden corpus and the
property checks), so the two kill rates are over the same mutants.  Output: one line per mutant,
then the kill counts, both rates and the mutants each one kills that the other misses.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import mutation_score as ms  # noqa: E402
from _args import positive  # noqa: E402

ROUND = 25      # conformance/fuzz/engine.py's ROUND (the bench does not import pgspec itself)

WORKER = r'''
import importlib, importlib.abc, importlib.util, json, resource, sys, time
family, index, memory, examples, seconds, shrink = (sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[5]),
                                                   float(sys.argv[6]), int(sys.argv[7]))
resource.setrlimit(resource.RLIMIT_AS, (int(memory * 2**30), int(memory * 2**30)))
cpu = int(float(sys.argv[8]))       # a mutant that hangs (an endless loop) is stopped by SIGXCPU
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
sys.path.insert(0, sys.argv[4])
import mutation_score as ms
import torch
torch.set_num_threads(1)
from pgspec.conformance.corpus import golden
def _no_golden(*a, **k):
    raise AssertionError("the fuzzer read the golden files")
golden.load_all = _no_golden
golden.load_family = _no_golden
from pgspec.conformance.run.loading import load_adapter
from pgspec.conformance.fuzz import engine, judge
from pgspec.conformance.run import untrusted
# one call's time limit, as `pgspec fuzz --case-timeout`: a mutant that hangs on one example (an endless
# loop) gives that example's error, a counterexample, instead of using up the whole budget.  A call of the
# backend on a fuzz example takes milliseconds; a hang costs this limit several times over (the judge,
# the confirmation, hypothesis' replay), all within the process's CPU limit (--timeout)
untrusted.CASE_TIMEOUT, untrusted.CASE_TIMEOUT_OPTION = 5.0, "fuzz_power.py's time limit of one call"
oracle = load_adapter("torch")                      # unmutated: the fuzzer's float64 oracle
judge.set_oracle(oracle)
for name in [m for m in sys.modules if m == "pgspec.adapters.torch" or m.startswith("pgspec.adapters.torch.")]:
    del sys.modules[name]
source, mutant = ms.mutate(family, index)
target = f"pgspec.adapters.torch.{family}"

class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target_=None):
        if fullname == target:
            return importlib.util.spec_from_loader(fullname, self, origin=f"<mutant {mutant.key}>")
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.__file__ = str(ms.TORCH / f"{family}.py")
        module.__package__ = "pgspec.adapters.torch"
        exec(compile(source, module.__file__, "exec"), module.__dict__)

sys.meta_path.insert(0, Finder())
out = {"killed": None, "formulas": 0, "examples": 0, "found": {}, "unmutated_fails": {}}
try:
    adapter = importlib.import_module("pgspec.adapters.torch").make_adapter()
except Exception as e:
    out["killed"] = f"crashed on import: {type(e).__name__}: {e}"
    print(json.dumps(out)); sys.exit(0)
assert adapter.implementations is not oracle.implementations
fam = {"is_": "is"}.get(family, family)
caps = sorted(adapter.capabilities())
# the mutated family's formulas, those of every family whose module imports the mutated one (dist and
# surrogate call agg's code, mask is_'s), and the loss.* recipes, which call every family
import re as _re
callers = sorted({{"is_": "is"}.get(p.stem, p.stem) for p in ms.TORCH.glob("*.py") if p.stem != family and
                  _re.search(rf"^from \.(?: import .*\b{family}\b|{family} import)", p.read_text(), _re.M)})
formulas = [f for f in caps if f.startswith(fam + ".")] + [f for f in caps if f.split(".")[0] in callers and
                                                         f.split(".")[0] != "loss"]
formulas += [f for f in caps if f.startswith("loss.") and fam != "loss"]
if shrink == 0:     # a kill needs one counterexample, not the smallest: no shrinking, by hypothesis or by hand
    engine.SHRINK_SECONDS = 0.0
    engine._trimmed = lambda adapter, f, dtype, device: f
if index < 0:       # the unmutated backend: every formula once
    formulas = caps
clock = time.process_time       # the budget is this process's CPU time: on a shared machine, wall time is not power
wall0 = time.monotonic()
deadline = clock() + seconds
active, rnd = list(formulas), 0
while active and clock() < deadline and rnd * engine.ROUND < examples:
    # round robin: one round of ROUND examples (hypothesis seed = the round, as the engine's own rounds)
    # per formula, until the mutant's budget is spent, so that every formula gets its share
    for fid in list(active):
        if clock() >= deadline and not (index < 0 and rnd == 0):
            break
        r = engine.fuzz_formula(adapter, fid, "float64", budget=0.0, seed=rnd, max_examples=engine.ROUND,
                                database=False)
        out["examples"] += r.examples
        if r.examples == 0:
            active.remove(fid)
        for e in r.not_rejected_examples:
            # an invalid example the mutant returns on: a kill when the unmutated backend rejects it
            # (mutation_score.py counts a corpus case's not-rejected the same way)
            base = judge.confirm(oracle, fid, {"params": e["params"], "inputs": e["inputs"],
                                               "expect_error": {"argument": e["argument"], "rule": e["rule"]}},
                                 "float64").outcome
            if base == "rejected":
                out["found"][fid] = f"not-rejected: {e['argument']}: {e['rule']}: {e['message'][:160]}"
                out["killed"] = f"{fid}: {out['found'][fid]}"
                break
        if out["killed"]:
            active = []
            break
        if not r.findings:
            continue
        f = r.findings[0]
        out["found"][fid] = f"{f.outcome}: {f.message.splitlines()[0][:160]}"
        active.remove(fid)
        if index >= 0:
            # the same example on the unmutated backend: a kill only when it passes there
            try:
                base = judge.confirm(oracle, fid, {"params": f.params, "inputs": f.inputs}, "float64")
                base = base.outcome
            except Exception as e:
                base = f"raised {type(e).__name__}: {e}"
            if base in ("fail", "error") or base.startswith("raised"):
                out["unmutated_fails"][fid] = base
                continue
            out["killed"] = f"{fid}: {out['found'][fid]}"
            active = []
            break
    rnd += 1
out["formulas"] = len(formulas)
out["rounds"] = rnd
out["seconds"] = round(clock() - deadline + seconds, 1)
out["wall"] = round(time.monotonic() - wall0, 1)
print(json.dumps(out))
'''


def fuzz_worker(family, index, examples, seconds, timeout, memory, shrink=False):
    """The worker's JSON answer, or (None, why): "timeout" when it ran past ``timeout`` CPU seconds (or ten
    times that in wall time)."""
    try:
        p = subprocess.run([sys.executable, "-c", WORKER, family, str(index), str(memory), str(Path(__file__).parent),
                            str(examples), str(seconds), str(int(shrink)), str(timeout)], capture_output=True,
                           text=True, timeout=10 * timeout, cwd=ms.ROOT)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    if p.returncode in (-signal.SIGXCPU, -signal.SIGKILL):
        return None, "timeout"
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return json.loads(lines[-1]), ""


def baseline(examples, seconds, timeout, memory) -> None:
    """Print what the fuzz of the unmutated backend finds (every formula, at least one round each)."""
    base, why = fuzz_worker("loss", -1, examples, seconds, timeout * 4, memory)
    if base is None:
        raise SystemExit(f"the unmutated backend's fuzz did not finish: {why}")
    print(f"unmutated backend: {base['formulas']} formulas, {base['examples']} examples in {base['seconds']} s, "
          f"findings: {base['found'] or 'none'}", flush=True)


def fuzz_mutant(m, examples, seconds, timeout, memory, shrink=False):
    """('killed' | 'survived' | 'timeout', detail, seconds)."""
    t0 = time.perf_counter()
    answer, why = fuzz_worker(m.family, m.index, examples, seconds, timeout, memory, shrink)
    took = time.perf_counter() - t0
    if answer is None:
        if why == "timeout":
            return "timeout", f"no verdict within {timeout:.0f} CPU s", took
        return "killed", f"the mutant crashed in the harness: {why}", took
    also = "; the unmutated backend fails too on: " + ", ".join(answer["unmutated_fails"]) \
        if answer["unmutated_fails"] else ""
    if answer["killed"]:
        return "killed", answer["killed"] + also, took
    return "survived", (f"{answer['formulas']} formulas, {answer['rounds']} rounds, {answer['examples']} examples "
                        f"in {answer['seconds']} s CPU ({answer['wall']} s wall){also}"), took


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutants", type=positive, default=160, help="sample size (default 160, as mutation_score.py)")
    ap.add_argument("--seed", type=int, default=1, help="mutant sampling seed, as mutation_score.py (default 1)")
    ap.add_argument("--seconds", type=float, default=60.0,
                    help="fuzzing budget per mutant in CPU seconds of its process, shared by its formulas round by round (default 60)")
    ap.add_argument("--examples", type=positive, default=100000, help="at most this many examples per formula")
    ap.add_argument("--timeout", type=float, default=None,
                    help="CPU seconds per mutant's process, startup included (default: --seconds + 120); "
                         "ten times that in wall time")
    ap.add_argument("--shrink", action="store_true", help="shrink each counterexample (slower; not needed for a kill)")
    ap.add_argument("--baseline", action="store_true",
                    help="first fuzz the unmutated backend (every formula, one round at least) and print its findings")
    ap.add_argument("--memory-gb", type=float, default=4.0, help="address-space limit per mutant (default 4)")
    ap.add_argument("--corpus", action="store_true", help="also run the corpus on each mutant (mutation_score.py)")
    ap.add_argument("--start", type=int, default=0,
                    help="skip the first START mutants of the sample (to split a long run) (default 0)")
    ap.add_argument("--only", action="append", default=[], metavar="KEY",
                    help="only the mutants whose key contains KEY (repeatable)")
    ap.add_argument("--skip-equivalent", action="store_true",
                    help="leave out the mutants bench/mutation_equivalents.toml lists (they count in no rate)")
    ap.add_argument("--json", type=Path, default=None, help="also write every mutant's outcomes as JSON")
    args = ap.parse_args(argv)
    if args.timeout is None:
        args.timeout = args.seconds + 120.0
    sampled = ms.sample(args.mutants, args.seed)
    position = {m.key: k for k, m in enumerate(sampled, 1)}
    chosen = sampled[args.start:]
    if args.only:
        chosen = [m for m in chosen if any(k in m.key for k in args.only)]
    equivalents = ms.load_equivalents()
    skipped = 0
    if args.skip_equivalent:
        skipped = sum(m.key in equivalents for m in chosen)
        chosen = [m for m in chosen if m.key not in equivalents]
    print(f"{len(chosen)} mutants (mutation_score.py sample, seed {args.seed}); fuzz: float64, {args.seconds:g} CPU s per "
          f"mutant in rounds of {ROUND} examples per formula (round k: hypothesis seed k){'; corpus too' if args.corpus else ''}"
          f"{f'; {skipped} listed equivalent left out' if skipped else ''}", flush=True)
    if args.baseline:
        baseline(args.examples, args.seconds, args.timeout, args.memory_gb)
    rows = []
    start = time.perf_counter()
    for k, m in enumerate(chosen, 1):
        outcome, detail, took = fuzz_mutant(m, args.examples, args.seconds, args.timeout, args.memory_gb, args.shrink)
        row = {"mutant": m.key, "fuzz": outcome, "fuzz_detail": detail, "fuzz_seconds": round(took, 1)}
        if args.corpus:
            t0 = time.perf_counter()
            c, cd = ms.run_mutant(m, 10 * args.timeout, args.memory_gb)     # mutation_score's timeout is wall time
            row.update(corpus=c, corpus_detail=cd, corpus_seconds=round(time.perf_counter() - t0, 1))
        row["equivalent"] = m.key in equivalents
        rows.append(row)
        corpus = f" | corpus {row['corpus']:8s} ({row['corpus_seconds']:.0f} s)" if args.corpus else ""
        print(f"[{k}/{len(chosen)}] (sample #{position[m.key]}) fuzz {outcome:8s} ({took:.0f} s){corpus} {m.key}: {detail[:140]}", flush=True)
    relevant = [r for r in rows if not r["equivalent"]]
    fk = sum(r["fuzz"] == "killed" for r in relevant)
    print()
    print(f"mutants: {len(rows)} ({len(rows) - len(relevant)} listed equivalent); fuzz kills {fk}/{len(relevant)} = "
          f"{100 * fk / max(1, len(relevant)):.1f}% in {sum(r['fuzz_seconds'] for r in rows):.0f} s")
    if args.corpus:
        ck = sum(r["corpus"] == "killed" for r in relevant)
        print(f"corpus kills {ck}/{len(relevant)} = {100 * ck / max(1, len(relevant)):.1f}% in "
              f"{sum(r['corpus_seconds'] for r in rows):.0f} s")
        for r in relevant:
            if r["corpus"] != "killed" and r["fuzz"] == "killed":
                print(f"  fuzz only:   {r['mutant']}: {r['fuzz_detail'][:160]}")
        for r in relevant:
            if r["corpus"] == "killed" and r["fuzz"] != "killed":
                print(f"  corpus only: {r['mutant']}")
        both_miss = [r for r in relevant if r["corpus"] != "killed" and r["fuzz"] != "killed"]
        for r in both_miss:
            print(f"  neither:     {r['mutant']} (corpus: {r['corpus']})")
    else:
        for r in relevant:
            if r["fuzz"] != "killed":
                print(f"  fuzz misses: {r['mutant']}")
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
