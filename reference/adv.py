"""adv: formulas of the `adv` family (spec/adv.md)."""

from __future__ import annotations
