"""pgspec adapter for ms-swift 4.6.0 (see adapters/ms_swift/README.md).

Every implementation calls ms-swift's own code: ``GRPOTrainer._compute_loss_and_metrics`` on a stub trainer
(_engine.py), ``_apply_rollout_importance_sampling`` and ``_compute_off_policy_sequence_mask``.  ms-swift is
imported lazily, so this module imports without it; ``available()`` then says why the adapter cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..base import Adapter, load_deviations

DIST = "ms-swift"
PINNED = "4.6.0"
INSTALL = "bash ci/install-ms_swift.sh VENV (ms-swift 4.6.0 on the CPU build of torch; adapters/ms_swift/README.md)"


def _version():
    try:
        from importlib.metadata import version

        return version(DIST)
    except Exception:  # noqa: BLE001 - not installed
        return None


@dataclass
class SwiftAdapter(Adapter):
    framework_modules = ("swift",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    def available(self) -> tuple[bool, str]:
        if _version() is None:
            return False, f"ms-swift is not installed in this interpreter: {INSTALL}"
        try:
            from ._engine import trainer_class

            trainer_class()
        except Exception as e:  # noqa: BLE001
            return False, f"swift.rlhf_trainers.grpo_trainer does not import: {type(e).__name__}: {e}"
        return True, ""


def _with_grad(fn):
    """The read-outs differentiate ms-swift's scalar loss, so they need autograd even under torch.no_grad()."""

    def run(inputs, params):
        import torch

        with torch.enable_grad():
            return fn(inputs, params)

    run.__name__ = getattr(fn, "__name__", "run")
    run.__doc__ = fn.__doc__
    return run


def make_adapter() -> Adapter:
    deviations = load_deviations(Path(__file__).with_name("deviations.toml"))
    v = _version()
    if v is None:
        return SwiftAdapter(name="ms_swift", framework="ms-swift (modelscope/ms-swift)", version="not installed",
                            implementations={}, deviations=deviations)
    from .impls import IMPLEMENTATIONS, PARAM_MAP
    from .recipes import IMPLEMENTATIONS as RECIPES

    return SwiftAdapter(
        name="ms_swift", framework="ms-swift (modelscope/ms-swift)", version=f"ms-swift {v}",
        devices=("cpu",), dtypes=("float64", "float32", "bfloat16"),
        implementations={k: _with_grad(f) for k, f in {**IMPLEMENTATIONS, **RECIPES}.items()},
        param_map=PARAM_MAP, deviations=deviations)
