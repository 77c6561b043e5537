"""The environment variables pgspec reads, each with its documented range (docs/bad-input.md), checked
once before any work (``pgspec`` and the pytest plugin) and again where each is read (issue 39): a
value out of range is one line naming the variable, the range and the value; nothing is clipped.

A ``PGSPEC_*`` variable that pgspec does not know (a misspelling: ``PGSPEC_JOB=4``) would be ignored
silently; it is named in a one-line warning instead (not refused: a newer pgspec's variable in an
older one's environment must not stop a run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# the adapters loaded from a checkout: PGSPEC_<NAME>_SOURCE and PGSPEC_<NAME>_PYTHON
CHECKOUT_ADAPTERS = ("nemo_rl", "slime", "megatron", "fast_llm", "torchtune")


class SettingError(ValueError):
    """An environment variable's value out of its documented range: a usage error (exit 2)."""


@dataclass(frozen=True)
class Int:
    low: int
    high: int
    unit: str

    def check(self, name: str, value: str) -> int:
        text = value.strip()
        try:
            n = int(text, 10)
        except ValueError:
            n = None
        if n is None or not self.low <= n <= self.high:
            raise SettingError(f"{name} must be an integer from {self.low} to {self.high} ({self.unit}), got {value!r}")
        return n


@dataclass(frozen=True)
class Choice:
    choices: tuple

    def check(self, name: str, value: str) -> str:
        if value not in self.choices:
            raise SettingError(f"{name} must be one of {', '.join(repr(c) for c in self.choices)}, got {value!r}")
        return value


@dataclass(frozen=True)
class Folder:
    """A path to a folder; ``off`` where ``allow_off``; must be a directory when it exists."""

    allow_off: bool = False
    must_exist: bool = False

    def check(self, name: str, value: str) -> str:
        if self.allow_off and value == "off":
            return value
        if not value.strip():
            raise SettingError(f"{name} is set but empty; unset it, or give a folder" + (" or 'off'" if self.allow_off else ""))
        if len(value) > 4096 or "\0" in value:
            raise SettingError(f"{name} must be a folder path of at most 4096 characters, got {len(value)} characters")
        path = os.path.expanduser(value)
        if os.path.exists(path) and not os.path.isdir(path):
            raise SettingError(f"{name}={value}: exists and is not a folder")
        if self.must_exist and not os.path.isdir(path):
            raise SettingError(f"{name}={value}: no such folder")
        return value


@dataclass(frozen=True)
class Executable:
    def check(self, name: str, value: str) -> str:
        if not value.strip():
            raise SettingError(f"{name} is set but empty; unset it, or give a Python interpreter")
        return value     # the interpreter itself is checked where it is started (isolated.IsolatedAdapter)


@dataclass(frozen=True)
class Any:
    def check(self, name: str, value: str) -> str:
        return value


VARIABLES = {
    "PGSPEC_JOBS": Int(1, 256, "worker processes of golden generate and verify"),
    "PGSPEC_COMPARE": Choice(("fast", "exact")),
    "PGSPEC_CACHE": Folder(allow_off=True),
    "PGSPEC_LOG_DIR": Folder(),
    "PGSPEC_LOGPROB_ORACLE": Choice(("", "fused", "torch")),
    "PGSPEC_AREAL_COMPILE": Choice(("eager", "default")),
    "PGSPEC_SLIME_COMPILE": Choice(("eager", "specialize", "default")),
    "PGSPEC_FAST_LLM_COMPILE": Choice(("eager", "default")),
    "PGSPEC_FAST_LLM_COMPAT": Choice(("off", "pep695")),
    "PGSPEC_MEGATRON_LAYOUT": Choice(("unpacked", "packed")),
    "PGSPEC_LIGER_RECOMPILE_LIMIT": Int(1, 65536, "torch.compile recompilations per function"),
    "PGSPEC_UNSLOTH_RECOMPILE_LIMIT": Int(1, 65536, "torch.compile recompilations per function"),
    **{f"PGSPEC_{a.upper()}_SOURCE": Folder(must_exist=True) for a in CHECKOUT_ADAPTERS},
    **{f"PGSPEC_{a.upper()}_PYTHON": Executable() for a in CHECKOUT_ADAPTERS},
    # read by ci/ scripts and the project's own tests, not by the package
    **{name: Any() for name in ("PGSPEC_SKIP_INSTALL", "PGSPEC_VENV_PATTERN", "PGSPEC_STANDIN_FOR", "PGSPEC_VENVS",
                                "PGSPEC_JSON_DIR")},
}


def get(name: str, default=None):
    """Variable ``name``'s value checked against its range (SettingError), or ``default`` when unset."""
    value = os.environ.get(name)
    if value is None:
        return default
    return VARIABLES[name].check(name, value)


def check_environment(environ=None) -> list[str]:
    """Check every PGSPEC_* variable that is set (SettingError for the first out of range); return the
    one-line warnings for the PGSPEC_* names pgspec does not know."""
    from .suggest import did_you_mean

    environ = os.environ if environ is None else environ
    warnings = []
    for name in sorted(environ):
        if not name.startswith("PGSPEC_"):
            continue
        kind = VARIABLES.get(name)
        if kind is None:
            warnings.append(f"pgspec: warning: environment variable {name} is not one pgspec reads; it is ignored"
                            f"{did_you_mean(name, VARIABLES)} (docs/bad-input.md lists them)")
            continue
        if name == "PGSPEC_JOBS" and not environ[name].strip():
            continue        # empty: the default
        kind.check(name, environ[name])
    return warnings
