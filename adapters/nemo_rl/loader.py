"""Import NeMo-RL's loss code from a checkout (see README.md for the stand-in list).

Executed from the checkout: ``nemo_rl/algorithms/loss/interfaces.py``,
``nemo_rl/algorithms/loss/loss_functions.py``, ``nemo_rl/algorithms/utils.py`` and
``nemo_rl/algorithms/advantage_estimator.py``.  The package ``__init__`` files are not run (they pull
ray, megatron and the model stack); every other ``nemo_rl`` module those four files import is a
permissive stand-in whose names refuse to be called.  Runs only inside the adapter's own worker
process.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from .._gitsource import Placeholder, package_shell, permissive_stand_in, stand_in

EXECUTED = (
    "nemo_rl/algorithms/loss/loss_functions.py",
    "nemo_rl/algorithms/loss/interfaces.py",
    "nemo_rl/algorithms/utils.py",
    "nemo_rl/algorithms/advantage_estimator.py",
)

PACKAGES = ("nemo_rl", "nemo_rl.algorithms", "nemo_rl.algorithms.loss", "nemo_rl.algorithms.x_token",
            "nemo_rl.distributed", "nemo_rl.models", "nemo_rl.models.dtensor", "nemo_rl.data", "nemo_rl.utils")
STAND_INS = ("nemo_rl.algorithms.x_token.loss_utils", "nemo_rl.distributed.batched_data_dict",
             "nemo_rl.distributed.model_utils", "nemo_rl.models.dtensor.parallelize", "nemo_rl.data.chat_templates",
             "nemo_rl.models.policy", "nemo_rl.utils.fastokens", "nemo_rl.utils.logger")

_loaded = {}


def load(src: Path):
    """(loss_functions, utils, advantage_estimator) modules from the checkout at ``src``."""
    key = str(src)
    if key in _loaded:
        return _loaded[key]
    if _loaded:
        raise RuntimeError("one NeMo-RL checkout per process: the worker already loaded " + next(iter(_loaded)))
    root = Path(src) / "nemo_rl"
    for rel in EXECUTED:
        if not (Path(src) / rel).is_file():
            raise FileNotFoundError(f"{rel} is not in the checkout {src}")
    for name in PACKAGES:
        package_shell(name, root.joinpath(*name.split(".")[1:]))
    for name in STAND_INS:
        permissive_stand_in(name)
    sys.modules["nemo_rl.models.dtensor.parallelize"].to_local_if_dtensor = lambda t: t

    class BatchedDataDict(dict):
        """The loss only indexes its data argument: a plain dict."""

        def __class_getitem__(cls, item):
            return cls

    sys.modules["nemo_rl.distributed.batched_data_dict"].BatchedDataDict = BatchedDataDict
    if importlib.util.find_spec("transformers") is None:
        # utils.py imports tokenizer classes at module level; the loss functions never use them
        stand_in("transformers", AutoProcessor=Placeholder, AutoTokenizer=Placeholder,
                 PreTrainedTokenizerBase=Placeholder)
    lf = importlib.import_module("nemo_rl.algorithms.loss.loss_functions")
    ut = importlib.import_module("nemo_rl.algorithms.utils")
    # loss/__init__ (not run) re-exports the config class that advantage_estimator imports
    sys.modules["nemo_rl.algorithms.loss"].ClippedPGLossConfig = lf.ClippedPGLossConfig
    adv = importlib.import_module("nemo_rl.algorithms.advantage_estimator")
    _loaded[key] = (lf, ut, adv)
    return _loaded[key]
