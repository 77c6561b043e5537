"""``pgspec.conformance.strategies``: the public hypothesis strategies (DESIGN section 8).

Their home is the corpus room, ``pgspec.conformance.corpus.strategies``; this module is the
documented import path (``from pgspec.conformance import strategies as pst``) and re-exports them.
"""

from .corpus.strategies import *  # noqa: F401,F403
from .corpus.strategies import __all__  # noqa: F401
