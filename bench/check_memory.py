"""Peak resident memory of `pgspec check` against conformance/check/memory.py's estimate (issue 39).

Runs each check in a fresh process under /usr/bin/time and prints, per formula and shape, the peak
resident memory above that of a 2x64 check, the estimate, and their ratio (the estimate must stay
above: a ratio below 1 means BYTES_PER_TOKEN or BYTES_PER_LOGIT must grow).

    python bench/check_memory.py [--shape 16x16384] [--formulas loss.grpo,agg.token_mean]
"""

from __future__ import annotations

import argparse
import subprocess
import sys


def peak_mib(argv: list[str]) -> float:
    p = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, "-m", "pgspec.conformance.cli", "check", *argv],
                       capture_output=True, text=True)
    return int(p.stderr.strip().splitlines()[-1]) / 1024


def main() -> int:
    from pgspec.conformance.check.memory import estimate_bytes

    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="16x16384")
    parser.add_argument("--formulas", default="loss.grpo,loss.sapo,loss.gmpo,loss.vespo,loss.gspo,agg.token_mean")
    parser.add_argument("--vocab-shape", default="4x1024")
    parser.add_argument("--vocab", type=int, default=4096)
    args = parser.parse_args()
    B, T = (int(x) for x in args.shape.split("x"))
    print(f"{'formula':<16} {'shape':<18} {'measured MiB':>12} {'estimate MiB':>12} {'ratio':>6}")
    rows = [(f, args.shape, [], B, T, None) for f in args.formulas.split(",")]
    vb, vt = (int(x) for x in args.vocab_shape.split("x"))
    rows.append(("logprob.token", f"{args.vocab_shape} V={args.vocab}", ["--vocab", str(args.vocab)], vb, vt, args.vocab))
    for formula, shape, extra, b, t, vocab in rows:
        small = ["--vocab", "16"] if vocab else []
        base = peak_mib(["--formula", formula, "--shape", "1x8" if vocab else "2x64", *small])
        peak = peak_mib(["--formula", formula, "--shape", f"{b}x{t}", *extra])
        est = estimate_bytes(b, t, vocab) / 2 ** 20
        print(f"{formula:<16} {shape:<18} {peak - base:>12.0f} {est:>12.0f} {est / max(peak - base, 1e-9):>6.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
