"""pgspec adapter for TRL 1.16.0 (see adapters/trl/README.md).

Every implementation calls TRL's own code: ``GRPOTrainer._compute_loss`` on a stub trainer, the static
``get_off_policy_mask`` and ``get_gamma_weights``, ``get_high_entropy_mask`` and the
``ChunkedLogProbFunction`` behind TRL's training log-probs.  TRL is imported lazily, so this module imports
without it; ``available()`` then says why the adapter cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..base import Adapter, load_deviations

FRAMEWORK = "trl"
PINNED = "1.16.0"


def _framework_version():
    try:
        from importlib.metadata import version

        return version(FRAMEWORK)
    except Exception:  # noqa: BLE001 - not installed
        return None


@dataclass
class TRLAdapter(Adapter):
    def available(self) -> tuple[bool, str]:
        v = _framework_version()
        if v is None:
            return False, f"trl is not installed (pip install trl=={PINNED}; see adapters/trl/README.md)"
        try:
            import trl  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return False, f"trl {v} does not import: {e}"
        return True, ""


def make_adapter() -> Adapter:
    v = _framework_version()
    deviations = load_deviations(Path(__file__).with_name("deviations.toml"))
    if v is None:
        return TRLAdapter(name="trl", framework="TRL (huggingface/trl)", version="not installed",
                          implementations={}, deviations=deviations)
    from .impls import IMPLEMENTATIONS, PARAM_MAP
    from .recipes import IMPLEMENTATIONS as RECIPES

    return TRLAdapter(
        name="trl",
        framework="TRL (huggingface/trl)",
        version=f"trl {v}",
        devices=("cpu",),
        dtypes=("float64", "float32", "bfloat16"),
        implementations={**IMPLEMENTATIONS, **RECIPES},
        param_map=PARAM_MAP,
        deviations=deviations,
    )
