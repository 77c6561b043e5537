"""A golden case: ``Case`` (plain data: ID, formula, category, description, inputs, parameters,
links) and ``Generated`` (inputs made on load by the documented generator); ``random_inputs``
makes a ``random`` case's literal inputs.  The family modules of this package build lists of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = ("example", "regression", "edge", "random", "scale", "error")


@dataclass(frozen=True)
class Generated:
    """Inputs made on load by the documented generator ``pgspec-splitmix64/1``.

    ``B`` sequences of ``T`` positions; ``lengths`` gives each sequence's unmasked length (right
    padding), default all ``T``; ``fields`` names the inputs to make (see generate_inputs).
    """

    seed: int
    B: int
    T: int
    fields: tuple
    lengths: tuple | None = None
    groups: int | None = None   # number of prompt groups for group_ids (sequences assigned round-robin)
    documents: int | None = None  # documents per row for document_ids (contiguous, equal spans)

    def to_json(self):
        return {
            "generator": "pgspec-splitmix64/1",
            "seed": self.seed,
            "B": self.B,
            "T": self.T,
            "fields": list(self.fields),
            "lengths": list(self.lengths) if self.lengths is not None else None,
            "groups": self.groups,
            "documents": self.documents,
        }


@dataclass(frozen=True)
class Case:
    id: str                      # stable case ID, "<formula id>/<slug>"
    formula: str
    category: str
    description: str
    inputs: dict | Generated
    params: dict = field(default_factory=dict)
    links: tuple = ()            # issue / source links (required for category "regression")
    expect_error: dict | None = None   # category "error": {"argument": ..., "rule": ...} (cases/errors.py)

    def check(self):
        if not self.id.startswith(self.formula + "/"):
            raise ValueError(f"case {self.id!r}: the ID must start with its formula ID {self.formula!r} and '/'")
        if self.category not in CATEGORIES:
            raise ValueError(f"case {self.id!r}: category must be one of {CATEGORIES}, got {self.category!r}")
        if self.category == "regression" and not self.links:
            raise ValueError(f"case {self.id!r}: a regression case needs a link to its issue")
        if (self.category == "error") != (self.expect_error is not None):
            raise ValueError(f"case {self.id!r}: category 'error' and expect_error go together")
        if self.category == "scale" and not isinstance(self.inputs, Generated):
            raise ValueError(f"case {self.id!r}: a scale case takes Generated inputs")


def random_inputs(seed: int, B: int, T: int, fields, lengths=None) -> dict:
    """Literal inputs for a ``random`` case, made once by the documented generator."""
    from ..generator import generate_inputs

    return generate_inputs(Generated(seed, B, T, tuple(fields), tuple(lengths) if lengths else None).to_json())
