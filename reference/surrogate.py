"""surrogate: formulas of the `surrogate` family (spec/surrogate.md)."""

from __future__ import annotations
