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
    framework_modules = ("trl",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    def available(self) -> tuple[bool, str]:
        v = _framework_version()
        if v is None:
            return False, (f"trl is not installed in this interpreter: in the pgspec checkout, "
                           f"pip install -c constraints.txt -e \".[trl]\" (trl=={PINNED}; adapters/trl/README.md)")
        try:
            import trl  # noqa: F401
        except Exception as e:  # noqa: BLE001
            return False, f"trl {v} does not import: {e}"
        return True, ""


def _with_grad(fn):
    """The read-outs differentiate TRL's scalar loss (see _engine.py), so they need autograd even when the
    caller evaluates under ``torch.no_grad()`` (the finite differences of prop.gradient_fd do)."""

    def run(inputs, params):
        import torch

        with torch.enable_grad():
            return fn(inputs, params)

    run.__name__ = getattr(fn, "__name__", "run")
    run.__doc__ = fn.__doc__
    return run


def make_adapter() -> Adapter:
    v = _framework_version()
    deviations = load_deviations(Path(__file__).with_name("deviations.toml"))
    # the tables import without TRL (it is imported when a formula runs): without TRL the adapter still
    # lists what it implements (`pgspec adapters`), and available() says how to install TRL
    from .impls import IMPLEMENTATIONS, PARAM_MAP
    from .gmpo import IMPLEMENTATIONS as GMPO
    from .gmpo import PARAM_MAP as GMPO_MAP
    from .recipes import IMPLEMENTATIONS as RECIPES

    from .head import HEADS

    adapter = TRLAdapter(
        name="trl",
        framework="TRL (huggingface/trl)",
        version=f"trl {v}" if v is not None else "not installed",
        devices=("cpu",),
        dtypes=("float64", "float32", "bfloat16"),
        implementations={k: _with_grad(f) for k, f in {**IMPLEMENTATIONS, **RECIPES, **GMPO}.items()},
        param_map={**PARAM_MAP, **GMPO_MAP},
        deviations=deviations,
    )
    # fused LM-head entry points for `pgspec check --vocab` (conformance/check/logprob.py HEAD_PROTOCOL); they take
    # tensors on any device
    adapter.heads = HEADS
    return adapter
