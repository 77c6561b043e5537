"""pgspec adapter for Liger-Kernel 0.8.5 (see adapters/liger/README.md).

Four entry points, one per Liger code path:

- ``make_adapter`` (``--adapter liger``): the chunked PyTorch path, log-probs in
  (``LigerFusedLinearPPOBase._compute_loss_from_logps`` -> ``LigerFusedLinearGRPOFunction.ppo_loss_fn``,
  eager), plus ``k3_loss_fn`` and the selective log-prob kernel.  Runs on CPU.
- ``make_fused_adapter`` (``--adapter pgspec.adapters.liger:make_fused_adapter``): the whole
  ``LigerFusedLinearGRPOLoss(compiled=False)`` from constructed hidden states and LM head.
- ``make_compiled_adapter`` (``--adapter pgspec.adapters.liger:make_compiled_adapter``): the same with
  Liger's default ``compiled=True`` (torch.compile; exposed to stale floats by design, see README).
- ``make_triton_adapter`` (``--adapter pgspec.adapters.liger:make_triton_adapter``): the Triton
  kernel ``triton_grpo_loss``, on CUDA, or on CPU under ``TRITON_INTERPRET=1`` (CI).

liger_kernel is imported lazily: this module imports without it, and ``available()`` says why not.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .. import base
from ..base import Adapter

FRAMEWORK = "Liger-Kernel"
DISTRIBUTION = "liger-kernel"
PINNED = "0.8.5"
DEVIATIONS = Path(__file__).with_name("deviations.toml")
TRITON_DEVIATIONS = Path(__file__).with_name("deviations-triton.toml")
COMPILED_DEVIATIONS = Path(__file__).with_name("deviations-compiled.toml")


def framework_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return None


def load_deviations(path: Path, rules: bool = True):
    """The declarations file (spec/verdicts.md), shared by the code paths: its capabilities are Liger's
    configuration space; its rules describe the loss math of ``ppo_loss_fn`` (the chunked path, and the
    fused path, which calls the same function).  ``rules=False``: the unsupported formulas and
    capabilities only."""
    decl = base.load_deviations(path)
    if not rules:
        from pgspec.conformance.verdicts.declarations import Declarations

        decl = Declarations(decl.path, list(decl.unsupported), list(decl.capabilities), [])
    return decl


def load_triton_deviations():
    """The Triton kernel's declarations: the unsupported formulas and capabilities of deviations.toml
    (Liger's configuration space), then the capabilities and rules of deviations-triton.toml (the
    kernel is other code than ``ppo_loss_fn``, so the chunked path's rules do not apply to it).  Each
    declaration keeps the file it came from (reports show it)."""
    from pgspec.conformance.verdicts.declarations import Declarations

    shared = load_deviations(DEVIATIONS, rules=False)
    own = base.load_deviations(TRITON_DEVIATIONS)
    return Declarations(f"{shared.path} + {own.path}", [*shared.unsupported, *own.unsupported],
                        [*shared.capabilities, *own.capabilities], list(own.rules))


@dataclass
class LigerAdapter(Adapter):
    framework_modules = ("liger_kernel",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    needs_triton: bool = False

    def available(self) -> tuple[bool, str]:
        if importlib.util.find_spec("liger_kernel") is None:
            return False, (f"liger-kernel is not installed in this interpreter: in the pgspec checkout, "
                           f"pip install -c constraints.txt -e \".[liger]\" (liger-kernel=={PINNED}; "
                           f"adapters/liger/README.md)")
        v = framework_version()
        if v != PINNED:
            return False, f"liger-kernel {v} is installed; this adapter is written for {PINNED}"
        if self.needs_triton:
            from .triton_path import triton_available

            return triton_available()
        return True, ""

    def device_available(self, device: str) -> tuple[bool, str]:
        ok, why = super().device_available(device)
        if ok and self.needs_triton:
            from .triton_path import device_available

            return device_available(device)
        return ok, why


def _version():
    v = framework_version()
    return f"{v}" if v else "not installed"


def _param_map(ids):
    from .mapping import PARAM_MAP

    return {fid: PARAM_MAP[fid] for fid in ids if fid in PARAM_MAP}


def _with_head(adapter, fused=False):
    """The adapter with Liger's LM-head log-prob step (``LigerFusedLinearPPOBase.chunk_forward``, head.py) as its
    fused head for `pgspec check --formula logprob.token --vocab V` (conformance/check/logprob.py HEAD_PROTOCOL):
    the step both the chunked and the fused paths run on hidden states; ``fused``: also the whole
    ``LigerFusedLinearGRPOLoss`` for `pgspec check --formula loss.grpo --vocab V` (check_head_loss.py). They take
    tensors on any device."""
    from .head import FUSED_HEADS, HEADS

    adapter.heads = FUSED_HEADS if fused else HEADS
    return adapter


def make_adapter() -> Adapter:
    """The chunked path (default)."""
    from . import chunked

    return _with_head(LigerAdapter(
        name="liger", framework=FRAMEWORK, version=_version(), devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16"), implementations=dict(chunked.IMPLEMENTATIONS),
        param_map=_param_map(chunked.IMPLEMENTATIONS), deviations=load_deviations(DEVIATIONS)))


def make_fused_adapter() -> Adapter:
    """LigerFusedLinearGRPOLoss end to end from constructed hidden states (see fused.py)."""
    from . import fused

    return _with_head(LigerAdapter(
        name="liger-fused", framework=FRAMEWORK, version=_version(), devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16"), implementations=dict(fused.IMPLEMENTATIONS),
        param_map=_param_map(fused.IMPLEMENTATIONS), deviations=load_deviations(DEVIATIONS)), fused=True)


def load_compiled_deviations():
    """The compiled fused path: deviations.toml whole (it runs the same ppo_loss_fn), then
    deviations-compiled.toml (the construction's capability, and what torch.compile adds)."""
    from pgspec.conformance.verdicts.declarations import Declarations

    shared = load_deviations(DEVIATIONS)
    own = base.load_deviations(COMPILED_DEVIATIONS)
    return Declarations(f"{shared.path} + {own.path}", [*shared.unsupported, *own.unsupported],
                        [*shared.capabilities, *own.capabilities], [*shared.rules, *own.rules])


def make_compiled_adapter() -> Adapter:
    """LigerFusedLinearGRPOLoss with Liger's default compiled=True (torch.compile of the loss math).

    torch's dynamo stops compiling a function after ``recompile_limit`` (8) recompiles and runs it eagerly
    from then on; over the corpus (shapes, loss types and floats change from case to case) that happens
    after a few dozen cases, and the rest of the run would test eager code.  A training run meets only a
    few configurations and keeps compiling, so this adapter raises the limit (``PGSPEC_LIGER_RECOMPILE_LIMIT``,
    default 256; the process's dynamo config) so that every call runs compiled code, as it would there."""
    import os

    import torch._dynamo

    from . import fused

    from pgspec.conformance.base.settings import get

    limit = get("PGSPEC_LIGER_RECOMPILE_LIMIT", 256)     # 1 to 65536, else one line naming it
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 16 * limit)

    return LigerAdapter(
        name="liger-compiled", framework=FRAMEWORK, version=f"{_version()}; compiled=True (torch.compile, recompile_limit {limit})",
        devices=("cpu", "cuda"), dtypes=("float64", "float32", "bfloat16"),
        implementations=dict(fused.COMPILED_IMPLEMENTATIONS),
        param_map=_param_map(fused.COMPILED_IMPLEMENTATIONS), deviations=load_compiled_deviations())


def make_triton_adapter() -> Adapter:
    """triton_grpo_loss (CUDA; CPU only under TRITON_INTERPRET=1)."""
    from . import triton_path

    where = "Triton interpreter, TRITON_INTERPRET=1" if triton_path.interpreted() else "compiled Triton kernels"
    adapter = LigerAdapter(
        name="liger-triton", framework=FRAMEWORK, version=f"{_version()}; triton_grpo_loss ({where})", devices=("cpu", "cuda"),
        dtypes=("float32", "bfloat16"), implementations=dict(triton_path.IMPLEMENTATIONS),
        param_map=_param_map(triton_path.IMPLEMENTATIONS), deviations=load_triton_deviations(),
        needs_triton=True)
    # `pgspec check --formula loss.grpo --vocab V`: the kernel on the logits of a linear head (triton_path.py)
    adapter.heads = dict(triton_path.HEADS)
    return adapter
