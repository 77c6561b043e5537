"""Golden case definitions: plain data, one module per family.

Each family module defines ``cases()`` returning a list of ``Case``.  A case names its formula,
its category and (for hand-checkable examples) the arithmetic in its description.  Inputs are
nested lists of numbers that are exactly representable in bfloat16; ``scale`` cases instead give
a ``Generated`` recipe (see spec/golden-format.md) so that 8192- and 32768-token inputs need no
storage.  Only the generator (``pgspec golden generate``) turns cases into golden files.

Owns: the case tables (one module per family in ``FAMILY_MODULES``, each with ``cases()``), the
error cases derived from them (errors.py) and ``Case``/``Generated`` (case.py).
May import: pgspec.reference and the rest of the corpus (the generator, the name map); nothing above.
Add a case: a ``Case`` in the family's module (a new family: its module and ``FAMILY_MODULES``),
then ``pgspec golden generate``.  The regime cases (regime.py, witnesses that ``pgspec golden
coverage`` asks for) are appended to their family's cases, after its derived error cases.
"""

from __future__ import annotations

import importlib

from .case import CATEGORIES, Case, Generated, random_inputs  # noqa: F401 - the case module's names

FAMILY_MODULES = ("logprob", "ratio", "surrogate", "is_", "mask", "kl", "agg", "adv", "dist", "loss")


def all_cases() -> list[Case]:
    out = []
    seen = set()
    for name in FAMILY_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"{__name__}.{name}":
                continue
            raise
        from .errors import error_cases

        from .regime import cases_for

        module_cases = module.cases()
        for case in module_cases + error_cases(module_cases) + cases_for(name):
            case.check()
            if case.id in seen:
                raise ValueError(f"duplicate case ID {case.id!r}")
            seen.add(case.id)
            out.append(case)
    return out
