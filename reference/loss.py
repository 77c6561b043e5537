"""loss: formulas of the `loss` family (spec/loss.md)."""

from __future__ import annotations
