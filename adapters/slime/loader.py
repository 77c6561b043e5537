"""Import slime's loss code from a checkout (see README.md for the stand-in list).

Executed from the checkout: ``slime/utils/ppo_utils.py``, ``slime/backends/megatron_utils/cp_utils.py``,
``slime/backends/megatron_utils/loss.py``, ``slime/utils/{distributed_utils,misc,types}.py``.  The
``slime/backends/megatron_utils/__init__.py`` (accelerator init, megatron patches) is not run.
Stand-ins: ``megatron.core.mpu`` (the context-parallel rank/size/group, as slime's own CPU tests
stub it), ``slime.utils.http_utils`` (httpx, for a port check).  Runs only inside the adapter's
worker process.

torch.compile: ``compute_approx_kl``, ``compute_policy_loss`` and ``compute_cispo_loss`` are
``@torch.compile(dynamic=True)``.  In torch 2.13 on CPU such a function, called with inputs that
require grad, silently reuses the Python float arguments of its first call (pytorch #194976,
#197889).  The default mode, ``eager``, sets ``torch._dynamo.config.disable`` so the same Python
bodies run eagerly and cannot return stale results.  ``PGSPEC_SLIME_COMPILE=specialize`` keeps the
compiled path with ``torch._dynamo.config.specialize_float = True`` (every float value compiles its
own graph); ``PGSPEC_SLIME_COMPILE=default`` runs torch's default (the exposed configuration, for
showing the trap only).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

from .._gitsource import package_shell, stand_in

EXECUTED = (
    "slime/utils/ppo_utils.py",
    "slime/backends/megatron_utils/cp_utils.py",
    "slime/backends/megatron_utils/loss.py",
    "slime/utils/distributed_utils.py",
    "slime/utils/misc.py",
    "slime/utils/types.py",
)

COMPILE_MODES = ("eager", "specialize", "default")

# the context-parallel state the mpu stand-in reports: a caller sets it to emulate rank r of size n
CP = {"size": 1, "rank": 0, "group": None}

_loaded = {}


def compile_mode() -> str:
    mode = os.environ.get("PGSPEC_SLIME_COMPILE", "eager")
    if mode not in COMPILE_MODES:
        raise ValueError(f"PGSPEC_SLIME_COMPILE must be one of {COMPILE_MODES}, got {mode!r}")
    return mode


def load(src: Path):
    """(ppo_utils, cp_utils, loss) modules from the checkout at ``src``."""
    key = str(src)
    if key in _loaded:
        return _loaded[key]
    if _loaded:
        raise RuntimeError("one slime checkout per process: the worker already loaded " + next(iter(_loaded)))
    for rel in EXECUTED:
        if not (Path(src) / rel).is_file():
            raise FileNotFoundError(f"{rel} is not in the checkout {src}")
    import torch

    mode = compile_mode()
    if mode == "eager":
        torch._dynamo.config.disable = True
    elif mode == "specialize":
        torch._dynamo.config.specialize_float = True
    stand_in("megatron")
    stand_in("megatron.core")
    stand_in(
        "megatron.core.mpu",
        get_context_parallel_world_size=lambda: CP["size"],
        get_context_parallel_rank=lambda: CP["rank"],
        get_context_parallel_group=lambda: CP["group"],
        get_tensor_model_parallel_group=lambda: None,
        get_data_parallel_world_size=lambda with_context_parallel=False: CP["size"] if with_context_parallel else 1,
    )
    root = Path(src) / "slime"
    package_shell("slime", root)
    package_shell("slime.utils", root / "utils")
    package_shell("slime.backends", root / "backends")
    package_shell("slime.backends.megatron_utils", root / "backends" / "megatron_utils")
    stand_in("slime.utils.http_utils", is_port_available=lambda *a, **k: True)
    ppo = importlib.import_module("slime.utils.ppo_utils")
    cp = importlib.import_module("slime.backends.megatron_utils.cp_utils")
    loss = importlib.import_module("slime.backends.megatron_utils.loss")
    _loaded[key] = (ppo, cp, loss)
    return _loaded[key]


def loaded_modules():
    return next(iter(_loaded.values())) if _loaded else None


def in_sys_modules(name: str) -> bool:
    return name in sys.modules
