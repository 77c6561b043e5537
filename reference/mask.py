"""mask: formulas of the `mask` family (spec/mask.md)."""

from __future__ import annotations
