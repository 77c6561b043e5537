"""Power of `pgspec fuzz` without the corpus: how many mutants of the built-in backend does it kill?

    python bench/fuzz_power.py                          # 20 mutants (seed 1), 60 examples per formula
    python bench/fuzz_power.py --mutants 40 --examples 100 --corpus --json out.json

The mutants are bench/mutation_score.py's (the same ``sample(n, seed)``: evenly over the ten family
files of ``adapters/torch``).  Each runs in its own process: the unmutated backend is loaded first
and kept as the fuzzer's float64 oracle (``fuzz.judge.set_oracle``), then the backend is imported
again with the one mutated module (the import hook of mutation_score.py) and fuzzed on the formulas
of the mutated family and on the ``loss.*`` recipes (what mutation_score runs the corpus on), in
float64, each formula for at most ``--examples`` examples (seed 0) or ``--seconds``, stopping at the
first counterexample.  ``golden.load_all`` raises in that process: the fuzzer never reads the golden
files.  A mutant is *killed* when the fuzzer confirms a counterexample (the runner's ``fail`` or
``error`` on the example made a golden record, with the backend's declarations applied) on a formula
whose fuzz of the unmutated backend (every formula once, same seed, same cap) finds none; a mutant
that crashes on import is killed too.

With ``--corpus`` each mutant is also run as mutation_score.py runs it (the golden corpus and the
property checks), so the two kill rates are over the same mutants.  Output: one line per mutant,
then the kill counts, both rates and the mutants each one kills that the other misses.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import mutation_score as ms  # noqa: E402
from _args import positive  # noqa: E402

WORKER = r'''
import importlib, importlib.abc, importlib.util, json, resource, sys, time
family, index, memory, examples, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[5]), float(sys.argv[6])
resource.setrlimit(resource.RLIMIT_AS, (int(memory * 2**30), int(memory * 2**30)))
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
out = {"killed": None, "formulas": 0, "examples": 0, "found": {}}
try:
    adapter = importlib.import_module("pgspec.adapters.torch").make_adapter()
except Exception as e:
    out["killed"] = f"crashed on import: {type(e).__name__}: {e}"
    print(json.dumps(out)); sys.exit(0)
assert adapter.implementations is not oracle.implementations
fam = {"is_": "is"}.get(family, family)
caps = sorted(adapter.capabilities())
formulas = [f for f in caps if f.startswith(fam + ".")] + [f for f in caps if f.startswith("loss.") and fam != "loss"]
if index < 0:       # the unmutated backend: every formula once, for every mutant
    formulas = caps
for fid in formulas:
    r = engine.fuzz_formula(adapter, fid, "float64", budget=seconds, seed=0, max_examples=examples, database=False)
    out["formulas"] += 1
    out["examples"] += r.examples
    if r.findings:
        f = r.findings[0]
        out["found"][fid] = f"{f.outcome}: {f.message.splitlines()[0][:160]}"
        if index >= 0:
            break
print(json.dumps(out))
'''


def fuzz_worker(family, index, examples, seconds, timeout, memory):
    try:
        p = subprocess.run([sys.executable, "-c", WORKER, family, str(index), str(memory), str(Path(__file__).parent),
                            str(examples), str(seconds)], capture_output=True, text=True, timeout=timeout, cwd=ms.ROOT)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return None, (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return json.loads(lines[-1]), ""


_BASE: dict = {}


def baseline(examples, seconds, timeout, memory) -> dict:
    """{formula: finding} of the fuzz of the unmutated backend (every formula, the same seed and cap)."""
    if "found" not in _BASE:
        base, why = fuzz_worker("loss", -1, examples, seconds, timeout * 4, memory)
        if base is None:
            raise SystemExit(f"the unmutated backend's fuzz did not finish: {why}")
        _BASE["found"] = base["found"]
        print(f"unmutated backend: {base['formulas']} formulas, {base['examples']} examples, findings: "
              f"{base['found'] or 'none'} (a formula listed here does not count as a kill)", flush=True)
    return _BASE["found"]


def fuzz_mutant(m, examples, seconds, timeout, memory):
    """('killed' | 'survived' | 'timeout', detail, seconds)."""
    base = baseline(examples, seconds, timeout, memory)
    t0 = time.perf_counter()
    answer, why = fuzz_worker(m.family, m.index, examples, seconds, timeout, memory)
    took = time.perf_counter() - t0
    if answer is None:
        if why == "timeout":
            return "timeout", f"no verdict within {timeout:.0f} s", took
        return "killed", f"the mutant crashed in the harness: {why}", took
    if answer["killed"]:
        return "killed", answer["killed"], took
    new = {fid: d for fid, d in answer["found"].items() if fid not in base}
    if new:
        fid, d = next(iter(new.items()))
        return "killed", f"{fid}: {d}", took
    return "survived", f"{answer['formulas']} formulas, {answer['examples']} examples", took


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutants", type=positive, default=20, help="sample size (default 20)")
    ap.add_argument("--seed", type=int, default=1, help="mutant sampling seed, as mutation_score.py (default 1)")
    ap.add_argument("--examples", type=positive, default=60, help="examples per formula (default 60)")
    ap.add_argument("--seconds", type=float, default=20.0, help="at most this long per formula (default 20)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutant (default 600)")
    ap.add_argument("--memory-gb", type=float, default=4.0, help="address-space limit per mutant (default 4)")
    ap.add_argument("--corpus", action="store_true", help="also run the corpus on each mutant (mutation_score.py)")
    ap.add_argument("--start", type=int, default=0,
                    help="skip the first START mutants of the sample (to split a long run) (default 0)")
    ap.add_argument("--only", action="append", default=[], metavar="KEY",
                    help="only the mutants whose key contains KEY (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="also write every mutant's outcomes as JSON")
    args = ap.parse_args(argv)
    chosen = ms.sample(args.mutants, args.seed)[args.start:]
    if args.only:
        chosen = [m for m in chosen if any(k in m.key for k in args.only)]
    equivalents = ms.load_equivalents()
    print(f"{len(chosen)} mutants (mutation_score.py sample, seed {args.seed}); fuzz: float64, at most "
          f"{args.examples} examples or {args.seconds:g} s per formula, seed 0{'; corpus too' if args.corpus else ''}")
    rows = []
    start = time.perf_counter()
    for k, m in enumerate(chosen, 1):
        outcome, detail, took = fuzz_mutant(m, args.examples, args.seconds, args.timeout, args.memory_gb)
        row = {"mutant": m.key, "fuzz": outcome, "fuzz_detail": detail, "fuzz_seconds": round(took, 1)}
        if args.corpus:
            t0 = time.perf_counter()
            c, cd = ms.run_mutant(m, args.timeout, args.memory_gb)
            row.update(corpus=c, corpus_detail=cd, corpus_seconds=round(time.perf_counter() - t0, 1))
        row["equivalent"] = m.key in equivalents
        rows.append(row)
        corpus = f" | corpus {row['corpus']:8s} ({row['corpus_seconds']:.0f} s)" if args.corpus else ""
        print(f"[{k}/{len(chosen)}] fuzz {outcome:8s} ({took:.0f} s){corpus} {m.key}: {detail[:140]}", flush=True)
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
