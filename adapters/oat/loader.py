"""Loading OAT's learner code from the installed oat-llm 0.2.4 (see adapters/oat/README.md).

oat-llm's package imports vLLM, DeepSpeed, launchpad and transformers at import time
(``oat/__init__.py`` is empty, but ``oat.algorithms.ppo`` imports ``oat.actors``, ``oat.learners``
and ``oat.utils.data``), none of which installs on a CPU machine.  This module executes the
installed package's own files -- ``oat/algorithms/ppo.py``, ``oat/args.py``, ``oat/types.py``,
``oat/utils/ops.py``, ``oat/utils/lm_head.py`` -- with thin stand-ins for the imports the loss code
never uses.  The stand-ins are registered in ``sys.modules`` only when the real module cannot be
imported (a full oat-llm install keeps its own modules), and they are listed in
``STAND_INS`` (and in the README).

Nothing here contains or copies OAT's code.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
from pathlib import Path

# module -> what the stand-in provides and why the loss never needs the real one
STAND_INS = {
    "deepspeed": "imported by ppo.py for deepspeed.zero.GatheredParameters in the fused-LM-head branch of "
                 "get_batch_logps, which the adapter replaces",
    "tree": "dm-tree, used by ppo.py in learn() and the actor, never in learning_step",
    "oat.actors": "RewardActor, base class of PPOActor (vLLM sampling); an empty class",
    "oat.actors.base": "ActorBase (annotations only); an empty class",
    "oat.learners": "RLLearner and OfflineLearner, base classes of PPOLearner (DeepSpeed, launchpad, "
                    "model loading); empty classes: learning_step uses none of their methods",
    "oat.utils.data": "TransitionDataset, get_datasets, load_data_from_disk_or_hf, shard_buffer "
                      "(datasets, transformers), used by _init and the offline learner only",
}

_state = {}


def _package_shell(name: str, path: Path):
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__package__ = name
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__spec__.submodule_search_locations = [str(path)]
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def _stand_in(name: str, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__path__ = []
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__pgspec_stand_in__ = True
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except Exception:  # noqa: BLE001 - any failure means the stand-in is needed
        return False


def _unused(what):
    def fn(*a, **k):
        raise RuntimeError(f"pgspec's stand-in for {what} was called: the OAT adapter does not expect it")
    return fn


def oat_dir() -> Path:
    from importlib import metadata

    dist = metadata.distribution("oat-llm")
    return Path(dist.locate_file("oat"))


def load():
    """(ppo module, ops module, args module), loaded once."""
    if "ppo" in _state:
        return _state["ppo"], _state["ops"], _state["args"]
    root = oat_dir()
    if not (root / "algorithms" / "ppo.py").is_file():
        raise ImportError(f"oat-llm is installed but {root / 'algorithms' / 'ppo.py'} is missing")
    if "oat" not in sys.modules:
        _package_shell("oat", root)
    for pkg in ("oat.utils", "oat.algorithms"):
        if pkg not in sys.modules:
            _package_shell(pkg, root / pkg.split(".")[1])
    if not _importable("deepspeed"):
        _stand_in("deepspeed", zero=types.SimpleNamespace(GatheredParameters=_unused("deepspeed.zero.GatheredParameters")))
    if not _importable("tree"):
        _stand_in("tree", flatten=_unused("tree.flatten"), map_structure=_unused("tree.map_structure"))
    if not _importable("oat.actors"):
        _stand_in("oat.actors", RewardActor=type("RewardActor", (), {}))
        _stand_in("oat.actors.base", ActorBase=type("ActorBase", (), {}))
    if not _importable("oat.learners"):
        _stand_in("oat.learners", RLLearner=type("RLLearner", (), {}), OfflineLearner=type("OfflineLearner", (), {}))
    if not _importable("oat.utils.data"):
        _stand_in("oat.utils.data", TransitionDataset=type("TransitionDataset", (), {}),
                  get_datasets=_unused("get_datasets"), load_data_from_disk_or_hf=_unused("load_data_from_disk_or_hf"),
                  shard_buffer=_unused("shard_buffer"))
    ppo = importlib.import_module("oat.algorithms.ppo")
    ops = importlib.import_module("oat.utils.ops")
    args = importlib.import_module("oat.args")
    _state.update(ppo=ppo, ops=ops, args=args)
    return ppo, ops, args
