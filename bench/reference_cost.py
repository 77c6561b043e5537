"""Cost of the mpmath reference for the two benchmarked recipes, per token, relative to one mpmath exp.

    python bench/reference_cost.py [--reps 5] [--B 4] [--T 2048] [--profile]

Measures ``evaluate("loss.gspo", ...)`` and ``evaluate("loss.dapo", ...)`` at the default 60 digits:
value AND gradient together, input conversion and validation included (exactly what a user or the
golden generator pays), on B = 4 sequences of T = 2048 tokens (8192 tokens, a typical long-response
micro-batch; every token unmasked so the count is exact).  The unit is one ``mp.exp`` at 60 digits of
an argument like a log-ratio.  Another process may share the machine, so each repetition times the
exp loop and the two recipes back to back (interleaved) and the report gives medians: a load spike
then slows the unit and the recipe alike.  Target: <= 5 exps per token.

Inputs: bf16-representable log-probs in [-6, -0.01]; the old log-probs differ from the current by a
bf16 step of a few hundredths (a mildly off-policy mini-batch: most DAPO tokens inside the clip
range, some clipped); per-sequence advantages; two prompt groups (DAPO's default prompt_mean).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import struct
import sys
import time

import mpmath
from mpmath import mp, mpf

from pgspec.reference import evaluate

from _args import positive  # bench/_args.py


def bf16(x: float) -> float:
    bits = struct.unpack(">I", struct.pack(">f", x))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack(">f", struct.pack(">I", bits))[0]


def make_inputs(B: int, T: int, seed: int = 0):
    rng = random.Random(seed)
    logprobs = [[bf16(rng.uniform(-6.0, -0.01)) for _ in range(T)] for _ in range(B)]
    old = [[bf16(l + rng.gauss(0.0, 0.05)) for l in row] for row in logprobs]
    mask = [[True] * T for _ in range(B)]
    advantages = [bf16(rng.uniform(-1.5, 1.5)) for _ in range(B)]
    group_ids = [i * 2 // B for i in range(B)]
    return logprobs, old, mask, advantages, group_ids


def time_exp(n: int, args) -> float:
    """Seconds per mp.exp at 60 digits."""
    with mp.workdps(60):
        xs = [mpf(a) for a in args[:n]]
        start = time.perf_counter()
        for x in xs:
            mp.exp(x)
        return (time.perf_counter() - start) / n


def time_call(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=positive, default=5)
    ap.add_argument("--B", type=positive, default=4)
    ap.add_argument("--T", type=positive, default=2048)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one loss.dapo and one loss.gspo call")
    args = ap.parse_args(argv)

    logprobs, old, mask, adv, groups = make_inputs(args.B, args.T)
    n_tok = args.B * args.T
    gspo_in = {"logprobs": logprobs, "old_logprobs": old, "mask": mask, "advantages": adv}
    dapo_in = dict(gspo_in, group_ids=groups)
    exp_args = [l - o for row_l, row_o in zip(logprobs, old) for l, o in zip(row_l, row_o)]

    if args.profile:
        import cProfile
        import pstats

        for fid, inp in (("loss.dapo", dapo_in), ("loss.gspo", gspo_in)):
            print(f"--- cProfile: {fid} ---")
            prof = cProfile.Profile()
            prof.runcall(evaluate, fid, inp)
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)

    evaluate("loss.gspo", gspo_in)  # warm-up (imports, caches)
    t_exp, t_gspo, t_dapo = [], [], []
    for _ in range(args.reps):
        t_exp.append(time_exp(min(n_tok, 20000), exp_args * (1 + 20000 // n_tok)))
        t_gspo.append(time_call(lambda: evaluate("loss.gspo", gspo_in)) / n_tok)
        t_dapo.append(time_call(lambda: evaluate("loss.dapo", dapo_in)) / n_tok)
    e, g, d = statistics.median(t_exp), statistics.median(t_gspo), statistics.median(t_dapo)

    print("pgspec reference cost: value + gradient via evaluate(..., dps=60), per token")
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}")
    print(f"python {sys.version.split()[0]} ({platform.python_implementation()}), mpmath {mpmath.__version__}, "
          f"backend {mpmath.libmp.BACKEND}")
    print(f"batch: B={args.B} x T={args.T} = {n_tok} tokens, {args.reps} interleaved repetitions, medians")
    print(f"unit: one mp.exp at 60 digits = {e * 1e6:.2f} us")
    for name, t, runs in (("loss.gspo", g, t_gspo), ("loss.dapo", d, t_dapo)):
        spread = ", ".join(f"{r / ee:.2f}" for r, ee in zip(runs, t_exp))
        print(f"{name}: {t * 1e6:.2f} us/token = {t / e:.2f} exp/token "
              f"(whole call {t * n_tok:.3f} s; per-repetition ratios {spread})")
    worst = max(g, d) / e
    print(f"target <= 5 exp/token: {'met' if worst <= 5 else 'NOT met'} (worst {worst:.2f})")


if __name__ == "__main__":
    main()
