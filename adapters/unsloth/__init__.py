"""pgspec adapters for Unsloth (unsloth 2026.10.9 with unsloth-zoo 2026.10.9; see adapters/unsloth/README.md).

Unsloth's GRPO loss lives in ``unsloth_zoo.rl_replacements``: ``grpo_compute_loss`` (the arithmetic) and
``UnslothEfficientGRPO`` (what training runs: a compiled ``torch.func.grad_and_value`` of it).

- ``make_adapter`` (``unsloth``): ``grpo_compute_loss`` called eagerly, every formula it implements;
- ``make_compiled_adapter`` (``unsloth-compiled``, ``--adapter pgspec.adapters.unsloth:make_compiled_adapter``):
  the loss.* recipes through ``UnslothEfficientGRPO.apply``, Unsloth's default training path (torch.compile,
  ``fullgraph=True, dynamic=True``).

unsloth-zoo is imported lazily, so this module imports without it; ``available()`` then says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..base import Adapter, load_deviations

FRAMEWORK = "unsloth-zoo"
PINNED = "2026.10.9"
DEVIATIONS = Path(__file__).with_name("deviations.toml")
COMPILED_DEVIATIONS = Path(__file__).with_name("deviations-compiled.toml")
INSTALL = "bash ci/install-unsloth.sh VENV (unsloth and unsloth-zoo 2026.10.9 --no-deps; adapters/unsloth/README.md)"


def _version(dist=FRAMEWORK):
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - not installed
        return None


def _describe():
    z, u = _version(), _version("unsloth")
    return f"unsloth-zoo {z}" + (f", unsloth {u}" if u else "")


@dataclass
class UnslothAdapter(Adapter):
    framework_modules = ("unsloth_zoo", "unsloth")   # its exceptions are the framework's rejections

    def available(self) -> tuple[bool, str]:
        if _version() is None:
            return False, f"unsloth-zoo is not installed in this interpreter: {INSTALL}"
        try:
            from ._engine import zoo

            zoo()
        except Exception as e:  # noqa: BLE001
            return False, f"unsloth_zoo.rl_replacements does not import: {type(e).__name__}: {e}"
        return True, ""


def _with_grad(fn):
    """The read-outs differentiate Unsloth's scalar loss, so they need autograd even under torch.no_grad()."""

    def run(inputs, params):
        import torch

        with torch.enable_grad():
            return fn(inputs, params)

    run.__name__ = getattr(fn, "__name__", "run")
    run.__doc__ = fn.__doc__
    return run


def make_adapter() -> Adapter:
    deviations = load_deviations(DEVIATIONS)
    if _version() is None:
        return UnslothAdapter(name="unsloth", framework="Unsloth (unslothai/unsloth-zoo)", version="not installed",
                              implementations={}, deviations=deviations)
    from .impls import IMPLEMENTATIONS, PARAM_MAP
    from .recipes import IMPLEMENTATIONS as RECIPES

    return UnslothAdapter(
        name="unsloth", framework="Unsloth (unslothai/unsloth-zoo)", version=f"{_describe()}; grpo_compute_loss (eager)",
        devices=("cpu", "cuda"), dtypes=("float64", "float32", "bfloat16"),
        implementations={k: _with_grad(f) for k, f in {**IMPLEMENTATIONS, **RECIPES}.items()},
        param_map=PARAM_MAP, deviations=deviations)


def load_compiled_deviations():
    """The compiled path: deviations.toml whole (it traces the same grpo_compute_loss), then
    deviations-compiled.toml (what UnslothEfficientGRPO and torch.compile add)."""
    from pgspec.conformance.verdicts.declarations import Declarations

    shared = load_deviations(DEVIATIONS)
    own = load_deviations(COMPILED_DEVIATIONS)
    return Declarations(f"{shared.path} + {own.path}", [*shared.unsupported, *own.unsupported],
                        [*shared.capabilities, *own.capabilities], [*shared.rules, *own.rules])


def make_compiled_adapter() -> Adapter:
    """The loss.* recipes through UnslothEfficientGRPO.apply (torch.compile, fullgraph=True, dynamic=True).

    As for liger-compiled: dynamo stops compiling after ``recompile_limit`` (8) recompiles (Unsloth's
    ``torch_compile_with_fallback`` then runs the function eagerly); a training run meets few configurations and
    keeps compiling, so the limit is raised (``PGSPEC_UNSLOTH_RECOMPILE_LIMIT``, default 256) so that every call
    runs compiled code."""
    import os

    import torch._dynamo

    deviations = load_compiled_deviations()
    if _version() is None:
        return UnslothAdapter(name="unsloth-compiled", framework="Unsloth (unslothai/unsloth-zoo)",
                              version="not installed", implementations={}, deviations=deviations)
    from .impls import PARAM_MAP
    from .recipes import COMPILED_IMPLEMENTATIONS

    limit = int(os.environ.get("PGSPEC_UNSLOTH_RECOMPILE_LIMIT", "256"))
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 16 * limit)
    return UnslothAdapter(
        name="unsloth-compiled", framework="Unsloth (unslothai/unsloth-zoo)",
        version=f"{_describe()}; UnslothEfficientGRPO (torch.compile, recompile_limit {limit})",
        devices=("cpu", "cuda"), dtypes=("float64", "float32", "bfloat16"),
        implementations={k: _with_grad(f) for k, f in COMPILED_IMPLEMENTATIONS.items()},
        param_map={k: v for k, v in PARAM_MAP.items() if k in COMPILED_IMPLEMENTATIONS}, deviations=deviations)
