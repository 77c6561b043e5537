"""pgspec.conformance.check: `pgspec check`, one formula at production size against a float64 oracle.

Owns: ``core`` (the arguments, ``run_check``, ``run_checks``), ``draws`` (the seeded inputs, drawn
off every kink of the formula), ``rounding`` and ``terms`` and ``scales`` (the oracle: the
reference's running error bound as tensor operations; ``scales.oracle``), ``judging`` (each element
within K u S + floor of the oracle, and the adapter's declarations), ``branches`` (which sides of the
formula's decisions the inputs reached), ``composites`` with ``logprob``, ``logprob_fused``(_kernels)
and ``head_loss`` (log-probs and token losses from hidden states and an LM head), and ``common``
(the formulas with an oracle, the results, ``CheckError``).  This package re-exports the former
module pgspec.conformance.check's public names.

May import: pgspec.conformance.run (the runner's adapter loading and classification), pgspec.adapters,
the verdicts, the judge, the corpus, the base and pgspec.reference; never the edges (cli, report).

Add a formula to `pgspec check`: its oracle scale in terms.py (a loss term) or scales.py (an
aggregation), its entry in common.ORACLE_FORMULAS, its inputs' draw in draws.check_inputs (off its
kinks), its decisions in branches.py; tests/test_check.py holds the oracle to the mpmath reference.
"""

# The former module pgspec.conformance.check's public names, from the parts that now hold them
from .common import (AGG_FREE_PARAMS, CheckError, CheckResult, HEAD_LOSS_FORMULAS, LOSS_AGGREGATION,  # noqa: F401
                     ORACLE_FORMULAS, OutputCheck, TOKEN_LOSSES, U64, VOCAB_FORMULAS, parse_shape)
from .draws import (BAND, DOCUMENTS, ENTROPY_SPREAD, GAP, INSIDE, IS_SPREAD, KL_SPREAD, NEAREST,  # noqa: F401
                    OPSM_SPREAD, OUTLIERS, REACH, ROUNDS, SHORT_ROW, SPREAD, TIE, VESPO_SPREAD,
                    check_inputs, draw_log_ratios, entropy_off_the_quantile, old_logprobs_for,
                    old_logprobs_off_the_kinks, old_logprobs_per_sequence, old_logprobs_row_sums,
                    old_logprobs_spread, pcg64, ref_logprobs_spread, sampler_logprobs_for_minirl,
                    sampler_logprobs_for_opsm, sampler_logprobs_for_opsm_and_is,
                    sampler_logprobs_for_vespo, sampler_logprobs_off_the_kinks, seeded_inputs,
                    to_tensors)
from .terms import entropy_keep, is_weights, opsm_keep  # noqa: F401
from .scales import (describe_formulas, oracle, oracle_needs, oracle_params, oracle_scales)  # noqa: F401
from .composites import run_head_loss_checks, run_logprob_checks  # noqa: F401
from .core import check_arguments, run_check, run_checks  # noqa: F401
