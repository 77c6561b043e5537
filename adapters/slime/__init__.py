"""pgspec adapter for slime, loaded from the user's checkout (see adapters/slime/README.md).

Every value comes out of slime's own functions; the adapter moves tensors between pgspec's padded
[B, T] layout and slime's packed per-sample lists (sample i = row i, response length T, loss mask
= the row's mask):

- ``slime/utils/ppo_utils.py``: ``compute_policy_loss`` (``surrogate.ppo_clip``,
  ``surrogate.dual_clip``), ``compute_cispo_loss`` (``surrogate.cispo``), ``compute_approx_kl``
  (``kl.k1``, ``kl.k2``, ``kl.k3``: ``k3`` without clamp, ``low_var_kl`` with the [-10, 10] output
  clamp), ``compute_opsm_mask`` (``mask.opsm``).
- ``slime/backends/megatron_utils/cp_utils.py``: ``get_sum_of_sample_mean`` (``agg.sample_mean``,
  ``dist.cp_reduce`` at CP = 2 with the rank set on the ``megatron.core.mpu`` stand-in).
- ``slime/backends/megatron_utils/loss.py``: ``loss_function`` -> ``policy_loss_function`` for the
  recipes (``loss.grpo``, ``loss.gspo``, ``loss.bnpo``, ``loss.dapo``, ``loss.cispo``), with
  ``vanilla_tis_function`` / ``icepop_function`` for the IS correction and ``compute_opsm_mask``.
  ``get_log_probs_and_entropy`` (logits -> log-probs) is replaced by one returning the case's
  log-probs: the loss starts from per-token log-probs, as every pgspec case does.

The reducers' scaling is slime's own: ``loss_function`` multiplies the summed sample means by
``num_microbatches / step_global_batch_size`` (one micro-batch of B samples here); with
``calculate_per_token_loss`` it returns the token sum and the normalizer ``num_tokens`` that
Megatron's schedule divides by, and the adapter does that one division.

torch.compile: see loader.py.  The default mode runs slime's compiled functions eagerly.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

from pgspec.adapters.base import Unsupported as _PropertyUnsupported

from .._gitsource import Revision, SourceAdapter, source_env
from ..base import load_deviations, spec_param
from . import loader

FRAMEWORK = "slime"

MAIN = Revision(
    name="main 624b824a",
    commit="624b824a898ab0ec1fcb4d373004c7f3852bf515",
    blobs={
        "slime/utils/ppo_utils.py": "4746af4f3a62c1559748638bc767960087ad51aa",
        "slime/backends/megatron_utils/cp_utils.py": "a54da3a7ef688e5b52266ab6f54bafd9127045c1",
        "slime/backends/megatron_utils/loss.py": "e7ac97c19e0e5a024b320895566e985c820b8144",
        "slime/utils/distributed_utils.py": "af97bc14daa84f10bcbeeb3624e18708cb02a1fe",
        "slime/utils/misc.py": "2b3032295483552750dedd1aaf72d0c111223125",
        "slime/utils/types.py": "df4b10062ca643f3796e9296c4bb24c9d444b149",
    },
    clone="git clone https://github.com/THUDM/slime && git -C slime checkout 624b824a898ab0ec1fcb4d373004c7f3852bf515",
)
PR2060 = Revision(
    name="PR #2060 head 0baefb54",
    commit="0baefb547dcf257553b860831454ff2b724db785",
    blobs={
        "slime/utils/ppo_utils.py": "2a858e7a3f41826271a1eea50b729030aaaa77c6",
        "slime/backends/megatron_utils/cp_utils.py": "7f5800ccd8fad79d82771067bbd5d6562cfec0aa",
        "slime/backends/megatron_utils/loss.py": "9ebfafdb6d122e19b0645d584adb791f5b2386bc",
        "slime/utils/distributed_utils.py": "7f7e57271a4007722618e2d3897c90d4a71592c8",
        "slime/utils/misc.py": "e74a4d516c3bca70409c29c1cfc99a87cddd2a64",
        "slime/utils/types.py": "54092680e2b433e810b158dc4f19bfb3bc298622",
    },
    clone=("git clone https://github.com/THUDM/slime slime-pr2060 && git -C slime-pr2060 fetch origin pull/2060/head "
           "&& git -C slime-pr2060 checkout 0baefb547dcf257553b860831454ff2b724db785"),
)
PR2090 = Revision(
    name="PR #2090 head 1951fa00",
    commit="1951fa005294906d833590d2fa2677a246ffc535",
    blobs={
        "slime/utils/ppo_utils.py": "bf41f1aa4b8450980f05ea1651ad6622fa9ed585",
        "slime/backends/megatron_utils/cp_utils.py": "aa58a1a75684b1b329ab872ed59a9054b2c988b1",
        "slime/backends/megatron_utils/loss.py": "5235fd835d151589f3ae0fe57a517b485636fa94",
        "slime/utils/distributed_utils.py": "7f7e57271a4007722618e2d3897c90d4a71592c8",
        "slime/utils/misc.py": "e8279fd6e7e52026b6ad1c230194c26e18f54374",
        "slime/utils/types.py": "efa7e6fd0aaaf6966aeffa0c24f8c39449159cb8",
    },
    clone=("git clone https://github.com/THUDM/slime slime-pr2090 && git -C slime-pr2090 fetch origin pull/2090/head "
           "&& git -C slime-pr2090 checkout 1951fa005294906d833590d2fa2677a246ffc535"),
)
REVISIONS = [MAIN, PR2060, PR2090]


class SlimeUnsupported(_PropertyUnsupported, NotImplementedError):
    """A parameter value or input form slime's configuration cannot express (declared as a
    capability in deviations.toml; a property check that needs one reports it as unsupported)."""


def _unsupported(fid, why):
    raise SlimeUnsupported(f"slime: {fid}: {why}")


def _modules():
    src = ADAPTER.source()
    if src is None:
        raise RuntimeError(f"no slime checkout ({source_env('slime')} is not set)")
    return loader.load(src)


_param = spec_param   # a spec parameter's value, defaulted, as the framework's config holds it


def _feature(name):
    """Does the checkout's loss.py know this option (PR #2060: pg_loss_divisor; PR #2090:
    loss_aggregation)?"""
    _, _, lossmod = _modules()
    return name in Path(lossmod.__file__).read_text()


def _prompt_mask_sums(mask, group_ids):
    """batch["prompt_mask_sums"] as PR #2090's rollout builds it: each sample's prompt group's total
    mask count (slime/ray/rollout.py, group_total_mask)."""
    totals = {}
    for g, n in zip(group_ids.tolist(), mask.sum(-1).tolist()):
        totals[g] = totals.get(g, 0) + n
    return [totals[g] for g in group_ids.tolist()]


def _group_size(fid, group_ids):
    sizes = {}
    for g in group_ids.tolist():
        sizes[g] = sizes.get(g, 0) + 1
    if len(set(sizes.values())) > 1:
        _unsupported(fid, "groups of unequal size: --n-samples-per-prompt is one number")
    return next(iter(sizes.values())) if sizes else 1


def _require_null(params, fid, *names):
    for n in names:
        if _param(params, fid, n) is not None:
            _unsupported(fid, f"{n}={params.get(n)!r} has no slime counterpart; only null is expressible")


def _compute(x):
    import torch

    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _token_adv(adv, like):
    return adv.unsqueeze(-1).expand_as(like) if adv.dim() == 1 else adv


def _fill(x, mask):
    import torch

    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _rows(x):
    return [x[i] for i in range(x.shape[0])]


# ------------------------------------------------------------------------------------ surrogates

def _ppo(fid):
    def run(inputs, params):
        ppo, _, _ = _modules()
        _require_null(params, fid, "log_ratio_clamp")
        m = inputs["mask"]
        # compute_policy_loss takes no mask (slime masks in the reducer): padding holds 0
        lp, old = _fill(_compute(inputs["logprobs"]), m), _fill(_compute(inputs["old_logprobs"]), m)
        adv = _fill(_token_adv(_compute(inputs["advantages"]), lp), m)
        c = _param(params, fid, "c") if fid == "surrogate.dual_clip" else None
        pg, _clipfrac = ppo.compute_policy_loss(old - lp, adv, _param(params, fid, "eps_low"),
                                                _param(params, fid, "eps_high"), eps_clip_c=c)
        return {"loss": pg}

    run.__name__ = fid.replace(".", "_")
    return run


def surrogate_cispo(inputs, params):
    ppo, _, _ = _modules()
    fid = "surrogate.cispo"
    _require_null(params, fid, "log_ratio_clamp")
    if _param(params, fid, "cap_form") != "relative":
        _unsupported(fid, "cap_form 'absolute': compute_cispo_loss clamps the ratio to [1 - eps_clip, 1 + eps_clip_high]")
    m = inputs["mask"]
    # compute_cispo_loss takes no mask: padding holds 0
    lp, old = _fill(_compute(inputs["logprobs"]), m), _fill(_compute(inputs["old_logprobs"]), m)
    lo = _param(params, fid, "eps_low")
    # slime: "canonical CISPO disables the lower bound (eps_clip >= 1.0)"
    pg, _ = ppo.compute_cispo_loss(old - lp, lp, _fill(_token_adv(_compute(inputs["advantages"]), lp), m),
                                   1.0 if lo is None else lo, _param(params, fid, "eps_high"))
    return {"loss": pg}


# ------------------------------------------------------------------------------------------- kl

def _kl(fid):
    kind = fid.split(".")[1]

    def run(inputs, params):
        ppo, _, _ = _modules()
        _require_null(params, fid, "log_ratio_min", "log_ratio_max")
        lo, hi = _param(params, fid, "output_min"), _param(params, fid, "output_max")
        m = inputs["mask"]
        if (lo, hi) == (None, None):
            kl_type = kind
        elif kind == "k3" and (lo, hi) == (-10.0, 10.0):
            kl_type = "low_var_kl"
        else:
            _unsupported(fid, f"output clamp [{lo}, {hi}]: only low_var_kl (k3) clamps, to [-10, 10]")
        # compute_approx_kl takes no mask: padding holds 0
        kl = ppo.compute_approx_kl(_fill(_compute(inputs["logprobs"]), m), _fill(_compute(inputs["ref_logprobs"]), m),
                                   kl_loss_type=kl_type)
        return {"kl": kl}

    run.__name__ = fid.replace(".", "_")
    return run


# ------------------------------------------------------------------------------------------ mask

def mask_opsm(inputs, params):
    """compute_opsm_mask with the sampler's log-probs as the "old" ones (slime passes the rollout
    log-probs with --use-rollout-logprobs).  slime gates each token by its own advantage
    (``advantage < 0`` on the per-token tensor: ``advantage_gate = token``); a per-sequence advantage
    is put on every token of its row, where the two gates agree.  A sequence is kept when every one
    of its unmasked tokens is."""
    import torch

    ppo, _, _ = _modules()
    fid = "mask.opsm"
    lp, mu, m = _compute(inputs["logprobs"]), _compute(inputs["sampler_logprobs"]), inputs["mask"]
    adv = _compute(inputs["advantages"])
    B, T = lp.shape
    if T == 0:
        _unsupported(fid, "rows of length 0: slime samples have at least one response token")
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand(B, T)
    mf = m.to(lp.dtype)
    keep, _ = ppo.compute_opsm_mask(Namespace(opsm_delta=_param(params, fid, "delta")), _rows(lp), _rows(mu),
                                    _rows(adv), _rows(mf))
    keep = keep.reshape(B, T) != 0
    return {"seq_keep": (keep | ~m).all(-1), "keep": keep & m}


# ------------------------------------------------------------------------------------------ agg

def agg_sample_mean(inputs, params):
    """get_sum_of_sample_mean (Σ_i Σ_t x m / max(n_i, 1)), scaled by loss_function's
    num_microbatches / step_global_batch_size with one micro-batch of B samples (or the case's
    global num_sequences)."""
    import torch

    _, cp, _ = _modules()
    fid = "agg.sample_mean"
    if _param(params, fid, "eps_length") or _param(params, fid, "eps_count"):
        _unsupported(fid, "eps_length / eps_count: slime adds no epsilon")
    x, m = _compute(inputs["values"]), inputs["mask"]
    B, T = x.shape
    counts = params.get("sequence_token_counts")
    # global per-sample denominators: slime's sample_denoms (rollout_mask_sums)
    denoms = None if counts is None else [torch.tensor(float(c), dtype=x.dtype) for c in counts]
    red = cp.get_sum_of_sample_mean([T] * B, [T] * B, _rows(m.to(x.dtype)), sample_denoms=denoms)
    n = _param(params, fid, "num_sequences")
    total = red(x.reshape(-1)) if B else x.new_zeros(())
    if not torch.is_tensor(total):
        total = x.new_zeros(()) + total
    return {"value": total * 1 / (B if n is None else n)}


def agg_constant(inputs, params):
    """PR #2060 / #2090: get_sum_of_sample_mean(constant_divisor=K) (Σ x m / K), scaled by
    loss_function's 1 / step_global_batch_size."""
    import torch

    _, cp, _ = _modules()
    fid = "agg.constant"
    if not (_feature("pg_loss_divisor") or _feature("loss_aggregation")):
        _unsupported(fid, "no constant divisor before PR #2060 / #2090")
    if _param(params, fid, "divide_by") != "K*N":
        _unsupported(fid, "divide_by 'K': loss_function always divides by the sample count")
    x, m = _compute(inputs["values"]), inputs["mask"]
    B, T = x.shape
    red = cp.get_sum_of_sample_mean([T + 1] * B, [T] * B, _rows(m.to(x.dtype)),
                                    constant_divisor=_param(params, fid, "divisor"))
    n = _param(params, fid, "num_sequences")
    total = red(x.reshape(-1)) if B else x.new_zeros(())
    total = total if torch.is_tensor(total) else x.new_zeros(()) + total
    return {"value": total / (B if n is None else n)}


def agg_prompt_mean(inputs, params):
    """PR #2090: get_pg_loss_reducer with --loss-aggregation prompt_mean (sample i divided by its
    group's prompt_mask_sums, times n_samples_per_prompt), scaled by 1 / step_global_batch_size."""
    import torch

    _, _, lossmod = _modules()
    fid = "agg.prompt_mean"
    if not _feature("loss_aggregation"):
        _unsupported(fid, "no prompt mean before PR #2090")
    _require_null(params, fid, "num_groups", "group_token_counts")
    x, m, gid = _compute(inputs["values"]), inputs["mask"], inputs["group_ids"]
    B, T = x.shape
    args = _args(loss_aggregation="prompt_mean", n_samples_per_prompt=_group_size(fid, gid))
    batch = {"prompt_mask_sums": [torch.tensor(float(v), dtype=x.dtype) for v in _prompt_mask_sums(m, gid)]}
    red = lossmod.get_pg_loss_reducer(args, batch, total_lengths=[T + 1] * B, response_lengths=[T] * B,
                                      pg_loss_masks=_rows(m.to(x.dtype)), default_reducer=None)
    total = red(x.reshape(-1)) if B else x.new_zeros(())
    total = total if torch.is_tensor(total) else x.new_zeros(()) + total
    return {"value": total / B}


def _sample_layout(mask, sequence_lengths):
    """Per row: (total_length, prompt_length): the prompt is everything before the first unmasked
    position (slime's response starts there), the total length is sequence_lengths[i] or one past
    the last unmasked position; an empty row is an empty response at the end of its prompt."""
    out = []
    for i in range(mask.shape[0]):
        idx = mask[i].nonzero().flatten().tolist()
        n = int(sequence_lengths[i]) if sequence_lengths is not None else (idx[-1] + 1 if idx else 1)
        p = idx[0] if idx else n
        out.append((n, p))
    return out


def dist_cp_reduce(inputs, params):
    """Each CP rank's share of get_sum_of_sample_mean at cp_size C (the megatron.core.mpu stand-in
    reports rank r of C): the rank's response tokens come from slime's slice_log_prob_with_cp
    (logit ownership), the reducer's per-sample denominators are its full loss masks; every share is
    scaled by loss_function's 1 / step_global_batch_size (its × cp_size cancels Megatron's average
    over the dp × cp group)."""
    import torch

    _, cp, _ = _modules()
    fid = "dist.cp_reduce"
    x, m = _compute(inputs["values"]), inputs["mask"]
    B, T = x.shape
    C = int(_param(params, fid, "cp_size"))
    agg_params = params.get("agg_params") or {}
    if any(agg_params.get(k) for k in ("eps_length", "eps_count")):
        _unsupported(fid, "eps_length / eps_count")
    layout = _layout(params, fid)
    total_and_prompt = _sample_layout(m, params.get("sequence_lengths"))
    totals = [n for n, _ in total_and_prompt]
    resp = [n - p for n, p in total_and_prompt]
    if any(p == 0 for n, p in total_and_prompt if n > p):
        _unsupported(fid, "an unmasked position 0: slime's responses follow a prompt of at least one token")
    masks = [m[i, p:n].to(x.dtype) for i, (n, p) in enumerate(total_and_prompt)]
    values = [x[i, p:n] for i, (n, p) in enumerate(total_and_prompt)]
    counts = agg_params.get("sequence_token_counts")
    denoms = None if counts is None else [torch.tensor(float(c), dtype=x.dtype) for c in counts]
    n_seq = agg_params.get("num_sequences")
    scale = 1.0 / float(B if n_seq is None else n_seq) if B or n_seq else 0.0
    kw, skw = {}, {}
    if layout == "bshd":
        # PR #2060's qkv_format="bshd": chunks of the micro-batch's padded length T
        S = int(params.get("max_seq_len") or T)  # the micro-batch's padded length (spec: S)
        kw = dict(qkv_format="bshd", max_seq_lens=[S] * B)
        skw = dict(qkv_format="bshd", max_token_len=S)
    if _param(params, fid, "aggregator") == "agg.constant":
        if agg_params.get("divide_by", "K*N") != "K*N":
            _unsupported(fid, "agg.constant divide_by 'K'")
        kw["constant_divisor"] = float(agg_params["divisor"])
    partials = []
    try:
        for r in range(C):
            loader.CP.update(size=C, rank=r)
            red = cp.get_sum_of_sample_mean(totals, resp, masks, sample_denoms=denoms, **kw)
            chunk = [cp.slice_log_prob_with_cp(v, n, L, **skw) if C > 1 else v for v, n, L in zip(values, totals, resp)]
            part = red(torch.cat(chunk)) if chunk else x.new_zeros(())
            partials.append((part if torch.is_tensor(part) else x.new_zeros(()) + part) * scale)
        loader.CP.update(size=1, rank=0)
        red = cp.get_sum_of_sample_mean(totals, resp, masks, sample_denoms=denoms, **kw)
        whole = red(torch.cat(values)) if values else x.new_zeros(())
        whole = (whole if torch.is_tensor(whole) else x.new_zeros(()) + whole) * scale
    finally:
        loader.CP.update(size=1, rank=0)
    return {"partials": torch.stack(partials), "unsharded": whole}


def _layout(params, fid):
    aggs = ("agg.sample_mean", "agg.constant") if _has_constant() else ("agg.sample_mean",)
    if _param(params, fid, "aggregator") not in aggs:
        _unsupported(fid, f"aggregator: the adapter reaches slime's reducer as {' or '.join(aggs)} only")
    layouts = ("thd", "bshd") if _has_bshd() else ("thd",)
    if _param(params, fid, "layout") not in layouts or _param(params, fid, "ownership") != "logit":
        _unsupported(fid, f"slime at this revision splits {'/'.join(layouts)} and gives a token to the rank of its logit")
    return _param(params, fid, "layout")


def _has_bshd():
    _, cp, _ = _modules()
    return "qkv_format" in Path(cp.__file__).read_text()


def _has_constant():
    _, cp, _ = _modules()
    return "constant_divisor" in Path(cp.__file__).read_text()


# ----------------------------------------------------------------------------------------- loss

def _args(**kw):
    a = dict(use_rollout_logprobs=False, advantage_estimator="grpo", use_opsm=False, opsm_delta=1e-4,
             eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None, get_mismatch_metrics=False, use_tis=False,
             tis_clip=2.0, tis_clip_low=0.0, custom_tis_function_path=None, calculate_per_token_loss=False,
             entropy_coef=0.0, use_kl_loss=False, kl_loss_type="k3", kl_loss_coef=0.0, use_unbiased_kl=False,
             custom_pg_loss_reducer_function_path=None, rollout_temperature=1.0, log_probs_chunk_size=-1,
             allgather_cp=False, rollout_top_p=1.0, loss_type="policy_loss", recompute_loss_function=False,
             # PR #2060 (--pg-loss-divisor, --qkv-format) and PR #2090 (--loss-aggregation)
             qkv_format="thd", pg_loss_divisor=None, loss_aggregation="sample_mean", loss_aggregation_divisor=None,
             n_samples_per_prompt=1)
    a.update(kw)
    return Namespace(**a)


def _loss(fid):
    def run(inputs, params):
        import torch

        _, _, lossmod = _modules()
        _require_null(params, fid, "is_log_ratio_clamp", "entropy_quantile")
        _require_null(params, fid, "log_ratio_max" if fid == "loss.gspo" else "log_ratio_clamp")
        agg = {"loss.grpo": "sample_mean", "loss.gspo": "sample_mean", "loss.bnpo": "token_mean",
               "loss.dr_grpo": "constant"}.get(fid) or _param(params, fid, "aggregation")
        has_agg = _feature("loss_aggregation")
        expressible = ("sample_mean", "token_mean") + (("prompt_mean", "constant") if has_agg else ()) \
            + (("constant",) if _feature("pg_loss_divisor") else ())
        if agg not in expressible:
            _unsupported(fid, f"aggregation {agg!r}: not an option of this slime revision")
        lp, old, m = _compute(inputs["logprobs"]), _compute(inputs["old_logprobs"]), inputs["mask"]
        adv = _token_adv(_compute(inputs["advantages"]), lp)
        B, T = lp.shape
        kw = dict(eps_clip=_param(params, fid, "eps_low"), eps_clip_high=_param(params, fid, "eps_high"),
                  calculate_per_token_loss=agg == "token_mean")
        if fid == "loss.gspo":
            kw["advantage_estimator"] = "gspo"
        if fid == "loss.cispo":
            if _param(params, fid, "cap_form") != "relative":
                _unsupported(fid, "cap_form 'absolute'")
            kw["advantage_estimator"] = "cispo"
            if kw["eps_clip"] is None:
                kw["eps_clip"] = 1.0
        batch = {"advantages": _rows(adv), "log_probs": _rows(old), "unconcat_tokens": [None] * B,
                 "response_lengths": [T] * B, "total_lengths": [T + 1] * B, "loss_masks": _rows(m.to(lp.dtype)),
                 "rollout_mask_sums": None}
        beta = _param(params, fid, "beta")
        if beta:
            est = _param(params, fid, "kl_estimator")
            _require_null(params, fid, "kl_log_ratio_min", "kl_log_ratio_max")
            lo, hi = _param(params, fid, "kl_output_min"), _param(params, fid, "kl_output_max")
            if est in ("k1", "k2", "k3") and (lo, hi) == (None, None):
                kl_type = est
            elif est == "k3" and (lo, hi) == (-10.0, 10.0):
                kl_type = "low_var_kl"
            else:
                _unsupported(fid, f"KL {est} with output clamp [{lo}, {hi}]")
            kw.update(use_kl_loss=True, kl_loss_coef=beta, kl_loss_type=kl_type)
            batch["ref_log_probs"] = _rows(_compute(inputs["ref_logprobs"]))
        level = _param(params, fid, "is_level")
        if level != "none":
            if level != "token":
                _unsupported(fid, f"is_level {level!r}: slime's TIS / icepop weights are per token")
            kw.update(use_tis=True, tis_clip=_param(params, fid, "is_c_max"),
                      tis_clip_low=_param(params, fid, "is_c_min") or 0.0)
            if _param(params, fid, "is_mode") == "mask":
                kw["custom_tis_function_path"] = "slime.backends.megatron_utils.loss.icepop_function"
            batch["rollout_log_probs"] = _rows(_compute(inputs["sampler_logprobs"]))
        delta = _param(params, fid, "opsm_delta")
        if delta is not None:
            # OPSM compares the current log-probs with the rollout's (--use-rollout-logprobs)
            kw.update(use_opsm=True, opsm_delta=delta)
            # slime's default (no --use-rollout-logprobs): OPSM measures the divergence from the
            # trainer's old log-probs, the ones the PPO ratio uses
        if agg == "constant":
            if _param(params, fid, "divide_by") != "K*N":
                _unsupported(fid, "divide_by 'K': the constant divides the token sum, then loss_function divides by the sample count")
            divisor = _param(params, fid, "divisor")
            kw.update(loss_aggregation="constant", loss_aggregation_divisor=divisor) if has_agg \
                else kw.update(pg_loss_divisor=divisor)
        elif has_agg:
            kw["loss_aggregation"] = agg
        if agg == "prompt_mean":
            if "group_ids" not in inputs:
                _unsupported(fid, "prompt_mean needs group_ids")
            kw["n_samples_per_prompt"] = _group_size(fid, inputs["group_ids"])
            batch["prompt_mask_sums"] = [torch.tensor(float(v), dtype=lp.dtype)
                                         for v in _prompt_mask_sums(m, inputs["group_ids"])]
        args = _args(**kw)
        logprob_rows = _rows(lp)
        entropy_rows = [torch.zeros_like(r) for r in logprob_rows]
        lossmod.get_log_probs_and_entropy = lambda logits, **k: (None, {"log_probs": logprob_rows,
                                                                        "entropy": entropy_rows})
        logits = torch.zeros(1, max(B * T, 1), 1, dtype=lp.dtype)
        loss, normalizer, _ = lossmod.loss_function(args, batch, 1, B, logits)
        if args.calculate_per_token_loss:
            loss = loss / normalizer  # Megatron's schedule divides by the returned num_tokens
        return {"loss": loss}

    run.__name__ = fid.replace(".", "_")
    return run


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": _ppo("surrogate.ppo_clip"),
    "surrogate.dual_clip": _ppo("surrogate.dual_clip"),
    "surrogate.cispo": surrogate_cispo,
    "kl.k1": _kl("kl.k1"),
    "kl.k2": _kl("kl.k2"),
    "kl.k3": _kl("kl.k3"),
    "mask.opsm": mask_opsm,
    "agg.sample_mean": agg_sample_mean,
    "dist.cp_reduce": dist_cp_reduce,
    "agg.constant": agg_constant,
    "agg.prompt_mean": agg_prompt_mean,
    "loss.dr_grpo": _loss("loss.dr_grpo"),
    "loss.grpo": _loss("loss.grpo"),
    "loss.gspo": _loss("loss.gspo"),
    "loss.bnpo": _loss("loss.bnpo"),
    "loss.dapo": _loss("loss.dapo"),
    "loss.cispo": _loss("loss.cispo"),
}


class SlimeAdapter(SourceAdapter):
    framework_modules = ("slime", "slime_plugins")   # its exceptions are the framework's rejections (spec/verdicts.md)

    revisions = REVISIONS

    def load(self):
        return loader.load(self.source())


def make_adapter():
    global ADAPTER
    a = SlimeAdapter(name="slime", framework=FRAMEWORK, version="no checkout", devices=("cpu", "cuda"),
                     dtypes=("float64", "float32", "bfloat16"), implementations=dict(IMPLEMENTATIONS))
    a.refresh_version()
    src = a.source()
    text = lambda rel: (src / rel).read_text() if src is not None and (src / rel).is_file() else ""  # noqa: E731
    if "constant_divisor" not in text("slime/backends/megatron_utils/cp_utils.py"):
        for fid in ("agg.constant", "loss.dr_grpo"):  # PR #2060 / #2090 only
            a.implementations.pop(fid)
    if "compute_cispo_loss" not in text("slime/utils/ppo_utils.py"):
        for fid in ("surrogate.cispo", "loss.cispo"):  # CISPO came after PR #2060's base
            a.implementations.pop(fid)
    if "loss_aggregation" not in text("slime/backends/megatron_utils/loss.py"):
        a.implementations.pop("agg.prompt_mean")  # PR #2090 only
    mode = loader.compile_mode()
    if mode != "eager":
        a.version += f"; torch.compile mode {mode}"
    path = Path(__file__).with_name("deviations.toml")
    check = getattr(a, "check", None)
    if check is not None and check.revision in (PR2060, PR2090):
        path = Path(__file__).with_name(f"deviations-pr{check.revision.name.split('#')[1].split()[0]}.toml")
    a.deviations = load_deviations(path)
    ADAPTER = a
    return a


ADAPTER = None
