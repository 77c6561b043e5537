"""Load Megatron-LM's RL loss functions from a checkout, by AST extraction (no stand-ins).

``megatron/rl/rl_utils.py`` imports the whole of megatron.core and megatron.training (446 modules,
triton, pydantic, yaml, wandb, ...).  The two functions this adapter tests use only torch, numpy
and logging, so the loader parses the real file and executes only the definitions of
``calculate_grpo_loss`` and ``calculate_grpo_advantages``, compiled under the real file name (so
tracebacks and ``inspect`` point into the checkout).  Their free names are given explicitly; a
changed function that needs another name fails with a clear error on first use.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

RL_UTILS = "megatron/rl/rl_utils.py"
FUNCTIONS = ("calculate_grpo_loss", "calculate_grpo_advantages")

_loaded = {}


def load(src: Path) -> dict:
    key = str(src)
    if key in _loaded:
        return _loaded[key]
    import numpy as np
    import torch

    path = Path(src) / RL_UTILS
    if not path.is_file():
        raise FileNotFoundError(f"{RL_UTILS} is not in the checkout {src}")
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in FUNCTIONS]
    missing = set(FUNCTIONS) - {n.name for n in found}
    if missing:
        raise LookupError(f"{path} defines no {', '.join(sorted(missing))}")
    logger = logging.getLogger("megatron.rl.rl_utils")
    ns = {"torch": torch, "np": np, "logging": logging, "logger": logger,
          "log_single_rank": lambda lg, level, msg, *a, **k: lg.log(level, msg, *a, **k)}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), ns)  # noqa: S102
    _loaded[key] = {name: ns[name] for name in FUNCTIONS}
    return _loaded[key]
