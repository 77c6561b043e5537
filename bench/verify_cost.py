"""`pgspec golden verify` from scratch: wall time and CPU time (target: wall <= 60 s on the 2-core machine).

    python bench/verify_cost.py [--cached]

Runs `pgspec golden verify --no-cache` (every case evaluated afresh: the same byte-identical check
as CI's) in a fresh process and prints its wall time, the CPU time of the process and its worker
processes, the number of workers (PGSPEC_JOBS, else the CPU count) and the load average before and
after, since other processes on a shared machine stretch the wall time but not the CPU time.
``--cached`` times a verify that may use the record cache instead.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

TARGET = 60.0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cached", action="store_true", help="allow the record cache (a warm verify)")
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "pgspec.conformance.cli", "golden", "verify"] + ([] if args.cached else ["--no-cache"])
    load_before = os.getloadavg()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    v = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    last = ((v.stdout or v.stderr).strip().splitlines() or [""])[-1]
    jobs = os.environ.get("PGSPEC_JOBS") or str(max(1, min(8, os.cpu_count() or 1)))
    print(f"machine: {os.cpu_count()} CPUs; load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}")
    print(f"pgspec golden verify{'' if args.cached else ' --no-cache'}: exit {v.returncode}; {last}")
    print(f"wall {wall:.1f} s  target <= {TARGET:.0f} s  {'ok' if wall <= TARGET else 'OVER TARGET'}; "
          f"CPU {cpu:.1f} s over {jobs} worker(s) (wall on an idle machine is about CPU / workers)")
    return v.returncode


if __name__ == "__main__":
    sys.exit(main())
