"""kl: formulas of the `kl` family (spec/kl.md)."""

from __future__ import annotations
