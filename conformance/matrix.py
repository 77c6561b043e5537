"""``python -m pgspec.conformance.matrix``: the documented command for the conformance matrix.

Its home is the verdicts room, ``pgspec.conformance.verdicts.matrix``; this module re-exports it
and runs its ``main`` as a script.
"""

import sys

from .verdicts.matrix import *  # noqa: F401,F403
from .verdicts.matrix import main

if __name__ == "__main__":
    sys.exit(main())
