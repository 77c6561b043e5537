"""The built-in ``torch`` backend: every formula in plain, idiomatic PyTorch.

It is the default backend of ``pgspec run``, the float64 oracle for large-scale checks and the
CUDA reference for kernels.  Masked positions are handled with ``torch.where`` (never by
multiplying by zero), gradients come from autograd with ``.detach()`` exactly where the spec
writes sg[.].  One module per family; each exposes ``IMPLEMENTATIONS``.  Every implementation
first checks its inputs and parameters (``_validate``): the backend rejects what the spec rejects.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ..base import Adapter, load_deviations
from ._validate import validated

FAMILY_MODULES = ("logprob", "ratio", "surrogate", "is_", "mask", "kl", "agg", "adv", "dist", "loss")


def implementations() -> dict:
    impls = {}
    for name in FAMILY_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{name}":
                continue
            raise
        impls.update({fid: validated(fid, fn) for fid, fn in module.IMPLEMENTATIONS.items()})
    return impls


def make_adapter() -> Adapter:
    import torch

    adapter = Adapter(
        name="torch",
        framework="pgspec built-in PyTorch backend",
        version=f"torch {torch.__version__}",
        devices=("cpu", "cuda"),
        dtypes=("float64", "float32", "bfloat16", "float16"),
        implementations=implementations(),
        deviations=load_deviations(Path(__file__).with_name("deviations.toml")),
    )
    # the backend is the framework: its own code, and the reference's parameter checks it calls
    adapter.framework_modules = ("pgspec.adapters.torch", "pgspec.reference")
    return adapter
