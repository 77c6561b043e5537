"""The harness overhead of `pgspec run` for the built-in backend and each framework adapter.

    python bench/harness_overhead_frameworks.py [--venvs DIR] [--repeat N] [ADAPTER ...]

Runs ``bench/harness_overhead.py --adapter NAME --repeat N`` for the built-in torch backend with this
interpreter, and for each framework with the Python of its own environment as ``ci/conformance.sh``
installs it (``DIR/NAME/bin/python``, default DIR ``.ci-venvs``; ``bash ci/conformance.sh`` makes
them), then prints one table of the medians: wall time over the time inside the adapter (target
<= 1.5), the same with the import of torch counted as the adapter's work, and the harness's own time
per second of the adapter's.  A framework without an environment there is listed as such.  The
built-in backend is the fastest adapter there is (about half a millisecond a call), so its ratio is
the highest; a framework's own functions take longer per case and its ratio is lower.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from _args import positive  # bench/_args.py

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("trl", "liger", "verl", "openrlhf", "skyrl", "areal")
TARGET_RATIO = 1.5


def medians(text: str) -> dict | None:
    """The figures of harness_overhead.py's "median of N: name value, ..." line, or None."""
    m = re.search(r"^median of \d+: (.*)$", text, re.M)
    if m is None:
        return None
    return {name: float(value) for name, value in (part.rsplit(" ", 1) for part in m.group(1).split(", "))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("adapters", nargs="*", metavar="ADAPTER",
                        help=f"torch and/or frameworks (default: torch {' '.join(FRAMEWORKS)})")
    parser.add_argument("--venvs", default=".ci-venvs", metavar="DIR",
                        help="where each framework's environment is, DIR/NAME (default .ci-venvs)")
    parser.add_argument("--repeat", type=positive, default=3, metavar="N", help="runs per adapter (default 3)")
    args = parser.parse_args()
    names = args.adapters or ["torch", *FRAMEWORKS]
    unknown = [n for n in names if n != "torch" and n not in FRAMEWORKS]
    if unknown:
        parser.error(f"unknown adapter(s) {unknown}; choose from torch {' '.join(FRAMEWORKS)}")
    rows = []
    for name in names:
        python = Path(sys.executable) if name == "torch" else Path(args.venvs) / name / "bin" / "python"
        if not python.exists():
            rows.append((name, None, f"no environment at {python.parent.parent} (bash ci/conformance.sh {name})"))
            continue
        run = subprocess.run([str(python), str(HERE / "harness_overhead.py"), "--adapter", name,
                              "--repeat", str(args.repeat)], capture_output=True, text=True)
        figures = medians(run.stdout)
        rows.append((name, figures, "" if figures else f"exit {run.returncode}: "
                     + ((run.stderr or run.stdout).strip().splitlines() or ["no output"])[-1]))
        print(f"{name}: {'done' if figures else rows[-1][2]}", file=sys.stderr)
    print(f"medians of {args.repeat} run(s) each, {sys.platform}, target wall / adapter <= {TARGET_RATIO}")
    print(f"{'adapter':<10} {'wall s':>7} {'adapter s':>9} {'wall/adapter':>12} {'with torch import':>17} "
          f"{'harness/adapter':>15}")
    for name, f, why in rows:
        if f is None:
            print(f"{name:<10} {why}")
            continue
        print(f"{name:<10} {f['wall']:7.2f} {f['adapter']:9.2f} {f['ratio']:12.2f} {f['ratio with the import']:17.2f} "
              f"{f['harness'] / f['adapter']:15.2f}")
    return 0 if all(f is not None for _, f, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
