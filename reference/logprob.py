"""logprob: formulas of the `logprob` family (spec/logprob.md)."""

from __future__ import annotations
