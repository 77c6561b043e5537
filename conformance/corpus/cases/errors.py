"""Expected-error cases: the spec's documented error conditions as golden data.

For every formula, starting from its first example case (valid inputs and parameters), one case per
documented error condition, each changing exactly one thing:

* every parameter with a range (spec parameter tables; the registry's ``Param``): a value just
  outside it (below ``lo`` or above ``hi``, the bound itself where it is open), and an unknown
  choice for a choice parameter;
* every pair of bounds that must be ordered (``*_min < *_max``, ``c_min <= c_max``, ``lower <= upper``):
  the two swapped;
* an unknown parameter name;
* inputs (spec/conventions.md, "Inputs"): a required input left out, ``mask`` with one row too few,
  a ragged [B,T] input (one row one token short), and NaN at an unmasked position of a real input.

and, in ``SPECIFIC``, one case for every formula-specific error condition the spec documents (a global
count below the local one, per-group and per-document counts that disagree or fall short, meaningless
parameter combinations, the inputs a recipe option requires or never reads, the dist.* layouts that
cannot be split, ...), each with the spec clause it quotes; plus the generic kinds the registry checks
(a value of the wrong type, a non-finite parameter).  ``conformance/corpus/coverage.py``
checks from the reference that every ``SpecError`` site is reached by some expected-error case.

Each case records the argument the error must name and the rule it breaks (``expect_error``); the
generator checks that the reference rejects the case with a ``SpecError`` whose message names the
argument, and stores that message.  An implementation passes such a case by raising (any exception);
returning numbers is a ``fail`` that quotes the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from pgspec.reference import REGISTRY

from .case import Case

ORDERED_PAIRS = (("log_ratio_min", "log_ratio_max"), ("output_min", "output_max"), ("c_min", "c_max"),
                 ("lower", "upper"), ("kl_log_ratio_min", "kl_log_ratio_max"), ("kl_output_min", "kl_output_max"))
# (a recipe's is_c_min / is_c_max are only read, and so only checked, when is_level is not "none")


def _outside(p):
    """(value, what) just outside a parameter's range, or None when it has no finite bound."""
    out = []
    if p.kind in ("real", "int"):
        if p.lo is not None:
            v = p.lo if p.lo_open else p.lo - 1
            out.append((int(v) if p.kind == "int" else float(v), "below"))
        if p.hi is not None:
            v = p.hi if p.hi_open else p.hi + 1
            out.append((int(v) if p.kind == "int" else float(v), "above"))
    elif p.kind == "choice":
        out.append(("not-a-choice", "choice"))
    return out


def _base(cases: list) -> dict:
    """formula -> its first example case with literal inputs (else its first literal case)."""
    out = {}
    for c in cases:
        if isinstance(c.inputs, dict) and c.formula not in out and c.category == "example":
            out[c.formula] = c
    for c in cases:
        if isinstance(c.inputs, dict) and c.formula not in out and c.category != "error":
            out[c.formula] = c
    return out


def _first_bt(f, inputs, kind="real"):
    for i in f.inputs:
        if i.name in inputs and i.kind == kind and i.shapes and tuple(i.shapes[0])[:2] == ("B", "T") \
                and isinstance(inputs[i.name], list) and inputs[i.name] and isinstance(inputs[i.name][0], list):
            return i.name
    return None


def error_cases(cases: list) -> list[Case]:
    out = []
    for fid, base in _base(cases).items():
        f = REGISTRY[fid]
        inputs, params = base.inputs, dict(base.params)

        def add(slug, argument, rule, new_inputs=None, new_params=None, what=""):
            out.append(Case(f"{fid}/error-{slug}", fid, "error",
                            f"expected error: {what} (from {base.id}); the spec requires rejecting it: "
                            f"{argument}: {rule}",
                            new_inputs if new_inputs is not None else inputs,
                            new_params if new_params is not None else params,
                            expect_error={"argument": argument, "rule": rule}))

        for p in f.params:
            for value, side in _outside(p):
                add(f"{p.name.replace('_', '-')}-{side}", p.name, f"must be {p.range_text()}",
                    new_params={**params, p.name: value}, what=f"{p.name} = {value!r}")
        names = {p.name for p in f.params}
        for lo, hi in ORDERED_PAIRS:
            if lo in names and hi in names:
                add(f"{lo.replace('_', '-')}-above-{hi.replace('_', '-')}", lo, f"must be less than {hi}",
                    new_params={**params, lo: 2.0, hi: 1.0}, what=f"{lo} = 2 > {hi} = 1")
        add("unknown-parameter", "no_such_parameter", "unknown parameter",
            new_params={**params, "no_such_parameter": 1}, what="an unknown parameter")
        required = [i.name for i in f.inputs if not i.optional and i.name in inputs]
        if required:
            name = required[0]
            add(f"missing-{name.replace('_', '-')}", name, "required input",
                new_inputs={k: v for k, v in inputs.items() if k != name}, what=f"input {name} left out")
        if fid.startswith("loss.") and "logprobs" in inputs:
            beta = params.get("beta", next(p.default for p in f.params if p.name == "beta"))
            if float(beta) > 0 and "ref_logprobs" in inputs:
                add("missing-ref-logprobs-for-kl", "ref_logprobs", "required when beta > 0",
                    new_inputs={k: v for k, v in inputs.items() if k != "ref_logprobs"},
                    what=f"beta = {beta} without ref_logprobs")
            elif float(beta) == 0 and "ref_logprobs" not in inputs:
                add("unread-ref-logprobs", "ref_logprobs", "an input no enabled option reads is an error",
                    new_inputs={**inputs, "ref_logprobs": inputs["logprobs"]},
                    what="ref_logprobs given with beta = 0")
        mask = inputs.get("mask")
        if isinstance(mask, list) and len(mask) > 1:
            add("mask-rows", "mask", "shape [B,T] like the other inputs",
                new_inputs={**inputs, "mask": mask[:-1]}, what="mask with one row too few")
        bt = _first_bt(f, inputs)
        if bt is not None and len(inputs[bt][0]) > 1:
            ragged = [list(inputs[bt][0][:-1])] + [list(r) for r in inputs[bt][1:]]
            add(f"ragged-{bt.replace('_', '-')}", bt, "rows of equal length (shape [B,T])",
                new_inputs={**inputs, bt: ragged}, what=f"{bt} with a first row one token short")
        if bt is not None and isinstance(mask, list):
            pos = next(((b, t) for b, row in enumerate(mask) for t, m in enumerate(row) if m), None)
            if pos is not None:
                dirty = [list(r) for r in inputs[bt]]
                dirty[pos[0]][pos[1]] = "nan"
                add(f"nan-unmasked-{bt.replace('_', '-')}", bt, "finite where mask is true",
                    new_inputs={**inputs, bt: dirty}, what=f"NaN in {bt} at the unmasked position {list(pos)}")
    return out + specific_cases(cases)


# Formula-specific error conditions ---------------------------------------------------------------
DROP = object()   # in a change: leave this input / parameter out


@dataclass(frozen=True)
class Copy:
    """In a change: the base case's value of another input."""
    name: str


# (formula, slug, argument, rule (the spec clause quoted), input changes, parameter changes); each is
# applied to the formula's base case (its first example).
_L = "loss.grpo"
SPECIFIC = (
    # agg (spec/agg.md, "Scope" and the parameter tables)
    ("agg.token_mean", "num-tokens-below-local", "num_tokens",
     "integer >= the batch's token count (spec/agg.md: a global count smaller than the count in the batch at hand "
     "is an error)", {}, {"num_tokens": 2}),
    ("agg.sample_mean", "num-sequences-below-local", "num_sequences",
     "integer >= the local count (spec/agg.md: a global count smaller than the count in the batch at hand is an "
     "error)", {}, {"num_sequences": 1}),
    ("agg.sample_mean", "sequence-token-counts-length", "sequence_token_counts",
     "list [B] of integers >= L_i (one entry per sequence)", {}, {"sequence_token_counts": [2]}),
    ("agg.sample_mean", "sequence-token-counts-below-length", "sequence_token_counts",
     "list [B] of integers >= L_i (sequence 0 has 2 unmasked tokens, given 1)", {}, {"sequence_token_counts": [1, 1]}),
    ("agg.sample_mean", "sequence-token-counts-negative", "sequence_token_counts",
     "a list [B] of integers >= 0", {}, {"sequence_token_counts": [2, -1]}),
    ("agg.sample_mean", "sequence-token-counts-not-a-list", "sequence_token_counts",
     "a list [B] of integers, or null", {}, {"sequence_token_counts": 3}),
    ("agg.sample_mean", "count-empty-sequences-not-bool", "count_empty_sequences", "true or false", {},
     {"count_empty_sequences": "yes"}),
    ("agg.seq_mean_token_sum", "num-sequences-below-local", "num_sequences",
     "integer >= the local count (spec/agg.md: a global count smaller than the count in the batch at hand is an "
     "error)", {}, {"num_sequences": 1}),
    ("agg.constant", "num-sequences-below-local", "num_sequences",
     "integer >= the local count (spec/agg.md: a global count smaller than the count in the batch at hand is an "
     "error)", {}, {"num_sequences": 1}),
    ("agg.constant", "divisor-null", "divisor", "required (spec/agg.md: `divisor` K, default: required, real > 0)",
     {}, {"divisor": None}),
    ("agg.constant", "divisor-nan", "divisor",
     "a finite real > 0: NaN is refused (slime #2060 and #2090 refuse a divisor that is not > 0, NaN included)",
     {}, {"divisor": "nan"}),
    ("agg.prompt_mean", "group-ids-null", "group_ids",
     "an integer group id for every sequence: a null id is an error (slime #2090 raises on "
     "Sample.group_index = None, rollout.py L784-L790)", {"group_ids": [0, None, 1]}, {}),
    ("agg.prompt_mean", "num-groups-below-local", "num_groups",
     "integer >= the local count (spec/agg.md: a global count smaller than the count in the batch at hand is an "
     "error)", {}, {"num_groups": 1}),
    ("agg.prompt_mean", "group-token-counts-length", "group_token_counts", "list [B], one entry per sequence", {},
     {"group_token_counts": [3, 3]}),
    ("agg.prompt_mean", "group-token-counts-differ-in-group", "group_token_counts",
     "entry i = the whole group of sequence i's token count, the same for all its members", {},
     {"group_token_counts": [3, 4, 2]}),
    ("agg.prompt_mean", "group-token-counts-below-local", "group_token_counts",
     "the whole group's token count, >= the local count (group 0 has 3 unmasked tokens, given 2)", {},
     {"group_token_counts": [2, 2, 2]}),
    ("agg.prompt_mean", "num-groups-with-step-divisor-sequences", "num_groups",
     "no meaning with step_divisor = sequences (Z = N_seq): it must be null", {},
     {"step_divisor": "sequences", "num_groups": 2}),
    ("agg.prompt_mean", "num-sequences-with-step-divisor-groups", "num_sequences",
     "integer >= B, or null; only with step_divisor = sequences", {}, {"num_sequences": 3}),
    ("agg.prompt_mean", "num-sequences-below-b", "num_sequences", "integer >= B, or null; only with step_divisor = "
     "sequences (B = 3, given 2)", {}, {"step_divisor": "sequences", "num_sequences": 2}),
    ("agg.document_mean", "num-documents-below-local", "num_documents",
     "integer >= the local count (spec/agg.md: a global count smaller than the count in the batch at hand is an "
     "error)", {}, {"num_documents": 2}),
    ("agg.document_mean", "document-token-counts-shape", "document_token_counts",
     "list [B,T] of integers (the shape of mask)", {}, {"document_token_counts": [[2, 2, 2]]}),
    ("agg.document_mean", "document-token-counts-row-not-a-list", "document_token_counts",
     "list [B,T] of integers (one list per row)", {}, {"document_token_counts": [[2, 2, 2], 5]}),
    ("agg.document_mean", "document-token-counts-differ-in-document", "document_token_counts",
     "N_d at each token of d: the same integer at every unmasked token of a document (document 1 is given 2 and 3)",
     {}, {"document_token_counts": [[2, 2, 2], [3, 1, None]]}),
    ("agg.document_mean", "document-token-counts-null-at-unmasked", "document_token_counts",
     "null allowed at masked positions only (document 2 has null at an unmasked token)", {},
     {"document_token_counts": [[2, 2, 2], [2, None, None]]}),
    ("agg.document_mean", "document-token-counts-below-local", "document_token_counts",
     "N_d >= the document's unmasked tokens in this batch (document 0 has 2, given 1)", {},
     {"document_token_counts": [[1, 1, 2], [2, 1, None]]}),
    # dist (spec/dist.md)
    ("dist.cp_split", "sequence-lengths-length", "sequence_lengths", "list [B], one entry per sequence", {},
     {"sequence_lengths": [12, 12]}),
    ("dist.cp_split", "sequence-lengths-one-for-two", "sequence_lengths",
     "list [B], one entry per sequence (B = 2, one entry given: it is not broadcast to every sequence)",
     {"mask": [[False] * 4 + [True] * 8, [False] * 4 + [True] * 6 + [False] * 2]}, {"sequence_lengths": [12]}),
    ("dist.cp_split", "sequence-lengths-short", "sequence_lengths",
     "n_i covers the sequence's unmasked positions (the last unmasked position is 11: n_0 >= 12)", {},
     {"sequence_lengths": [11]}),
    ("dist.cp_split", "sequence-lengths-beyond-width", "sequence_lengths",
     "n_i fits in the padded width T (T = 12)", {}, {"sequence_lengths": [13]}),
    ("dist.cp_split", "logit-ownership-position-0", "mask",
     "ownership = logit: an unmasked position 0 is an error (slime requires a prompt of length >= 1)",
     {"mask": [[True] * 12]}, {}),
    ("dist.cp_split", "max-seq-len-with-thd", "max_seq_len",
     "applies only to layout = bshd (thd cuts each sequence by its own length); it must be null", {},
     {"max_seq_len": 12}),
    ("dist.cp_split", "max-seq-len-short", "max_seq_len",
     "must be at least every sequence's length (sequence 0 has length 12)", {}, {"layout": "bshd", "max_seq_len": 8}),
    ("dist.cp_split", "cp-size-not-integer", "cp_size", "an integer >= 1", {}, {"cp_size": 1.5}),
    ("dist.cp_reduce", "prompt-mean-without-group-ids", "group_ids",
     "required for agg.prompt_mean (spec/dist.md: group_ids and document_ids are required for agg.prompt_mean and "
     "agg.document_mean)", {}, {"aggregator": "agg.prompt_mean"}),
    ("dist.cp_reduce", "document-mean-without-document-ids", "document_ids",
     "required for agg.document_mean (spec/dist.md: group_ids and document_ids are required for agg.prompt_mean "
     "and agg.document_mean)", {}, {"aggregator": "agg.document_mean"}),
    ("dist.cp_reduce", "agg-params-not-an-object", "agg_params",
     "an object of the chosen aggregator's parameters, or null", {}, {"agg_params": 5}),
    ("dist.cp_reduce", "agg-params-unknown-parameter", "agg_params",
     "the chosen aggregator's parameters (agg.token_mean has no 'divisor')", {}, {"agg_params": {"divisor": 4}}),
    ("dist.accumulate", "micro-batch-sizes-sum", "micro_batch_sizes",
     "positive integers summing to B (B = 4, given 2 + 1)", {}, {"micro_batch_sizes": [2, 1]}),
    ("dist.accumulate", "micro-batch-sizes-zero", "micro_batch_sizes",
     "positive integers summing to B (an empty micro-batch)", {}, {"micro_batch_sizes": [0, 4]}),
    ("dist.docs_per_step", "document-spans-micro-batches", "document_ids",
     "a document spanning two micro-batches is an error (a micro-batch holds whole documents)",
     {"document_ids": [[0, 0, 0], [0, 1, 1], [2, 2, 2], [3, 3, 3]]}, {}),
    ("dist.docs_per_step", "docs-per-step-beyond-input", "docs_per_step",
     "at most the documents of the whole input (4 here): the step never reaches its target", {},
     {"docs_per_step": 5}),
    # surrogate, mask, is, logprob
    ("surrogate.pg", "logprob-form-with-old-logprobs", "old_logprobs",
     "with form = logprob, giving old_logprobs is an error (it is not read)", {}, {"form": "logprob"}),
    ("surrogate.pg", "logprob-form-with-clamp", "log_ratio_clamp",
     "must be null for form = logprob (no ratio)", {"old_logprobs": DROP},
     {"form": "logprob", "log_ratio_clamp": 1.0}),
    ("surrogate.cispo", "eps-low-with-absolute-cap", "eps_low",
     "applies only to cap_form = relative (absolute: w = min(r, eps_high), no lower bound); it must be null", {},
     {"cap_form": "absolute", "eps_high": 4.0, "eps_low": 0.2}),
    ("mask.geometric_sequence", "no-bound", "lower",
     "at least one of lower and upper must be set (a band with no bound keeps every sequence)", {},
     {"lower": None, "upper": None}),
    ("mask.geometric_sequence", "numerator-input-missing", "logprobs",
     "the input named by numerator must be given (numerator = logprobs)", {}, {"numerator": "logprobs"}),
    ("mask.geometric_sequence", "other-input-given", "logprobs",
     "the input numerator does not name must not be given (an unused log-prob input is an error)",
     {"logprobs": Copy("old_logprobs")}, {}),
    ("mask.entropy_quantile", "negative-entropy", "entropy", "an entropy is >= 0 at every unmasked position",
     {"entropy": [["-0.5", "1.0", "2.0", "3.0"], ["0.25", "1.5", "7.0", "0.0"]]}, {}),
    ("is.token.mask", "no-bound", "c_min", "at least one bound must be set (a mask with no band keeps every token)",
     {}, {"c_min": None, "c_max": None}),
    ("is.reject", "no-bound", "lower", "at least one bound must be set", {}, {"lower": None, "upper": None}),
    ("logprob.token", "target-out-of-vocabulary", "targets",
     "a token id in [0, V) where the mask is true (V = 4, given 4)", {"targets": [[4]]}, {}),
    ("logprob.entropy", "empty-vocabulary", "logits", "V >= 1 vocabulary entries", {"logits": [[[]]]}, {}),
    ("kl.k3", "log-ratio-min-not-a-number", "log_ratio_min", "a real number or null", {},
     {"log_ratio_min": "abc"}),
    ("kl.k3", "log-ratio-min-infinite", "log_ratio_min", "a finite real number or null (null: no bound)", {},
     {"log_ratio_min": "-inf"}),
    ("kl.k3", "log-ratio-min-not-a-real", "log_ratio_min", "a real number or null", {}, {"log_ratio_min": [1]}),
    ("surrogate.ppo_clip", "eps-low-null", "eps_low", "a real in [0, 1) (not nullable)", {}, {"eps_low": None}),
    # loss recipes (spec/loss.md, "Inputs" and the option table)
    (_L, "sampler-missing-for-is", "sampler_logprobs",
     "a missing input an enabled option needs is an error naming it (is_level = token needs sampler_logprobs)",
     {"ref_logprobs": DROP}, {"beta": 0, "is_level": "token"}),
    (_L, "sampler-missing-for-opsm", "sampler_logprobs",
     "a missing input an enabled option needs is an error naming it (opsm_delta needs sampler_logprobs)",
     {"ref_logprobs": DROP}, {"beta": 0, "opsm_delta": 0.125}),
    ("loss.minirl", "sampler-missing", "sampler_logprobs", "sampler_logprobs is required",
     {"sampler_logprobs": DROP}, {}),
    (_L, "sampler-unread", "sampler_logprobs",
     "an optional input that no enabled option reads is an error (is_level = none, opsm_delta = null)",
     {"sampler_logprobs": [["-1.0", "-2.0"]]}, {}),
    ("loss.dapo", "group-ids-missing", "group_ids",
     "a missing input an enabled option needs is an error naming it (the prompt_mean aggregation needs group_ids)",
     {"group_ids": DROP}, {}),
    (_L, "group-ids-unread", "group_ids",
     "an optional input that no enabled option reads is an error (the sample mean reads no group_ids)",
     {"group_ids": [0]}, {}),
    (_L, "entropy-missing", "entropy",
     "a missing input an enabled option needs is an error naming it (entropy_quantile needs entropy)",
     {}, {"entropy_quantile": "0.5"}),
    (_L, "entropy-unread", "entropy",
     "an optional input that no enabled option reads is an error (entropy_quantile = null)",
     {"entropy": [["1.0", "2.0"]]}, {}),
    (_L, "entropy-negative", "entropy", "an entropy is >= 0 at every unmasked position",
     {"entropy": [["-1.0", "2.0"]]}, {"entropy_quantile": "0.5"}),
    (_L, "is-mask-no-bound", "is_c_min",
     "with is_mode = mask at least one bound must be set (a band with no bound keeps every token: use truncate)",
     {"ref_logprobs": DROP, "sampler_logprobs": [["-1.0", "-2.0"]]},
     {"beta": 0, "is_level": "token", "is_mode": "mask", "is_c_min": None, "is_c_max": None}),
    (_L, "is-c-min-above-is-c-max", "is_c_min", "must be <= is_c_max",
     {"ref_logprobs": DROP, "sampler_logprobs": [["-1.0", "-2.0"]]},
     {"beta": 0, "is_level": "token", "is_c_min": 2.0, "is_c_max": 1.0}),
    ("loss.cispo", "eps-low-with-absolute-cap", "eps_low",
     "applies only to cap_form = relative; it must be null", {}, {"cap_form": "absolute", "eps_high": 4.0,
                                                                  "eps_low": 0.2}),
    ("loss.vespo", "is-level-not-none", "is_level",
     "must be none (VESPO folds the train/inference ratio into phi_i; spec/loss.md: is_level must be none)",
     {"sampler_logprobs": [["-1.0", "-2.0"]]}, {"is_level": "token"}),
)


def _apply(base: dict, change: dict) -> dict:
    out = dict(base)
    for k, v in change.items():
        if v is DROP:
            out.pop(k, None)
        elif isinstance(v, Copy):
            out[k] = base[v.name]
        else:
            out[k] = v
    return out


def specific_cases(cases: list) -> list[Case]:
    """The SPECIFIC changes applied to each formula's base case.  A change that copies an input the base
    does not have (``Copy``) is left out: the corpus's bases have them all (the generator's check that every
    error site is reached says so), a drawn example (`pgspec fuzz`) may not."""
    bases = _base(cases)
    out = []
    for fid, slug, argument, rule, inputs, params in SPECIFIC:
        base = bases.get(fid)
        if base is None or any(isinstance(v, Copy) and v.name not in base.inputs for v in inputs.values()):
            continue
        out.append(Case(f"{fid}/error-{slug}", fid, "error",
                        f"expected error (from {base.id}); the spec requires rejecting it: {argument}: {rule}",
                        _apply(base.inputs, inputs), _apply(dict(base.params), params),
                        expect_error={"argument": argument, "rule": rule}))
    return out
