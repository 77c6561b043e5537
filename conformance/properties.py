"""``pgspec.conformance.properties``: the documented import path of the property checks.

Their home is the run room, ``pgspec.conformance.run.properties``; ``Unsupported`` (what an adapter
raises for a formula or dtype a property needs and it lacks) is the adapter protocol's,
``pgspec.adapters.base.Unsupported``.  This module re-exports both, so adapters and user code
written against ``from pgspec.conformance.properties import Unsupported`` keep working.
"""

from .run.properties import *  # noqa: F401,F403
from .run.properties import __all__  # noqa: F401
from pgspec.adapters.base import Unsupported  # noqa: F401
