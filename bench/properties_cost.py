"""Print what the property checks add to `pgspec run` against the torch backend.

    python bench/properties_cost.py [--adapter torch] [--dtypes float64,float32,bfloat16] [--device cpu]

Reports, per dtype, the wall time of ``run_properties`` over every property and formula (the first
dtype pays for the reference evaluations, which are cached and shared by the others), the result
counts, and the total for all dtypes.  Also times the reference property suite in the CI profile
(hypothesis, derandomized, 10 examples per formula) unless --no-reference is given.  Budget: the
adapter checks must add <= 10 s for three dtypes on a 2-core CPU; the reference suite <= ~60 s.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--adapter", default="torch")
    ap.add_argument("--dtypes", default="float64,float32,bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args()

    from pgspec.conformance.run import properties as P
    from pgspec.conformance.run import runner

    adapter = runner.load_adapter(args.adapter)
    print(f"adapter {adapter.name} ({adapter.version}), device {args.device}, {os.cpu_count()} CPU(s)")
    t_all = time.perf_counter()
    for dtype in args.dtypes.split(","):
        t = time.perf_counter()
        results = P.run_properties(adapter, dtype, args.device)
        dt = time.perf_counter() - t
        counts = Counter(r.outcome for r in results)
        worst = max((r.error_ratio or 0.0) for r in results if r.outcome == "pass")
        print(f"  {dtype:9s} {dt:6.2f} s  {len(results)} (property, formula) results {dict(counts)}  "
              f"worst passing error ratio {worst:.3f}")
        for r in results:
            if r.outcome in ("fail", "error"):
                print(f"      {r.outcome}: {r.property} {r.formula}: {r.message.splitlines()[0][:160]}")
    total = time.perf_counter() - t_all
    print(f"adapter property checks, all dtypes: {total:.2f} s (budget 10 s)")
    if not args.no_reference:
        t = time.perf_counter()
        for pid in P.PROPERTIES:
            t1 = time.perf_counter()
            P.check_reference(pid, derandomize=True, max_examples=10)
            print(f"  reference {pid:26s} {time.perf_counter() - t1:6.2f} s")
        print(f"reference property suite (CI profile, 10 examples per formula): {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()
