"""The float64 oracle of `pgspec check` against TRL's own GRPO loss, at production size.

    python bench/check_vs_trl.py [--shape 64x32768] [--repeat 3]

Run it with a Python that has TRL 1.16.0 (`bash ci/install-trl.sh VENV`, then `VENV/bin/python
bench/check_vs_trl.py`).  Both sides get the same seeded inputs (pgspec-splitmix64/1, a ragged
right-padded mask) and do a forward and a backward pass:

- TRL: ``GRPOTrainer._compute_loss`` with ``loss_type="grpo"`` (eps 0.2, beta 0) on float32
  per-token log-probs (the model forward stubbed out, as in the TRL adapter), then
  ``loss.backward()``;
- the oracle: the built-in torch backend's ``loss.grpo`` (beta 0) in float64 with its gradient,
  plus the tolerance scale S of the loss and of every gradient element (``check.oracle``).

Prints the best-of-``repeat`` wall time of each and the peak memory each adds over the inputs
(resident set of a fresh process: ru_maxrss minus the resident set before the work), and the
ratios oracle / TRL (targets: time <= 2, memory <= 2).  Each measurement runs in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys

from _args import positive  # bench/_args.py

TARGET = 2.0

WORKER = r"""
import json, resource, sys, time
import numpy as np
import torch
torch.set_num_threads(int(sys.argv[4]))
from pgspec.conformance import check
B, T, which = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
arrays = check.check_inputs("loss.grpo", B, T, 0, {"beta": 0.0})   # the inputs pgspec check uses
arrays = {k: v for k, v in arrays.items() if k in ("logprobs", "old_logprobs", "advantages", "mask")}

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()

if which == "trl":
    from pgspec.adapters.trl import _engine
    stub = _engine.make_stub(loss_type="grpo", eps_low=0.2, eps_high=0.2, beta=0.0, max_completion_length=T)
    def work():
        lp = torch.as_tensor(arrays["logprobs"], dtype=torch.float32).requires_grad_(True)
        old = torch.as_tensor(arrays["old_logprobs"], dtype=torch.float32)
        mask = torch.as_tensor(arrays["mask"])
        adv = torch.as_tensor(arrays["advantages"], dtype=torch.float32)
        loss = _engine.compute_loss(stub, logprobs=lp, mask=mask, advantages=adv, old_logprobs=old)
        loss.backward()
        return float(loss)
else:
    def work():
        out, grads, scales = check.oracle("loss.grpo", arrays, {"beta": 0.0})
        return float(out["loss"])

small = {k: v[:2, :16] if v.ndim == 2 else v[:2] for k, v in arrays.items()}
full, arrays = arrays, small
work()                          # warm-up: imports and first-call costs are not the work measured
arrays = full
base = rss()
t = time.perf_counter()
value = work()
wall = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall": wall, "peak_extra": peak - base, "loss": value}))
"""


def measure(which: str, B: int, T: int, threads: int) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, str(B), str(T), which, str(threads)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{which} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="64x32768")
    parser.add_argument("--repeat", type=positive, default=3)
    parser.add_argument("--threads", type=positive, default=os.cpu_count() or 1)
    args = parser.parse_args()
    from pgspec.conformance import check

    try:
        B, T = check.parse_shape(args.shape)
    except check.CheckError as e:
        parser.error(str(e))
    try:
        import trl
    except ImportError:
        print("TRL is not installed in this Python: run with the interpreter of `bash ci/install-trl.sh VENV`")
        return 2
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"TRL {trl.__version__}, {args.threads} torch threads; shape {B}x{T}")
    res = {}
    for which in ("trl", "oracle"):
        runs = [measure(which, B, T, args.threads) for _ in range(args.repeat)]
        res[which] = {"wall": min(r["wall"] for r in runs), "peak_extra": max(r["peak_extra"] for r in runs),
                      "loss": runs[0]["loss"]}
        r = res[which]
        print(f"{which:6s}: {r['wall']:.3f} s (best of {args.repeat}), peak +{r['peak_extra'] / 2**20:.0f} MiB, "
              f"loss {r['loss']:.9g}")
    t_ratio = res["oracle"]["wall"] / res["trl"]["wall"]
    m_ratio = res["oracle"]["peak_extra"] / res["trl"]["peak_extra"]
    print(f"oracle / TRL time:   {t_ratio:.2f}  target <= {TARGET}  {'ok' if t_ratio <= TARGET else 'OVER TARGET'}")
    print(f"oracle / TRL memory: {m_ratio:.2f}  target <= {TARGET}  {'ok' if m_ratio <= TARGET else 'OVER TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
