"""agg: formulas of the `agg` family (spec/agg.md)."""

from __future__ import annotations
