"""Wall time and peak memory of `pgspec run` (default adapter, all formulas, three dtypes) and of
golden generation (in memory, the work `pgspec golden generate` does).

    python bench/run_default.py [--repeat N]

Targets on the project's 2-core CPU machine: run <= 20 s, generation <= 120 s, peak memory <= 2 GB.
Each measurement runs in a fresh subprocess; peak memory is the largest resident set of that
process or any of its children (ru_maxrss).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import time

from _args import positive  # bench/_args.py

TARGETS = {"run": (20.0, 2048.0), "generate": (120.0, 2048.0)}

COMMANDS = {
    "run": [sys.executable, "-m", "pgspec.conformance.cli", "run"],
    "generate": [sys.executable, "-c",
                 "from pgspec.conformance.corpus import golden; files = golden.generate_all(); "
                 "print(len(files), 'files,', sum(len(d) for d in files.values()) // 1024, 'KiB')"],
}


def measure(name: str) -> tuple[float, float, int]:
    """(wall seconds, peak RSS in MiB, exit code) of one fresh process."""
    script = (
        "import resource, subprocess, sys, time\n"
        f"cmd = {COMMANDS[name]!r}\n"
        "t = time.perf_counter()\n"
        "rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode\n"
        "wall = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
        "print(wall, rss, rc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1]), int(out[2])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=positive, default=1)
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    ok = True
    for name in ("run", "generate"):
        walls, peaks = [], []
        for _ in range(args.repeat):
            wall, peak, rc = measure(name)
            walls.append(wall)
            peaks.append(peak)
        wall, peak = min(walls), max(peaks)
        t_target, m_target = TARGETS[name]
        verdict = "ok" if wall <= t_target and peak <= m_target else "OVER TARGET"
        ok = ok and verdict == "ok"
        print(f"{name:9s} wall {wall:7.1f} s (target <= {t_target:.0f} s)   peak memory {peak:7.0f} MiB "
              f"(target <= {m_target:.0f} MiB)   exit {rc}   {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
