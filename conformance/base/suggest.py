"""'did you mean ...?' for a mistyped name: a subcommand, an option, an adapter, a formula ID or glob.

Imports nothing of pgspec, so that every room (the command line, the runner, the pytest plugin)
can use it."""

from __future__ import annotations

import difflib


def close(word: str, choices, n: int = 3) -> list[str]:
    """The choices closest to ``word`` (difflib's ratio of at least 0.6), best first; case folded."""
    choices = list(dict.fromkeys(str(c) for c in choices))
    folded = {c.lower(): c for c in choices}
    return [folded[m] for m in difflib.get_close_matches(word.lower(), list(folded), n=n, cutoff=0.6)]


def did_you_mean(word: str, choices, n: int = 3) -> str:
    """'' when nothing is close, else "; did you mean 'x'?" (or "'x' or 'y'")."""
    matches = close(word, choices, n)
    if not matches:
        return ""
    return "; did you mean " + " or ".join(repr(m) for m in matches) + "?"


def formula_candidates(formula_ids) -> list[str]:
    """What a mistyped ``--formulas`` glob is compared with: every formula ID and every family's
    glob (``kl.*``)."""
    ids = sorted(formula_ids)
    return ids + sorted({fid.split(".")[0] + ".*" for fid in ids})


def formula_globs_hint(globs, formula_ids) -> str:
    """'did you mean' for each glob of a selection that matched nothing ('' when none is close)."""
    hints = []
    candidates = formula_candidates(formula_ids)
    for g in globs:
        matches = close(g.split("/")[0], candidates)
        if matches:
            hints.append(f"{g!r}: did you mean " + " or ".join(repr(m) for m in matches) + "?")
    return ("; " + "; ".join(hints)) if hints else ""
