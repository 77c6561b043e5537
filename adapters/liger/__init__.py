"""pgspec adapter for Liger-Kernel 0.8.5 (see adapters/liger/README.md).

Three entry points, one per Liger code path:

- ``make_adapter`` (``--adapter liger``): the chunked PyTorch path, log-probs in
  (``LigerFusedLinearPPOBase._compute_loss_from_logps`` -> ``LigerFusedLinearGRPOFunction.ppo_loss_fn``,
  eager), plus ``k3_loss_fn`` and the selective log-prob kernel.  Runs on CPU.
- ``make_fused_adapter`` (``--adapter pgspec.adapters.liger:make_fused_adapter``): the whole
  ``LigerFusedLinearGRPOLoss(compiled=False)`` from constructed hidden states and LM head.
- ``make_triton_adapter`` (``--adapter pgspec.adapters.liger:make_triton_adapter``): the Triton
  kernel ``triton_grpo_loss``, on CUDA, or on CPU under ``TRITON_INTERPRET=1``.

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
    configuration space; its rules describe the loss math of ``ppo_loss_fn`` (the chunked path that CI
    runs, and the fused path, which calls the same function).  The Triton kernel is other code, so it
    takes the unsupported formulas and capabilities only (``rules=False``)."""
    decl = base.load_deviations(path)
    if not rules:
        from pgspec.conformance.declarations import Declarations

        decl = Declarations(decl.path, list(decl.unsupported), list(decl.capabilities), [])
    return decl


@dataclass
class LigerAdapter(Adapter):
    needs_triton: bool = False

    def available(self) -> tuple[bool, str]:
        if importlib.util.find_spec("liger_kernel") is None:
            return False, (f"liger-kernel is not installed in this interpreter "
                           f"(install it with ci/install-liger.sh, or run with --python /tmp/venv-liger/bin/python)")
        v = framework_version()
        if v != PINNED:
            return False, f"liger-kernel {v} is installed; this adapter is written for {PINNED}"
        if self.needs_triton:
            from .triton_path import triton_available

            return triton_available()
        return True, ""


def _version():
    v = framework_version()
    return f"{v}" if v else "not installed"


def _param_map(ids):
    from .mapping import PARAM_MAP

    return {fid: PARAM_MAP[fid] for fid in ids if fid in PARAM_MAP}


def make_adapter() -> Adapter:
    """The chunked path (default)."""
    from . import chunked

    return LigerAdapter(
        name="liger", framework=FRAMEWORK, version=_version(), devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16"), implementations=dict(chunked.IMPLEMENTATIONS),
        param_map=_param_map(chunked.IMPLEMENTATIONS), deviations=load_deviations(DEVIATIONS))


def make_fused_adapter() -> Adapter:
    """LigerFusedLinearGRPOLoss end to end from constructed hidden states (see fused.py)."""
    from . import fused

    return LigerAdapter(
        name="liger-fused", framework=FRAMEWORK, version=_version(), devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16"), implementations=dict(fused.IMPLEMENTATIONS),
        param_map=_param_map(fused.IMPLEMENTATIONS), deviations=load_deviations(DEVIATIONS))


def make_triton_adapter() -> Adapter:
    """triton_grpo_loss (CUDA; CPU only under TRITON_INTERPRET=1)."""
    from . import triton_path

    return LigerAdapter(
        name="liger-triton", framework=FRAMEWORK, version=_version(), devices=("cpu", "cuda"),
        dtypes=("float32", "bfloat16"), implementations=dict(triton_path.IMPLEMENTATIONS),
        param_map=_param_map(triton_path.IMPLEMENTATIONS), deviations=load_deviations(DEVIATIONS, rules=False),
        needs_triton=True)
