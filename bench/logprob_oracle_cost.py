"""Cost of the float64 log-prob oracle of `pgspec check --formula logprob.token --vocab V`
(conformance/check_logprob.py), for one chunk of positions, split into its steps.

    python bench/logprob_oracle_cost.py [--tokens 256] [--vocab 151936] [--repeat 3] [--device cpu]

On seeded head inputs (``check_logprob.seeded_head``, one sequence of ``tokens`` positions, all
unmasked), best of ``repeat``:

- the logits z = X W^T in float64 (exact by construction);
- the built-in torch backend's log-probs and their gradient in float64, through ``compare.call``
  (the backend's input validation included, as the oracle runs it);
- the scale pass: the head's forward error E(z) and ``logit_scales`` (E(l) and the two [n, V]
  gradient-scale tensors);
- the whole ``oracle_chunks`` step for that chunk (the above plus the [n, H] products).

The oracle's time at production vocabulary is these passes over [n, V] float64 memory; on a GPU, run
it there with ``--device cuda`` (bench/gpu_check.sh times the whole check).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from _args import positive  # bench/_args.py


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=positive, default=256)
    parser.add_argument("--vocab", type=positive, default=151936)
    parser.add_argument("--repeat", type=positive, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    from pgspec.conformance import check_logprob as lp
    from pgspec.conformance import compare, runner

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device is available", file=sys.stderr)
        return 2
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), device {args.device}; {args.tokens} positions, V = {args.vocab}")
    arrays = lp.seeded_head(1, args.tokens, args.vocab, ragged=False)
    X = torch.as_tensor(arrays["hidden"], device=args.device).double().reshape(-1, lp.DEFAULT_HIDDEN)
    W = torch.as_tensor(arrays["weight"], device=args.device).double()
    y = torch.as_tensor(arrays["targets"], device=args.device).reshape(-1)
    n = X.shape[0]
    mask = torch.ones((1, n), dtype=torch.bool, device=args.device)
    params = {"temperature": 1, "logit_scale": 1, "softcap": None}
    backend = runner.load_adapter("torch")

    def sync():
        if args.device == "cuda":
            torch.cuda.synchronize()

    def best(work):
        times = []
        for _ in range(args.repeat):
            sync()
            t = time.perf_counter()
            work()
            sync()
            times.append(time.perf_counter() - t)
        return min(times)

    with torch.no_grad():
        z = X @ W.T
    steps = {
        "logits X W^T": lambda: X @ W.T,
        "backend value + gradient": lambda: compare.call(
            backend, lp.FORMULA, {"logits": z[None].clone().requires_grad_(True), "targets": y[None], "mask": mask},
            params),
        "scale pass (E(z), logit_scales)": lambda: lp.logit_scales(z, y, lp.head_forward_error(X, W.abs())),
        "whole oracle_chunks step": lambda: list(lp.oracle_chunks(arrays, params, args.device, chunk_tokens=n)),
    }
    for name, work in steps.items():
        s = best(work)
        print(f"{name:34s} {s:7.3f} s  ({1000 * s / n:.2f} ms per position)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
