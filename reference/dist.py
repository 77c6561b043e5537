"""dist: formulas of the `dist` family (spec/dist.md)."""

from __future__ import annotations
