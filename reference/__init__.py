"""pgspec.reference: the mpmath reference implementation of every pgspec formula.

``evaluate(formula_id, inputs, params=None, *, dps=60)`` is the public entry point; ``REGISTRY``
maps each formula ID to its declaration (inputs, parameters, outputs, spec anchor, references).
Nothing here imports torch or any framework.
"""

from ._errors import SpecError
from ._evaluate import DEFAULT_DPS, evaluate
from ._registry import FAMILIES, REGISTRY, Formula, Input, Output, Param, get

# Importing the family modules registers their formulas.
from . import logprob, ratio, surrogate, is_, mask, kl, agg, adv, dist, loss  # noqa: E402,F401
