"""Loading an adapter by built-in name or ``module:object``, and checking what it declares (its name,
dtypes, capabilities, availability: spec/verdicts.md and issue 39's protocol class): every way this
can go wrong is a RunError naming the adapter, exit 2.
"""

from __future__ import annotations

import importlib

from .outputs import _short

BUILTIN_ADAPTERS = {
    "torch": "pgspec.adapters.torch:make_adapter",
    "trl": "pgspec.adapters.trl:make_adapter",
    "liger": "pgspec.adapters.liger:make_adapter",
    "verl": "pgspec.adapters.verl:make_adapter",
    "openrlhf": "pgspec.adapters.openrlhf:make_adapter",
    "skyrl": "pgspec.adapters.skyrl:make_adapter",
    "areal": "pgspec.adapters.areal:make_adapter",
    "nemo_rl": "pgspec.adapters.nemo_rl:make_adapter",
    "slime": "pgspec.adapters.slime:make_adapter",
    "megatron": "pgspec.adapters.megatron:make_adapter",
    "fast_llm": "pgspec.adapters.fast_llm:make_adapter",
    "oat": "pgspec.adapters.oat:make_adapter",
    "torchtune": "pgspec.adapters.torchtune:make_adapter",
    "unsloth": "pgspec.adapters.unsloth:make_adapter",
    "ms_swift": "pgspec.adapters.ms_swift:make_adapter",
}


class RunError(Exception):
    """A usage error of the runner (unknown adapter, bad glob, unavailable device): exit code 2."""


ADAPTER_ATTRIBUTES = ("name", "framework", "version", "dtypes", "devices", "capabilities", "call", "available",
                      "device_available")


# `pip install pgspec` without the torch extra, then `pgspec run`: one line that says what to do
# (it said only "No module named 'torch'")
TORCH_MISSING = ("PyTorch is not installed in this interpreter; in the pgspec checkout: "
                 "pip install -c constraints.txt -e \".[torch]\" (the CPU build; README, Install)")


def _torch_missing(e: BaseException) -> bool:
    return isinstance(e, ImportError) and (e.name or "").split(".")[0] == "torch"


def load_adapter(spec: str):
    """An adapter by built-in name, or ``module:object`` (an Adapter, or a factory returning one).

    Every way this can go wrong (no such module, a module that does not import, a factory that
    raises, an object that is not an adapter) is a RunError with one line naming the adapter."""
    if not isinstance(spec, str) or not spec.strip():
        raise RunError(f"--adapter must be a built-in adapter name or module:object, got {spec!r}")
    target = BUILTIN_ADAPTERS.get(spec, spec)
    if ":" not in target:
        from ..base.suggest import did_you_mean

        known = ", ".join(sorted(BUILTIN_ADAPTERS))
        raise RunError(f"unknown adapter {spec!r}; built-in adapters: {known}; or give module:object"
                       f"{did_you_mean(spec, BUILTIN_ADAPTERS)}")
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise RunError(f"adapter {spec!r}: expected module:object with both parts (e.g. mypkg.adapters:make_adapter)")
    if spec not in BUILTIN_ADAPTERS:
        _current_folder_importable()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        if _torch_missing(e):
            raise RunError(f"adapter {spec!r}: {TORCH_MISSING}") from None
        raise RunError(f"adapter {spec!r}: cannot import {module_name!r}: {e}") from None
    except SyntaxError as e:
        raise RunError(f"adapter {spec!r}: cannot import {module_name!r}: syntax error in {e.filename}, "
                       f"line {e.lineno}: {e.msg}") from None
    except BaseException as e:  # noqa: BLE001 - user code at import: SystemExit included
        if isinstance(e, KeyboardInterrupt):
            raise
        raise RunError(f"adapter {spec!r}: importing {module_name!r} raised {_one_line(e)}") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise RunError(f"adapter {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    if callable(obj) and not hasattr(obj, "implementations"):
        try:
            adapter = obj()
        except BaseException as e:  # noqa: BLE001 - user code: SystemExit included
            if isinstance(e, KeyboardInterrupt):
                raise
            if _torch_missing(e):
                raise RunError(f"adapter {spec!r}: {TORCH_MISSING}") from None
            raise RunError(f"adapter {spec!r}: the factory {attr}() raised {_one_line(e)}") from None
    else:
        adapter = obj
    lacking = [a for a in ADAPTER_ATTRIBUTES if not hasattr(adapter, a)]
    if not hasattr(adapter, "implementations") or lacking:
        what = f"it lacks {', '.join(lacking)}" if lacking else "it has no implementations"
        raise RunError(f"adapter {spec!r}: {target} gave {type(adapter).__name__}, which is not an adapter "
                       f"(pgspec.adapters.base.Adapter): {what}")
    _check_protocol(adapter, spec)
    LOADED_AS[adapter.name] = spec
    return adapter


def _check_protocol(adapter, spec: str) -> None:
    """What an adapter declares is the adapter's to get right, not pgspec's: a value of the wrong type
    (a name that is no string, ``available()`` returning ``True``, ``capabilities()`` returning
    ``None``, an unknown dtype) is a RunError naming the adapter and the attribute (exit 2), never an
    internal error later.  A method that raises is reported where it is called, as before."""
    from ..judge.tolerance import DTYPES

    def bad(what: str, got) -> RunError:
        return RunError(f"adapter {spec!r}: {what}, got {_short(got)} (pgspec.adapters.base.Adapter)")

    for attr in ("name", "framework", "version"):
        value = getattr(adapter, attr)
        if not isinstance(value, str) or not value.strip():
            raise bad(f"{attr} must be a non-empty string", value)
    for attr, known in (("dtypes", DTYPES), ("devices", None)):
        value = getattr(adapter, attr)
        if not isinstance(value, (tuple, list)) or not value or not all(isinstance(x, str) for x in value):
            raise bad(f"{attr} must be a non-empty tuple of strings", value)
        unknown = [x for x in value if known is not None and x not in known]
        if unknown:
            raise bad(f"dtypes must be among {', '.join(known)}", unknown)
    if not isinstance(adapter.implementations, dict):
        raise bad("implementations must be a dict {formula ID: callable}", adapter.implementations)
    try:
        caps = adapter.capabilities()
    except Exception:  # noqa: BLE001 - reported where the run reads them
        caps = set()
    if not isinstance(caps, (set, frozenset, list, tuple)) or not all(isinstance(f, str) for f in caps):
        raise bad("capabilities() must return a set of formula IDs", caps)
    try:
        avail = adapter.available()
    except Exception:  # noqa: BLE001 - reported where the run asks
        return
    if not (isinstance(avail, tuple) and len(avail) == 2 and isinstance(avail[0], bool) and isinstance(avail[1], str)):
        raise bad("available() must return (ok: bool, why: str)", avail)


def _one_line(e: BaseException) -> str:
    """``TypeName: message`` on one line (SystemExit shows its code)."""
    from .untrusted import describe_exception

    return describe_exception(e)    # never raises, whatever the exception's __str__ does


# adapter name -> the spec it was loaded by (``"torch"``, ``"my_module:adapter"``): what a repro
# snippet passes back to load_adapter, so that it reruns exactly what the user ran.
LOADED_AS: dict[str, str] = {}


def _current_folder_importable() -> None:
    """``module:object`` adapters import from the current folder, as ``python -m`` would (the
    ``pgspec`` and ``pytest`` scripts do not put it on sys.path themselves)."""
    import os
    import sys

    cwd = os.getcwd()
    if not any(entry in ("", ".", cwd) for entry in sys.path):
        sys.path.insert(0, cwd)
