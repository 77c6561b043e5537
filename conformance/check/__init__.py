"""pgspec.conformance.check (see docs/architecture.md)."""

from .core import *  # noqa: F401,F403 - the former module's names
from .core import (_Judge, _exact_row_sums, _float_bits, _is_branch, _is_kinks, _kinks, _kl_branch,  # noqa: F401
                   _kl_kinks, _kl_terms, _logprob_work, _phantom)
