"""The adapter protocol (DESIGN section 7).

An adapter maps formula IDs to callables over torch tensors in one canonical layout: padded
[B, T] tensors with a boolean ``mask``, per-sequence tensors of shape [B], parameters by their
spec names.  Each callable returns a dict of output tensors named as the spec's outputs; the
runner differentiates the spec's ``grad_of`` output itself (the sum of its unmasked elements), so
a callable only has to be differentiable the way the framework is.  A callable may instead return
``"grad"``: {input name: tensor} when the framework computes gradients its own way (a fused
backward kernel, say).

Deviations live in ``adapters/<name>/deviations.toml``::

    [[deviation]]
    id = "kl.k3"                 # a formula ID or a case ID ("kl.k3/extreme-200")
    dtypes = ["bfloat16"]        # optional: only these dtypes
    kind = "convention"          # convention | bug | unsupported
    reason = "one line"
    link = "https://github.com/.../blob/<tag>/path.py#L10"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

DEVIATION_KINDS = ("convention", "bug", "unsupported")


@dataclass(frozen=True)
class Deviation:
    id: str
    kind: str
    reason: str
    link: str
    dtypes: tuple = ()

    def applies(self, case_id: str, formula_id: str, dtype: str) -> bool:
        if self.dtypes and dtype not in self.dtypes:
            return False
        return self.id in (case_id, formula_id)


def load_deviations(path: Path, keep=None) -> list[Deviation]:
    """Read a deviations.toml; every entry needs id, kind, reason and link.

    ``keep(entry)`` selects entries by any extra key of the adapter's own (e.g. a code path)."""
    if not path.exists():
        return []
    data = tomllib.loads(path.read_text())
    out = []
    for k, entry in enumerate(data.get("deviation", [])):
        if keep is not None and not keep(entry):
            continue
        missing = [key for key in ("id", "kind", "reason", "link") if not entry.get(key)]
        if missing:
            raise ValueError(f"{path}: deviation #{k + 1} lacks {', '.join(missing)}")
        if entry["kind"] not in DEVIATION_KINDS:
            raise ValueError(f"{path}: deviation #{k + 1} kind must be one of {DEVIATION_KINDS}, got {entry['kind']!r}")
        out.append(Deviation(entry["id"], entry["kind"], entry["reason"], entry["link"], tuple(entry.get("dtypes", ()))))
    return out


@dataclass
class Adapter:
    """What an adapter declares.  Subclasses fill ``implementations`` and may override hooks."""

    name: str
    framework: str
    version: str
    devices: tuple = ("cpu",)
    dtypes: tuple = ("float64", "float32", "bfloat16")
    implementations: dict[str, Callable] = field(default_factory=dict)
    # spec parameter name -> the framework's config name, per formula ID (documentation + reports)
    param_map: dict[str, dict[str, str]] = field(default_factory=dict)
    deviations: list[Deviation] = field(default_factory=list)

    def capabilities(self) -> set[str]:
        return set(self.implementations)

    def available(self) -> tuple[bool, str]:
        """(True, "") when the framework can run here, else (False, why)."""
        return True, ""

    def device_available(self, device: str) -> tuple[bool, str]:
        import torch

        if device not in self.devices:
            return False, f"adapter {self.name!r} supports devices {', '.join(self.devices)}, not {device!r}"
        if device == "cuda" and not torch.cuda.is_available():
            return False, "no CUDA device is available on this machine"
        return True, ""

    def call(self, formula_id: str, inputs: dict, params: dict) -> dict:
        return self.implementations[formula_id](inputs, params)

    def deviation_for(self, case_id: str, formula_id: str, dtype: str) -> Deviation | None:
        for d in self.deviations:
            if d.applies(case_id, formula_id, dtype):
                return d
        return None
