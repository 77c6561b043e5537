"""is: formulas of the `is` family (spec/is.md)."""

from __future__ import annotations
