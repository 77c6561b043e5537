"""Production-scale checks against a float64 oracle (`pgspec check`).

The golden corpus stops at 32k tokens with sampled positions, and the mpmath reference cannot
follow a 64 x 32k batch.  A check evaluates one formula on seeded inputs of a given shape
(``pgspec-splitmix64/1``, spec/golden-format.md) with

- the adapter under test, in its dtype, and
- the **oracle**: the built-in torch backend in float64, together with the tolerance scale S of
  every output and gradient element computed as tensor operations: the running error bound of
  spec/tolerance.md (forward E, then the gradient scale pass), node for node as the reference
  states it for this formula (``pgspec.reference._ad``), so that S is the reference's S
  evaluated in float64 instead of mpmath.

Every element of the adapter's result must lie within ``K u(dtype) S + floor(dtype)`` of the
oracle's value, widened by the oracle's own float64 error bound ``K u(float64) S``.  The oracle's
values and scales are tested against the mpmath reference on the corpus's scale cases
(tests/test_check.py).  Formulas with an oracle scale: ``ORACLE_FORMULAS``.

Memory: the oracle's scale pass works on [B, T] float64 tensors, ``chunk`` sequences at a time
(row-local quantities per chunk, the batch-level sums accumulated across chunks); each token's term,
its error and its derivative (24 bytes) are kept from the first pass to the second.
"""

from __future__ import annotations

import time

import numpy as np

from pgspec.reference import REGISTRY

from . import branches as cb
from ..judge import tolerance
from .common import CheckError, CheckResult, HEAD_LOSS_FORMULAS, ORACLE_FORMULAS, VOCAB_FORMULAS
from .draws import check_inputs
from .scales import oracle, oracle_params
from .judging import check_one, classify_result
from .composites import run_head_loss_checks, run_logprob_checks


def _count(name: str, value, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise CheckError(f"{name} must be an integer >= {least}, got {value!r}")


def check_arguments(formula: str, B: int, T: int, dtypes=("float32",), device: str = "cpu", seed: int = 0,
                    params: dict | None = None, chunk: int = 8, vocab: int | None = None,
                    hidden: int | None = None, sampler: bool = False) -> None:
    """CheckError naming the argument, before any work, for every argument of ``run_checks`` that
    is out of its range: the shape, the dtypes, the device, the seed, the chunk, the formula and its
    parameters (the reference's own rules, then what the oracle's scale covers), --vocab, --hidden
    and --sampler."""
    _count("--shape B", B)
    _count("--shape T", T)
    if isinstance(dtypes, str) or not dtypes or any(d not in tolerance.DTYPES for d in dtypes):
        raise CheckError(f"dtypes: a non-empty list, each one of {', '.join(tolerance.DTYPES)}; got {dtypes!r}")
    if device not in ("cpu", "cuda"):
        raise CheckError(f"--device must be cpu or cuda, got {device!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise CheckError(f"--seed must be an integer (taken mod 2^64), got {seed!r}")
    _count("--chunk", chunk)
    if formula not in REGISTRY:
        from ..base.suggest import did_you_mean

        raise CheckError(f"unknown formula {formula!r}; formulas with an oracle: {', '.join(ORACLE_FORMULAS)} "
                         f"(`pgspec check --list`){did_you_mean(str(formula), ORACLE_FORMULAS)}")
    if formula not in ORACLE_FORMULAS:
        raise CheckError(f"{formula}: no oracle scale; formulas with one: {', '.join(ORACLE_FORMULAS)}")
    if params is not None and not isinstance(params, dict):
        raise CheckError(f"params must be a dict of parameter name -> value, got {type(params).__name__}")
    if sampler and formula != "loss.vespo":
        raise CheckError(f"--sampler applies to loss.vespo only, which folds the sampler's log-probs into phi; a check "
                         f"of {formula} gets them where its options read them (an IS weight, OPSM)")
    if formula in VOCAB_FORMULAS:
        if vocab is None:
            raise CheckError(f"{formula} needs --vocab V (the vocabulary size of the linear head)")
        from . import logprob as lp

        lp.check_params(dict(params or {}))
    else:
        from pgspec.adapters.torch._validate import check_parameters   # the oracle's: names, ranges, order
        from pgspec.reference import SpecError

        try:
            check_parameters(formula, dict(params or {}))
        except SpecError as e:
            raise CheckError(f"--param: {e}") from None
        if hidden is not None and vocab is None:
            raise CheckError(f"--hidden is the width of the linear head of a check with --vocab; {formula} "
                             f"without --vocab takes no head" if formula in HEAD_LOSS_FORMULAS else
                             f"--hidden applies to {', '.join(VOCAB_FORMULAS + HEAD_LOSS_FORMULAS)} (with --vocab) "
                             f"only, not to {formula}")
        if vocab is not None and formula not in HEAD_LOSS_FORMULAS:
            raise CheckError(f"--vocab applies to {', '.join(VOCAB_FORMULAS + HEAD_LOSS_FORMULAS)} only, "
                             f"not to {formula}")
        oracle_params(formula, dict(params or {}), head=vocab is not None)
        if formula.startswith("loss."):     # the recipe's own rules across its options (IS bounds, ...)
            from pgspec.reference import evaluate

            try:
                tiny = check_inputs(formula, 1, 2, 0, dict(params or {}), sampler)
                evaluate(formula, {k: v.tolist() for k, v in tiny.items()}, dict(params or {}))
            except SpecError as e:
                raise CheckError(f"--param: {e}") from None
    if vocab is not None:
        _count("--vocab", vocab, 2)
        if hidden is not None:
            _count("--hidden", hidden)


def check_cotangent(seed: int, shape):
    """The cotangent of a check with ``seed``: pgspec-cotangent/1 from seed XOR 0xC07A (spec/golden-format.md,
    "Cotangent"), a float for a scalar output."""
    from ..corpus.generator import cotangent_values

    return cotangent_values((int(seed) ^ 0xC07A) & ((1 << 64) - 1), shape)


def run_check(adapter, formula: str, B: int, T: int, dtype: str = "float32", device: str = "cpu", seed: int = 0,
              params: dict | None = None, chunk: int = 8, vocab: int | None = None,
              hidden: int | None = None, sampler: bool = False) -> CheckResult:
    """The check of ``formula`` at [B, T] for ``adapter`` in ``dtype`` (``run_checks`` for one dtype)."""
    return run_checks(adapter, formula, B, T, [dtype], device, seed, params, chunk, vocab, hidden, sampler)[0]


def run_checks(adapter, formula: str, B: int, T: int, dtypes=("float32",), device: str = "cpu", seed: int = 0,
               params: dict | None = None, chunk: int = 8, vocab: int | None = None,
               hidden: int | None = None, sampler: bool = False, max_memory: float | None = None,
               progress=None) -> list[CheckResult]:
    """One CheckResult per dtype of ``dtypes``, in order.  The oracle does not depend on the
    adapter's dtype (float64 on the same seeded inputs): it is evaluated once for all of them, and
    each result's ``oracle_seconds`` is that one evaluation's time.  ``sampler``: give loss.vespo the
    sampler's log-probs, which it folds into phi (``check_inputs``)."""
    import torch

    check_arguments(formula, B, T, dtypes, device, seed, params, chunk, vocab, hidden, sampler)
    from ..run.runner import ADAPTER_ATTRIBUTES

    lacking = [a for a in ADAPTER_ATTRIBUTES if not hasattr(adapter, a)]
    if lacking:
        raise CheckError(f"adapter: an adapter (pgspec.adapters.base.Adapter, e.g. runner.load_adapter('torch')), "
                         f"got {type(adapter).__name__}, which lacks {', '.join(lacking)}")
    ok, why = adapter.available()
    if not ok:
        raise CheckError(f"adapter {adapter.name!r} is not available here: {why}")
    from .memory import is_long, refuse_if_too_large

    # the memory estimate before anything is allocated (check/memory.py); ``max_memory``: GiB allowed
    too_large = refuse_if_too_large(formula, B, T, device, vocab, hidden, max_memory)
    if too_large:
        raise CheckError(too_large)
    if progress is None or not is_long(B, T, vocab):
        progress = None
    elif progress is not None:
        progress(f"{formula} {B}x{T}{f' V={vocab}' if vocab else ''}: seeded inputs, then the float64 oracle on "
                 f"{device}, then {adapter.name} in {', '.join(dtypes)}")
    if formula in VOCAB_FORMULAS:
        return run_logprob_checks(adapter, B, T, vocab, hidden, list(dtypes), device, seed, dict(params or {}))
    if formula in HEAD_LOSS_FORMULAS and vocab is not None:
        return run_head_loss_checks(adapter, formula, B, T, vocab, hidden, list(dtypes), device, seed,
                                    dict(params or {}), chunk, sampler)
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckError("--device cuda: no CUDA device is available")
    params = dict(params or {})
    results = [CheckResult(adapter.name, formula, dtype, device, [B, T], seed, "pass") for dtype in dtypes]
    todo = []
    for res in results:
        if formula not in adapter.capabilities() or res.dtype not in adapter.dtypes:
            res.outcome, res.message = "unsupported", f"{adapter.name} does not implement {formula} in {res.dtype}"
        else:
            todo.append(res)
    if not todo:
        return results
    arrays = check_inputs(formula, B, T, seed, params, sampler)
    t = time.perf_counter()
    # the gradient is judged as the VJP with a cotangent drawn from the seed (spec/golden-format.md,
    # "Cotangent"); the checked outputs are scalars, so it is one value c
    c = check_cotangent(seed, [])
    ref_out, ref_grads, scales = oracle(formula, arrays, params, device, chunk, cotangent=c)
    seconds = time.perf_counter() - t
    found = cb.branches(formula, arrays, params)
    for res in todo:
        res.branches, res.unreached = [b.to_json() for b in found], cb.unreached(found)
        if progress is not None:
            progress(f"oracle done ({seconds:.1f} s); {adapter.name} in {res.dtype}")
        res.oracle_seconds = seconds
        check_one(adapter, res, formula, arrays, params, ref_out, ref_grads, scales, c)
        classify_result(adapter, res, formula, params, arrays, seed)
    return results
