"""pgspec adapter for verl 0.9.1 (see adapters/verl/README.md).

It calls verl's own functions (``verl.trainer.ppo.core_algos``: the policy-loss registry,
``agg_loss``, ``kl_penalty``, ``compute_grpo_outcome_advantage``; ``verl.trainer.ppo.rollout_corr_helper``:
rollout-correction weights and rejection masks).  verl is imported lazily: this module and
``make_adapter()`` work without verl installed, and ``available()`` then says why it cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ..base import Adapter, load_deviations

FRAMEWORK = "verl"
PINNED = "0.9.1"


def _installed_version() -> str | None:
    try:
        return metadata.version(FRAMEWORK)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class VerlAdapter(Adapter):
    framework_modules = ("verl",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    def available(self) -> tuple[bool, str]:
        version = _installed_version()
        if version is None:
            return False, (f"verl is not installed in this interpreter: in the pgspec checkout, "
                           f"pip install -c constraints.txt -e \".[verl]\" (verl=={PINNED}; adapters/verl/README.md)")
        try:
            from verl.trainer.ppo import core_algos, rollout_corr_helper  # noqa: F401
            from verl.workers.config import ActorConfig  # noqa: F401
        except Exception as e:  # noqa: BLE001 - any import failure makes the adapter unavailable
            return False, f"verl {version} is installed but cannot be imported: {type(e).__name__}: {e}"
        return True, ""


def make_adapter() -> Adapter:
    from .impl import IMPLEMENTATIONS, PARAM_MAP

    version = _installed_version()
    return VerlAdapter(
        name="verl",
        framework=FRAMEWORK,
        version=version if version is not None else f"not installed (adapter written for {PINNED})",
        devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16"),
        implementations=dict(IMPLEMENTATIONS),
        param_map=PARAM_MAP,
        deviations=load_deviations(Path(__file__).with_name("deviations.toml")),
    )
