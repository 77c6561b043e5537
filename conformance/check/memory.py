"""`pgspec check`'s memory estimate, made before anything is allocated (issue 39): a shape that does
not fit in the memory available is refused with one line (the estimate, the limit, how to override)
instead of being learnt from a failed allocation minutes later.

The estimate is an upper bound measured on CPU with the built-in torch adapter (peak resident memory
of `pgspec check` less that of a 2x64 check; bench/ has no timed test of it):

- per token of the [B, T] batch, at most 321 bytes (loss.grpo, the largest: its oracle keeps each
  token's term, error and derivative, spec/tolerance.md) at 16x16384: counted as ``BYTES_PER_TOKEN``
  = 512, which covers the inputs, the oracle's float64 passes and the adapter's tensors;
- with a linear head (``--vocab V``: logprob.token, the head losses), 85 bytes per element of the
  [B, T, V] logits at 4x1024x4096 (the float64 logits, their gradient, the adapter's copy): counted
  as ``BYTES_PER_LOGIT`` = 96, plus the [V, H] head.
"""

from __future__ import annotations

import math
import os

BYTES_PER_TOKEN = 512
BYTES_PER_LOGIT = 96
GiB = float(1 << 30)
# --max-memory's range, in GiB
MAX_MEMORY_RANGE = (0.001, 1 << 20)
# checks of at least this many tokens (or logits) say what they are doing as they go
PROGRESS_TOKENS = 1 << 20


def estimate_bytes(B: int, T: int, vocab: int | None = None, hidden: int | None = None) -> int:
    tokens = B * T
    est = BYTES_PER_TOKEN * tokens
    if vocab is not None:
        H = hidden if hidden is not None else 64
        est += BYTES_PER_LOGIT * tokens * vocab + 8 * 4 * vocab * H
    return est


def available_bytes(device: str) -> tuple[int | None, str]:
    """(bytes this process may still allocate on ``device``, where that figure comes from); None when
    unknown (then nothing is refused)."""
    if device == "cuda":
        try:
            import torch

            free, _ = torch.cuda.mem_get_info()
            return int(free), "free on the CUDA device (torch.cuda.mem_get_info)"
        except Exception:  # noqa: BLE001 - no CUDA: the device check reports it
            return None, ""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available physical pages (sysconf)"
    except (ValueError, OSError, AttributeError):
        return None, ""


def parse_max_memory(text) -> float:
    """--max-memory GIB: a finite number of GiB in MAX_MEMORY_RANGE, else ValueError."""
    lo, hi = MAX_MEMORY_RANGE
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and lo <= value <= hi):
        raise ValueError(f"must be a number of GiB from {lo:g} to {hi}, got {text!r}")
    return value


def refuse_if_too_large(formula: str, B: int, T: int, device: str, vocab: int | None = None,
                        hidden: int | None = None, max_memory_gib: float | None = None):
    """None when the check fits; else the one line of its refusal (the estimate, the limit, the way to
    override).  ``max_memory_gib``: the user's limit, instead of the memory available."""
    est = estimate_bytes(B, T, vocab, hidden)
    if max_memory_gib is not None:
        limit, source = max_memory_gib * GiB, "--max-memory"
    else:
        limit, source = available_bytes(device)
        if limit is None:
            return None
    if est <= limit:
        return None
    size = f"{B}x{T}" + (f" with --vocab {vocab}" if vocab is not None else "")
    how = "raise --max-memory (the estimate is an upper bound)" if max_memory_gib is not None else \
        "or pass --max-memory GIB to allow more (the estimate is an upper bound)"
    return (f"--shape {size}: {formula} needs an estimated {est / GiB:.2f} GiB, more than the {limit / GiB:.2f} GiB "
            f"{'allowed' if max_memory_gib is not None else 'available'} ({source}); use a smaller --shape, {how}")


def is_long(B: int, T: int, vocab: int | None = None) -> bool:
    return B * T * (vocab or 1) >= PROGRESS_TOKENS
