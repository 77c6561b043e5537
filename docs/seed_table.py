"""Generate docs/seeds.md, the seed table: every formula, mode, parameter and default that the five
source pull requests introduce, the pgspec ID and parameter values that express it, and one worked
number read from the golden corpus (conformance/golden/*.json).

    python docs/seed_table.py           # print the page
    python docs/seed_table.py --write   # write docs/seeds.md
    python docs/seed_table.py --check   # exit 1 if docs/seeds.md is not what this script makes

No number on the page is typed: each is the stored corpus string of the named case and output
(an expected-error case shows ``expect_error.argument``, the argument its error must name).
A row is "exact" when its golden case exists and every pgspec ID it names is a spec anchor; a row
with ``why`` is "explained": a configuration rule, an input choice or a distributed sum that is not
a formula of its own, with the reason on the page and no case; a row whose case is not in the
corpus yet is "pending (branch seeds)" and only rows marked ``seeds=True`` may be pending. ``ALLOW_PENDING`` is the switch for the merge of branch ``seeds``: set it to
False, run ``--write``, and ``tests/test_seed_table.py`` then requires every row to be exact.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "conformance" / "golden"
SPEC = ROOT / "spec"
PAGE = ROOT / "docs" / "seeds.md"

ALLOW_PENDING = False
PENDING = "pending (branch seeds)"
EXPLAINED = "explained"

# Pull requests: title line and links (pinned).
PRS = {
    "nemo-rl-2269": (
        "NeMo-RL #2269: `is_correction_level`",
        "[PR #2269](https://github.com/NVIDIA-NeMo/RL/pull/2269) (open; head "
        "[c7b1b01d](https://github.com/NVIDIA-NeMo/RL/blob/c7b1b01d215ed1b662f011bf6b88e13d1ef3ef22/"
        "nemo_rl/algorithms/loss/loss_functions.py#L215-L250)). The IS-correction level is chosen "
        "independently of the GSPO ratio.",
    ),
    "trl-4891": (
        "TRL #4891: geometric sequence masking, OPSM as negated geometric masking",
        "[PR #4891](https://github.com/huggingface/trl/pull/4891) (open; head "
        "[a6667259](https://github.com/huggingface/trl/blob/a66672590bcb322c7d5c40d1b6687e17baf17272/"
        "trl/trainer/grpo_trainer.py#L1980-L2017)). Names as proposed and as released in TRL 1.16.0: "
        "{ref}`mask.geometric_sequence`.",
    ),
    "fast-llm-502": (
        "Fast-LLM #502: GSPO over packed documents, `docs_per_step`, `normalize_by_documents`, temperature",
        "[PR #502](https://github.com/ServiceNow/Fast-LLM/pull/502) (not merged as such; head "
        "[227f8bc1](https://github.com/ServiceNow/Fast-LLM/tree/227f8bc15a57a8b4365cae3cc43bff4c3fa80024); "
        "`docs_per_step` and `normalize_by_documents` in "
        "[7d8ec0ca](https://github.com/ServiceNow/Fast-LLM/blob/7d8ec0ca1322115b93bb691bb6779c4734e136cc/"
        "fast_llm/layers/language_model/loss/config.py#L228), `temperature` in "
        "[014ba599](https://github.com/ServiceNow/Fast-LLM/blob/014ba59993d080b50a01ddb2c15a82e3012aa886/"
        "fast_llm/layers/language_model/loss/grpo.py#L177-L178)).",
    ),
    "liger-4": (
        "Liger-Kernel fork PR #4: log-ratio and k3 clamps",
        "The fork [MotifTechnologies/Liger-Kernel](https://github.com/MotifTechnologies/Liger-Kernel/blob/"
        "0c8a42ff9a1272aea53b11c1fb9331aa97e57dc5/src/liger_kernel/chunked_loss/grpo_loss.py#L102-L104) "
        "(not in any liger-kernel release; 0.8.5 has no clamp). Defaults 20 / 20 / 10, each turned off by "
        "`None`; they guard against `inf * 0 = NaN` at masked positions.",
    ),
    "slime-2060-2090": (
        "slime #2060 and #2090: constant divisor and `--loss-aggregation`",
        "[PR #2060](https://github.com/THUDM/slime/pull/2060) (head "
        "[0baefb54](https://github.com/THUDM/slime/blob/0baefb547dcf257553b860831454ff2b724db785/"
        "slime/backends/megatron_utils/loss.py#L950-L967)) and "
        "[PR #2090](https://github.com/THUDM/slime/pull/2090) (head "
        "[1951fa00](https://github.com/THUDM/slime/blob/1951fa005294906d833590d2fa2677a246ffc535/"
        "slime/backends/megatron_utils/loss.py#L887-L917)), both open. One reducer code path "
        "(`get_sum_of_sample_mean`), then `loss_function` divides the step by `step_global_batch_size`.",
    ),
}


def row(pr, item, spec, case, out, seeds=False, why=None):
    """One seed item. ``spec``: the pgspec expression, with IDs written as @id@ (rendered as a link
    when the spec has that anchor). ``case``/``out``: the golden case and the output (``name``,
    ``name[i]``, ``grad.input[i][j]`` or ``expect_error.argument``) whose stored number the page
    shows. ``why`` (with ``case`` and ``out`` None): why the item is not a formula of its own."""
    return {"pr": pr, "item": item, "spec": spec, "case": case, "out": out, "seeds": seeds, "why": why}


def explained(pr, item, spec, why):
    """A seed item that is a configuration rule (or an input choice, or a sum) rather than a formula."""
    return row(pr, item, spec, None, None, why=why)


ROWS = [
    # ---- NeMo-RL #2269 --------------------------------------------------------------------
    row("nemo-rl-2269", '`is_correction_level="sequence"`: $\\exp(\\sum_t (\\ell^{prev} - \\ell^{gen}))$, one weight per sequence',
        "@loss.gspo@ `is_level=\"sequence\"`, `is_c_min=null`, `is_c_max=null` (@is.sequence.truncate@)",
        "loss.gspo/nemo-rl-2269-sequence", "loss", seeds=True),
    row("nemo-rl-2269", '`is_correction_level="sequence_mean"`: $\\exp(\\mathrm{mean}_t(\\ell^{prev} - \\ell^{gen}))$',
        "@loss.gspo@ `is_level=\"geometric\"`, `is_c_min=null`, `is_c_max=null` (@is.geometric.truncate@)",
        "loss.gspo/nemo-rl-2269-sequence_mean", "loss", seeds=True),
    row("nemo-rl-2269", '`is_correction_level="token"`: $\\exp(\\ell^{prev}_t - \\ell^{gen}_t)$ per token',
        "@loss.gspo@ `is_level=\"token\"`, `is_c_min=null`, `is_c_max=null` (@is.token.truncate@)",
        "loss.gspo/nemo-rl-2269-token", "loss", seeds=True),
    explained("nemo-rl-2269", "default `is_correction_level=None`: `sequence` if `sequence_level_importance_ratios` else `token`",
              "@is-correction-level@: `sequence_level_importance_ratios=True` is row 1 (@loss.gspo@ `is_level=\"sequence\"`); "
              "`False` is the token PPO recipe (@loss.grpo@ or @loss.dapo@) with `is_level=\"token\"`",
              "a configuration rule: the default picks the level of row 1 or of row 3 from another flag; it adds no "
              "weight and no number of its own, so it has no case of its own"),
    row("nemo-rl-2269", "the geometric-mean weight $\\exp(\\mathrm{mean})$ stays closer to 1 than the product $\\exp(\\sum)$",
        "@is-length@: $\\lvert\\log w^{geo}_i\\rvert = \\lvert u^{seq}_i\\rvert / L_i \\le \\lvert\\log w^{seq}_i\\rvert$ (@is.geometric.truncate@ beside "
        "@is.sequence.truncate@; property in `tests/test_is.py`)",
        "is.geometric.truncate/product-collapse", "seq_weight[0]"),
    row("nemo-rl-2269", "untruncated IS weight (no `truncated_importance_sampling_ratio`)",
        "@is.sequence.truncate@ `c_min=null`, `c_max=null`",
        "is.sequence.truncate/untruncated", "seq_weight[0]", seeds=True),
    row("nemo-rl-2269", "GSPO policy ratio $\\exp(\\mathrm{mean}_t(\\ell - \\ell^{prev}))$ (`sequence_level_importance_ratios=True`)",
        "@ratio.sequence_geometric@ (in @loss.gspo@)",
        "ratio.sequence_geometric/two-tokens", "ratio[0]"),
    row("nemo-rl-2269", "IS level independent of the ratio level",
        "@loss.gspo@ with any `is_level` (here `token`, `truncate`)",
        "loss.gspo/is-token-truncate", "loss"),
    row("nemo-rl-2269", "truncation `truncated_importance_sampling_ratio` $C$ still applies at the chosen level",
        "@loss.gspo@ `is_mode=\"truncate\"`, `is_c_max` $= C$",
        "loss.gspo/is-sequence-truncate", "loss"),
    # ---- TRL #4891 --------------------------------------------------------------------------
    row("trl-4891", '`vllm_importance_sampling_mode="sequence_geometric_mean_mask"`: drop sequences whose geometric-mean ratio leaves $[C_{min}, C_{max}]$',
        "@is.geometric.mask@ `c_min`, `c_max`", "is.geometric.mask/spec-example", "seq_weight[0]"),
    row("trl-4891", "the keep decision of the geometric mode ($\\ell^{old}$ over the engine's)",
        "@mask.geometric_sequence@ `numerator=\"old_logprobs\"`, `lower`, `upper`",
        "mask.geometric_sequence/spec-inputs", "seq_ratio[0]"),
    row("trl-4891", "`vllm_importance_sampling_max` (default 3.0; released as `vllm_importance_sampling_clip_max`)",
        "`c_max` of @is.token.truncate@, @is.token.mask@, @is.sequence.truncate@, @is.sequence.mask@, @is.geometric.mask@",
        "is.token.truncate/two-sided", "weight[0][0]"),
    row("trl-4891", "`vllm_importance_sampling_min` (default 0.0; released as `vllm_importance_sampling_clip_min`, default None)",
        "@is.token.truncate@ `c_min` (and the other `is.*` formulas; null = open)", "is.token.truncate/lower-bound-only", "weight[1][0]"),
    row("trl-4891", "`vllm_importance_sampling_cap` deprecated, copied to the upper bound",
        "@is.token.truncate@ `c_max`, one-sided (`c_min=null`)", "is.token.truncate/spec-example", "weight[0][0]"),
    row("trl-4891", '`"token_truncate"` with two-sided bounds $[C_{min}, C_{max}]$',
        "@is.token.truncate@ `c_min`, `c_max`", "is.token.truncate/two-sided", "weight[0][1]"),
    row("trl-4891", '`"token_mask"`: zero outside $[C_{min}, C_{max}]$',
        "@is.token.mask@ `c_min`, `c_max`", "is.token.mask/spec-example", "weight[0][2]"),
    row("trl-4891", '`"sequence_truncate"` with two-sided bounds',
        "@is.sequence.truncate@ `c_min`, `c_max`", "is.sequence.truncate/two-sided", "seq_weight[0]"),
    row("trl-4891", '`"sequence_mask"` with two-sided bounds',
        "@is.sequence.mask@ `c_min`, `c_max`", "is.sequence.mask/padded-batch", "seq_weight[0]"),
    row("trl-4891", "OPSM `off_policy_mask_threshold` $\\delta$ (default None = off): keep iff $A_i \\ge 0$ or the mean log-ratio is within $\\delta$",
        "@mask.opsm@ `delta`", "mask.opsm/sequence-advantages", "seq_keep[0]"),
    row("trl-4891", "OPSM as negated geometric masking",
        "@mask.geometric_sequence@ `numerator=\"logprobs\"`, `lower` $= e^{-\\delta}$, `upper=null`, or'ed with $A_i \\ge 0$",
        "mask.geometric_sequence/current-over-sampler", "seq_ratio[0]"),
    row("trl-4891", "OPSM statistic as staleness + sampling mismatch ($\\ell - \\ell^{old}$ plus $\\ell^{old} - \\ell^{\\mu}$)",
        "@mask.opsm@ `seq_stat` $= \\mathrm{mean}_t(\\ell^{\\mu} - \\ell)$ (the same number)",
        "mask.opsm/default-delta", "seq_stat[0]"),
    row("trl-4891", "OPSM gated by each token's own advantage (DeepSeek-V3.2 Eq. 9 read per token; the default gates on the sequence mean)",
        "@mask.opsm@ `advantage_gate=\"token\"` (default `\"sequence_mean\"`)", "mask.opsm/token-gate-token-advantages",
        "keep[0][0]", seeds=True),
    explained("trl-4891", "OPSM falls back to the trainer's `old_per_token_logps` when the engine gives no log-probs",
              "@mask.opsm@ with `old_logprobs` passed as `sampler_logprobs`",
              "an input choice, no parameter: which log-probs stand for the sampler is the caller's decision; the "
              "formula is row 10's, and with the trainer's log-probs its statistic measures staleness alone"),
    # ---- Fast-LLM #502 ----------------------------------------------------------------------
    row("fast-llm-502", '`policy_loss="gspo"` over packed documents: per-document geometric-mean ratio, clipped per document',
        "@surrogate.gspo_document@ `eps_low`, `eps_high`", "surrogate.gspo_document/three-documents", "loss[0]", seeds=True),
    row("fast-llm-502", "all-reduce of the log-ratio sum over SDP ranks before clipping",
        "@dist.sdp_segment@ `sdp_size`", "dist.sdp_segment/split-document-s3", "log_ratio[0]"),
    explained("fast-llm-502", "the same all-reduce of the advantage sum and the token count",
              "@surrogate.gspo_document@ outputs `advantage` $A_s$ and `token_count` $N_s$ of the whole document",
              "a distributed sum: a SUM all-reduce of per-rank partial sums returns the whole document's sums, "
              "which `surrogate.gspo_document` already defines (its `advantage` and `token_count` outputs; case "
              "`surrogate.gspo_document/sequence-advantages`, a document over two rows); only the log-ratio's "
              "partials, pre-divided by $N_s$, have a formula of their own (`dist.sdp_segment`)"),
    row("fast-llm-502", "document advantage $A_s$ = mean of the per-token advantages",
        "@surrogate.gspo_document@ output `advantage`", "surrogate.gspo_document/sequence-advantages", "advantage[0]", seeds=True),
    row("fast-llm-502", "uniform per-token gradient $-A_s R_s$ within a document",
        "@surrogate.gspo_document@ gradient of `weighted_loss`", "surrogate.gspo_document/three-documents",
        "grad.logprobs[0][0]", seeds=True),
    row("fast-llm-502", "`document_index`: per-token document membership",
        "input `document_ids` (@dist.sdp_segment@, @agg.document_mean@)", "dist.sdp_segment/worked", "log_ratio[0]"),
    row("fast-llm-502", "default divisor `num_labels_in_batch` (the step's labelled tokens)",
        "@agg.token_mean@ `num_tokens`", "agg.token_mean/global-count", "value"),
    row("fast-llm-502", "`normalize_by_documents` (default false): divide by `num_documents_in_batch` $D$ (GRPO and GSPO)",
        "@agg.constant@ `divide_by=\"K\"`, `divisor` $= D$", "agg.constant/fast-llm-normalize-by-documents", "value", seeds=True),
    row("fast-llm-502", "`num_documents_in_batch` $D$ counted from the packed documents, not passed in",
        "@dist.docs_per_step@ with the step in one micro-batch (`micro_batch_sizes` $= [B]$): $D$ from "
        "`document_ids`, `total` = @agg.constant@ `divisor` $D$", "dist.docs_per_step/normalize-by-documents-one-micro-batch",
        "num_documents"),
    row("fast-llm-502", "`normalize_by_documents`: the applied gradient divided by $D^2$",
        "@agg.constant@ `divide_by=\"K\"`, `divisor` $= D^2$", "agg.constant/fast-llm-normalize-by-documents-gradient",
        "value", seeds=True),
    row("fast-llm-502", "`docs_per_step`: accumulate micro-batches to a document target; the step's $D$ divides every micro-batch",
        "@dist.docs_per_step@ `docs_per_step`, `micro_batch_sizes`", "dist.docs_per_step/one-rollout-micro-batches",
        "total", seeds=True),
    explained("fast-llm-502", "`docs_per_step = 0` (the default): off, a fixed micro-batch count per step",
              "@dist.docs_per_step@ applied to each micro-batch alone (@dist.accumulate@'s `naive` normalization)",
              "a schedule switch: with 0 Fast-LLM fetches `depth_first_micro_batches` and resets no "
              "`num_documents_in_batch`, so each micro-batch keeps its own count "
              "([`trainer.py` L260-L275](https://github.com/ServiceNow/Fast-LLM/blob/227f8bc15a57a8b4365cae3cc43bff4c3fa80024/"
              "fast_llm/engine/training/trainer.py#L260-L275))"),
    row("fast-llm-502", "GSPO over documents on-policy ($R_s = 1$): the document mean of the PG loss",
        "@surrogate.gspo_document@ with `old_logprobs` = `logprobs`: $\\mathcal L_s = -A_s$ (identity with "
        "@surrogate.pg@ in `tests/test_surrogate.py`)", "surrogate.gspo_document/on-policy", "weighted_loss[1]"),
    row("fast-llm-502", "`temperature` (default 1.0): logits scaled by `logits_scale_factor / temperature`",
        "@logprob.token@ `temperature` $\\tau$, `logit_scale` $s$", "logprob.token/temperature-0.7", "logprobs[0][0]"),
    row("fast-llm-502", "the same scale for the metrics (entropy)",
        "@logprob.entropy@ `temperature`, `logit_scale`", "logprob.entropy/temperature-0.7", "entropy[0][0]"),
    # ---- Liger-Kernel fork PR #4 ------------------------------------------------------------
    row("liger-4", "`log_ratio_clamp_value=20`: $\\ell - \\ell^{old}$ clamped to $\\pm 20$ before `exp` (token ratio)",
        "@ratio.token@ `log_ratio_clamp=20`", "ratio.token/log-ratio-200-clamped", "ratio[0][0]"),
    row("liger-4", "the same clamp in every loss type's token ratio",
        "`loss.*` `log_ratio_clamp=20` (@loss.dapo@)", "loss.dapo/log-ratio-200-clamped", "loss"),
    row("liger-4", "the same clamp on each token **before** the sequence mean (GSPO)",
        "@ratio.sequence_geometric@ `log_ratio_clamp=20`", "ratio.sequence_geometric/per-token-clamp-30-0",
        "ratio[0]", seeds=True),
    row("liger-4", "GSPO loss with the per-token clamp",
        "@loss.gspo@ `log_ratio_clamp=20`", "loss.gspo/per-token-clamp-30-0", "loss", seeds=True),
    row("liger-4", "`kl_input_clamp_value=20`: $\\ell^{ref} - \\ell$ clamped before `exp` inside k3",
        "@kl.k3@ `log_ratio_min=-20`, `log_ratio_max=20`", "kl.k3/bounds-inclusive", "kl[0][0]"),
    row("liger-4", "`kl_output_clamp_value=10`: the k3 value clamped to $\\pm 10$",
        "@kl.k3@ `output_min=-10`, `output_max=10`", "kl.k3/log-ratio-200-clamped", "kl[0][0]"),
    row("liger-4", "defaults on (20 / 20 / 10) in a loss",
        "`loss.*` `log_ratio_clamp=20`, `kl_log_ratio_min/max` $=\\mp 20$, `kl_output_min/max` $=\\mp 10$ (@loss.dapo@)",
        "loss.dapo/kl-k3-verl-clamps-200", "loss"),
    row("liger-4", "masked positions excluded, so `inf * 0` never reaches a result",
        "conventions: masked positions excluded, not multiplied (@kl.k3@)", "kl.k3/masked-nan-inf", "kl[0][0]"),
    row("liger-4", "the loss bounded by `kl_output_clamp_value` $\\times \\beta$",
        "@loss-kl-output-bound@: $\\beta c \\le \\mathcal L(\\beta) - \\mathcal L(0) \\le \\beta d$ for mean "
        "aggregators (@loss.dapo@; property in `tests/test_loss.py`)", "loss.dapo/kl-k3-verl-clamps-200", "loss"),
    # ---- slime #2060 / #2090 ----------------------------------------------------------------
    row("slime-2060-2090", "#2060 `--pg-loss-divisor K` = #2090 `--loss-aggregation constant --loss-aggregation-divisor K`: the reducer returns $\\sum m\\,x / K$",
        "@agg.constant@ `divide_by=\"K\"`", "agg.constant/divide-by-K", "value"),
    row("slime-2060-2090", "the step objective after `/ step_global_batch_size` $N$: $\\sum m\\,x/(K N)$",
        "@agg.constant@ `divide_by=\"K*N\"`, `num_sequences` $= N$", "agg.constant/global-count", "value"),
    row("slime-2060-2090", "`sample_mean` (default): per-rollout token mean over `rollout_mask_sums`, $/N$",
        "@agg.sample_mean@ `sequence_token_counts`, `num_sequences`", "agg.sample_mean/global-counts", "value"),
    row("slime-2060-2090", "`prompt_mean`: per-prompt token mean over `prompt_mask_sums`, step sum $/N$ (sequences)",
        "@agg.prompt_mean@ `step_divisor=\"sequences\"`, `group_token_counts`", "agg.prompt_mean/slime-2090-divide-by-sequences",
        "value", seeds=True),
    row("slime-2060-2090", "`prompt_mean` with the strict $1/P$ average over prompts",
        "@agg.prompt_mean@ `num_groups`, `group_token_counts`", "agg.prompt_mean/global-counts", "value"),
    row("slime-2060-2090", "`token_mean` (alias of `--calculate-per-token-loss`): $\\sum / \\sum_i \\max(L_i, 1)$",
        "@agg.token_mean@ `num_tokens`", "agg.token_mean/global-count", "value"),
    row("slime-2060-2090", "the policy aggregation only: KL keeps the sample mean",
        "`loss.*` `kl_aggregation=\"sample_mean\"` (@loss.dr_grpo@)", "loss.dr_grpo/slime-constant-kl-sample-mean",
        "loss", seeds=True),
    row("slime-2060-2090", "context parallelism, `thd` layout",
        "@dist.cp_split@ / @dist.cp_reduce@ `layout=\"thd\"`", "dist.cp_reduce/sample_mean-thd-c2", "unsharded"),
    row("slime-2060-2090", "context parallelism, `bshd` layout chunked by the micro-batch's maximum length (`max_seq_lens`)",
        "@dist.cp_split@ `layout=\"bshd\"`, `max_seq_len`", "dist.cp_split/bshd-max-seq-len-6", "chunk_size[0]", seeds=True),
    row("slime-2060-2090", "the constant is the same on every CP rank: rank partial sums add up",
        "@dist.cp_reduce@ `aggregator=\"agg.constant\"`", "dist.cp_reduce/constant-thd-c2", "unsharded"),
    row("slime-2060-2090", "a divisor that is not $> 0$, NaN included, is refused",
        "@agg.constant@ `divisor` finite and $> 0$", "agg.constant/error-divisor-nan", "expect_error.argument"),
    row("slime-2060-2090", "`prompt_mean` with a null group index (`Sample.group_index = None`) fails",
        "@agg.prompt_mean@ input `group_ids`: an integer for every sequence", "agg.prompt_mean/error-group-ids-null",
        "expect_error.argument"),
    explained("slime-2060-2090", "the constant divisor is not applied under `--calculate-per-token-loss`",
              "@agg.token_mean@ (row 6) or @agg.constant@ (row 1), never both",
              "a configuration rule: #2060 skips the divisor under the flag "
              "([`cp_utils.py` L76-L81](https://github.com/THUDM/slime/blob/0baefb547dcf257553b860831454ff2b724db785/slime/backends/megatron_utils/cp_utils.py#L76-L81)) "
              "and #2090 refuses the combination "
              "([`cp_utils.py` L73-L75](https://github.com/THUDM/slime/blob/1951fa005294906d833590d2fa2677a246ffc535/slime/backends/megatron_utils/cp_utils.py#L73-L75)), "
              "so a step uses one of the two formulas and no number combines them"),
    explained("slime-2060-2090", "a custom reducer (`--custom-pg-loss-reducer-function-path`) takes precedence over the divisor",
              "@loss-kl-aggregation@ (slime's reducer choice)",
              "a configuration rule: which reducer runs is decided before any formula "
              "([#2060 `loss.py` L950-L967](https://github.com/THUDM/slime/blob/0baefb547dcf257553b860831454ff2b724db785/slime/backends/megatron_utils/loss.py#L950-L967)); "
              "a custom reducer is outside the spec"),
]



def anchors() -> set[str]:
    ids = set()
    for page in SPEC.glob("*.md"):
        ids.update(re.findall(r"^\(([\w.-]+)\)=\s*$", page.read_text(encoding="utf-8"), re.M))
    return ids


def paragraph_anchors() -> set[str]:
    """Anchors set on a paragraph, not a heading: a {ref} to them needs its own link text."""
    ids = set()
    for page in SPEC.glob("*.md"):
        ids.update(re.findall(r"^\(([\w.-]+)\)=\s*\n(?!#)", page.read_text(encoding="utf-8"), re.M))
    return ids


def ref(anchor: str, paragraphs=None) -> str:
    paragraphs = paragraph_anchors() if paragraphs is None else paragraphs
    return f"{{ref}}`{anchor} <{anchor}>`" if anchor in paragraphs else f"{{ref}}`{anchor}`"


def corpus() -> dict:
    cases = {}
    for path in sorted(GOLDEN.glob("*.json")):
        if path.name == "schema.json":
            continue
        for case in json.loads(path.read_text(encoding="utf-8"))["cases"]:
            cases[case["id"]] = case
    return cases


def stored(case: dict, out: str):
    """The stored value of ``out`` (``name``, ``name[i][j]``, ``grad.input[i]``) in ``case``."""
    m = re.fullmatch(r"(grad\.|expect_error\.)?([A-Za-z_]\w*)((?:\[\d+\])*)", out)
    if not m:
        raise ValueError(f"bad output selector {out!r}")
    part = {"grad.": "grad", "expect_error.": "expect_error"}.get(m.group(1), "outputs")
    value = case[part][m.group(2)]
    for index in re.findall(r"\[(\d+)\]", m.group(3)):
        value = value[int(index)]
    return value


def shown(value) -> str:
    """How a stored value appears on the page: the stored string itself, cut after 20 characters."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    return text if len(text) <= 20 else text[:20] + "…"


def resolve(rows=ROWS, cases=None, ids=None) -> list[dict]:
    cases = corpus() if cases is None else cases
    ids = anchors() if ids is None else ids
    paragraphs = paragraph_anchors()
    out = []
    for r in rows:
        named = re.findall(r"@([\w.-]+)@", r["spec"])
        missing = [i for i in named if i not in ids]
        if r.get("why"):
            if missing or r["case"] is not None or not named:
                raise SystemExit(f"explained seed row {r['item']!r}: anchors {missing} missing, or a case named, "
                                 f"or no pgspec ID")
            spec = re.sub(r"@([\w.-]+)@", lambda m: ref(m.group(1), paragraphs), r["spec"])
            out.append(dict(r, spec_text=f"{spec}. **Why no formula of its own:** {r['why']}", number=None, status=EXPLAINED,
                            formula=None))
            continue
        case = cases.get(r["case"])
        exact = case is not None and not missing
        if not exact and not r["seeds"]:
            raise SystemExit(f"seed row {r['item']!r}: case {r['case']} or anchors {missing} missing")
        number = stored(case, r["out"]) if case is not None else None
        spec = re.sub(r"@([\w.-]+)@", lambda m: ref(m.group(1), paragraphs) if m.group(1) in ids else f"`{m.group(1)}`",
                      r["spec"])
        out.append(dict(r, spec_text=spec, number=number, status="exact" if exact else PENDING,
                        formula=case["formula"] if case else None))
    return out


def render() -> str:
    resolved = resolve()
    lines = [
        "(seeds)=",
        "# Seed table: the five source pull requests",
        "",
        "pgspec was started from five public pull requests. For each, one row per formula, mode,",
        "parameter and default it introduces: the pgspec ID and parameter values that express it, a",
        "golden case, and one number stored in that case (`conformance/golden/*.json`; the first 20",
        "characters of the stored string). This page is generated by `docs/seed_table.py` from the",
        "corpus; `tests/test_seed_table.py` regenerates it and requires it to be unchanged, so no",
        "number here is typed. A row marked *explained* is a configuration rule, an input choice or a",
        "distributed sum rather than a formula of its own: it names the formulas it selects and says why it",
        "has no case of its own.",
        "",
    ]
    counts = {}
    for r in resolved:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines.append("Rows: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + ".")
    lines.append("")
    for key, (title, intro) in PRS.items():
        rows = [r for r in resolved if r["pr"] == key]
        lines += [f"## {title}", "", intro, "", "| # | introduced by the pull request | pgspec | golden case | number | status |",
                  "|---|---|---|---|---|---|"]
        for k, r in enumerate(rows, 1):
            number = "—" if r["number"] is None and r["status"] != "exact" else f"`{r['out']}` = `{shown(r['number'])}`"
            case = "—" if r["case"] is None else f"`{r['case']}`"
            lines.append(f"| {k} | {r['item']} | {r['spec_text']} | {case} | {number} | {r['status']} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv) -> int:
    text = render()
    if "--write" in argv:
        PAGE.write_text(text, encoding="utf-8")
    elif "--check" in argv:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print("docs/seeds.md is stale: run python docs/seed_table.py --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
