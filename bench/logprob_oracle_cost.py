"""Cost of the float64 log-prob oracle of `pgspec check --formula logprob.token --vocab V`
(conformance/check/logprob.py) beside the kernel it checks.

    python bench/logprob_oracle_cost.py [--shape 1x256] [--vocab 151936] [--hidden 64] [--repeat 3]
        [--device cpu] [--oracle torch,fused] [--adapter torch] [--dtype bfloat16] [--steps]
        [--block-m 32] [--block-v 64] [--num-warps N] [--split] [--float64-products] [--compare]

On seeded head inputs (``check_logprob.seeded_head`` at B x T positions, the ragged mask of the check),
best of ``repeat`` (the device synchronized), each after an untimed first call on one sequence of up to 4096
positions (Triton's compilation, a framework's first call):

- each oracle of ``--oracle`` over all positions, as the check runs it (``oracle_chunks``): ``torch``,
  the [n, V] float64 passes of check_logprob.py; ``fused``, the Triton kernels of
  check_logprob_fused.py (on a CPU only under TRITON_INTERPRET=1, and then only small sizes are
  feasible: the interpreter runs one Python step per tile);
- the kernel under test: ``--adapter``'s log-prob head (TRL's ``_ChunkedLogProbFunction``, Liger's
  ``chunk_forward``) or, without a head, its logprob.token on the logits X W^T, forward and gradient,
  in ``--dtype``; and the ratio of each oracle's time to it (issue 41's goal: fused / kernel <= 1
  at 256 x 32768, V = 151936, on one H200);
- with ``--compare``, the agreement of the fused oracle with the torch one on these positions
  (``check_logprob.agreement``: values within 2 K u64 S, scales within 2 (V + 16) u64 relative, as
  tests/test_check_logprob_fused.py requires under the interpreter), exit status 1 if they disagree: the
  compiled kernels on the GPU, which the CPU tests cannot reach;
- with ``--steps``, the torch oracle's steps for one chunk of all the positions: the logits, the
  backend's value and gradient, the scale pass (E(z), ``logit_scales``), the whole chunk.

    python bench/logprob_oracle_cost.py --shape 256x32768 --device cuda --adapter trl --oracle fused
    TRITON_INTERPRET=1 python bench/logprob_oracle_cost.py --shape 2x64 --vocab 2000 --repeat 1
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from _args import positive  # bench/_args.py


def shape(text: str) -> tuple[int, int]:
    try:
        B, T = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape must be BxT, got {text!r}") from None
    if B < 1 or T < 1:
        raise argparse.ArgumentTypeError(f"--shape must be BxT with B, T >= 1, got {text!r}")
    return B, T


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", type=shape, default=None, help="BxT positions (default 1x256)")
    parser.add_argument("--tokens", type=positive, default=None, help="the same as --shape 1xTOKENS")
    parser.add_argument("--vocab", type=positive, default=151936)
    parser.add_argument("--hidden", type=positive, default=64)
    parser.add_argument("--repeat", type=positive, default=3)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--oracle", default="torch,fused", help="comma-separated: torch, fused")
    parser.add_argument("--adapter", default=None, help="the kernel under test (an adapter spec; default: none)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", action="store_true", help="the torch oracle's steps for one chunk")
    parser.add_argument("--compare", action="store_true",
                        help="also compare the fused oracle's outputs with the torch one's (exit 1 if they disagree)")
    parser.add_argument("--block-m", type=positive, default=None, help="the fused oracle's positions per program")
    parser.add_argument("--block-v", type=positive, default=None, help="the fused oracle's vocabulary tile")
    parser.add_argument("--num-warps", type=positive, default=None, help="the fused oracle's warps per program")
    parser.add_argument("--split", action="store_true",
                        help="the fused oracle's gradient and its scales in two sweeps (fewer registers)")
    parser.add_argument("--float64-products", action="store_true",
                        help="the fused oracle's logits as float64 products (default: float16 ones where exact)")
    args = parser.parse_args()
    B, T = args.shape or (1, args.tokens or 256)
    oracles = [o.strip() for o in args.oracle.split(",") if o.strip()]
    if set(oracles) - {"torch", "fused"}:
        parser.error(f"--oracle: torch and/or fused, got {args.oracle!r}")

    import torch

    from pgspec.conformance import check
    from pgspec.conformance.check import logprob as lp, logprob_fused as fused
    from pgspec.conformance.judge import compare
    from pgspec.conformance.run import runner

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device is available", file=sys.stderr)
        return 2
    gpu = f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads), device {args.device}{gpu}; {B} x {T} positions, V = {args.vocab}, "
          f"H = {args.hidden}; TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}")
    arrays = lp.seeded_head(B, T, args.vocab, args.hidden)
    params = {"temperature": 1, "logit_scale": 1, "softcap": None}

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

    def line(name, s, per):
        print(f"{name:44s} {s:9.3f} s  ({1e6 * s / per:.2f} us per position)")

    fused_kw = {k: v for k, v in (("block_m", args.block_m), ("block_v", args.block_v), ("num_warps", args.num_warps),
                                  ("low", False if args.float64_products else None),
                                  ("split", True if args.split else None)) if v is not None}
    # a first call on one sequence of up to 4096 positions before any timing: compilation and first-call costs
    warm = lp.seeded_head(1, min(T, 4096), args.vocab, args.hidden, seed=1)
    n_pos = int(arrays["mask"].sum())
    print(f"{n_pos} unmasked positions of {B * T}")
    times = {}
    for o in oracles:
        if o == "fused":
            ok, why = fused.available(args.device)
            if not ok:
                print(f"{'oracle fused':44s} unavailable: {why}")
                continue
            list(fused.oracle_chunks(warm, params, args.device, **fused_kw))     # Triton's compilation, untimed
            work = lambda kw=fused_kw: list(fused.oracle_chunks(arrays, params, args.device, **kw))   # noqa: E731
        else:
            list(lp.oracle_chunks(warm, params, args.device, fused=False))
            work = lambda: list(lp.oracle_chunks(arrays, params, args.device, fused=False))   # noqa: E731
        times[o] = best(work)
        line(f"oracle {o}", times[o], n_pos)
    if args.adapter:
        adapter = runner.load_adapter(args.adapter)
        ok, why = adapter.available() if hasattr(adapter, "available") else (True, "")
        if not ok:
            print(f"--adapter {args.adapter}: not available: {why}", file=sys.stderr)
            return 2
        head = getattr(adapter, "heads", {}).get(lp.FORMULA)
        y = torch.as_tensor(arrays["targets"], device=args.device)
        m = torch.as_tensor(arrays["mask"], device=args.device)
        check.composites._logprob_work(adapter, head, warm, torch.as_tensor(warm["targets"], device=args.device),
                            torch.as_tensor(warm["mask"], device=args.device), params, args.dtype, args.device)()
        work = check.composites._logprob_work(adapter, head, arrays, y, m, params, args.dtype, args.device)
        k = best(work)
        line(f"kernel {adapter.name} ({'head' if head else 'logits'}, {args.dtype})", k, n_pos)
        for o, s in times.items():
            print(f"{'oracle ' + o + ' / kernel':44s} {s / k:9.2f}")
    status = 0
    if args.compare:
        ok, why = fused.available(args.device)
        if not ok:
            print(f"--compare: the fused oracle is unavailable: {why}", file=sys.stderr)
            return 2
        a = lp.agreement(arrays, params, args.device, **fused_kw)
        print(f"fused vs torch oracle: |difference| / (2 K u64 S): logprobs {a['logprobs']:.3g}, grad {a['grad']:.3g} "
              f"(<= 1); scales' relative difference: E(l) {a['E(l)']:.3g}, S(grad) {a['S(grad)']:.3g}, "
              f"P {a['P']:.3g} (<= {a['scale_tol']:.3g}): {'agree' if a['ok'] else 'DISAGREE'}")
        status = 0 if a["ok"] else 1
    if args.steps:
        X = torch.as_tensor(arrays["hidden"], device=args.device).double().reshape(-1, args.hidden)
        W = torch.as_tensor(arrays["weight"], device=args.device).double()
        y = torch.as_tensor(arrays["targets"], device=args.device).reshape(-1)
        n = X.shape[0]
        mask = torch.ones((1, n), dtype=torch.bool, device=args.device)
        backend = runner.load_adapter("torch")
        with torch.no_grad():
            z = X @ W.T
        one = dict(arrays, mask=arrays["mask"] | True)
        steps = {
            "torch step: logits X W^T": lambda: X @ W.T,
            "torch step: backend value + gradient": lambda: compare.call(
                backend, lp.FORMULA, {"logits": z[None].clone().requires_grad_(True), "targets": y[None],
                                      "mask": mask}, params),
            "torch step: scale pass (E(z), logit_scales)": lambda: lp.logit_scales(
                z, y, lp.head_forward_error(X, W.abs())),
            "torch step: whole chunk": lambda: list(lp.oracle_chunks(one, params, args.device, chunk_tokens=n,
                                                                     fused=False)),
        }
        for name, work in steps.items():
            line(name, best(work), n)
    return status


if __name__ == "__main__":
    sys.exit(main())
