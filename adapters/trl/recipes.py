"""loss.* recipes: one TRL 1.16.0 ``loss_type`` (plus options) per recipe, run through ``_compute_loss``.

``loss`` is the scalar TRL returns (``current_gradient_accumulation_steps = steps_per_generation = 1``, one
process; for the ``dapo`` normalizer ``num_items_in_batch`` is the batch's own token count, the spec's
"whole scope").  ``terms`` is TRL's ``per_token_loss`` read back with autograd (see _engine.py).
"""

from __future__ import annotations

from ._engine import UnsupportedParameter, compute_loss, make_stub
from .impls import VESPO_FIXED, _adv, _canon, _grad, _p, _require, _sample_mean_scale

CLIP_FAMILY = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def _config(fid, params, inputs):
    """(loss_type, level, make_stub kwargs) for this recipe and these parameters."""
    P = lambda n: _p(params, fid, n)  # noqa: E731
    recipe = fid.split(".", 1)[1]
    kw = {}
    if P("is_level") != "none":
        raise UnsupportedParameter(f"{fid}: is_level={P('is_level')!r}: TRL computes the vLLM IS ratio inside "
                                   "_generate_and_score_completions; no callable takes sampler log-probs")
    for n in ("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max"):
        _require(params, fid, n, None, "TRL 1.16.0 clamps neither the KL input nor its output (trl#3015)")
    est = P("kl_estimator")
    if est not in ("k3", "k3_unbiased"):
        raise UnsupportedParameter(f"{fid}: kl_estimator={est!r}: TRL has only k3 (use_bias_correction_kl=False) "
                                   "and importance-weighted k3 (use_bias_correction_kl=True)")
    kw.update(beta=float(P("beta")), bias_correction_kl=est == "k3_unbiased", opsm_threshold=P("opsm_delta"))
    if P("entropy_quantile") is not None:
        kw["top_entropy_quantile"] = P("entropy_quantile")
    level = "token"
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "luspo", "cispo"):
        kw["eps_high"] = P("eps_high")
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "luspo"):
        kw["eps_low"] = P("eps_low")
    if recipe in ("grpo", "bnpo", "dapo", "dr_grpo", "sapo", "cispo"):
        _require(params, fid, "log_ratio_clamp", None, "TRL does not clamp the log-ratio")
    loss_type = {"gspo": "grpo"}.get(recipe, recipe)
    if recipe == "gspo":
        _require(params, fid, "log_ratio_max", None, "TRL does not cap the sequence log-ratio")
        level = "sequence"
    elif recipe == "luspo":
        level = P("ratio_level")
    elif recipe in ("dapo", "cispo"):
        if P("aggregation") == "prompt_mean":
            g = inputs.get("group_ids")
            # with one prompt group holding tokens the prompt mean is the pooled token mean
            if g is not None and len(set(g[inputs["mask"].any(-1)].tolist())) > 1:
                raise UnsupportedParameter(f"{fid}: aggregation='prompt_mean' over several prompt groups: TRL's dapo "
                                           "normalizer pools the batch (token_mean)")
        if recipe == "cispo":
            _require(params, fid, "cap_form", "absolute", "TRL's epsilon_high is an absolute cap min(r, eps_high)")
            _require(params, fid, "eps_low", None, "TRL's cispo has no lower bound")
    elif recipe == "dr_grpo":
        _require(params, fid, "divide_by", "K*N", "TRL divides by B * max_completion_length")
        kw["max_completion_length"] = P("divisor")
    elif recipe == "sapo":
        kw.update(sapo_tau_pos=P("tau_pos"), sapo_tau_neg=P("tau_neg"))
    elif recipe == "vespo":
        for name, value in VESPO_FIXED.items():
            _require(params, fid, name, value, "TRL hard-codes it in get_gamma_weights")
        kw["vespo"] = tuple(P(n) for n in ("k_pos", "lambda_pos", "k_neg", "lambda_neg"))
    if recipe == "vespo" and inputs.get("sampler_logprobs") is not None:
        raise UnsupportedParameter(f"{fid}: TRL folds the vLLM IS ratio into phi, and computes that ratio inside "
                                   "_generate_and_score_completions; no callable takes sampler log-probs")
    return loss_type, level, kw


def _loss(fid):
    def run(inputs, params):
        import torch

        loss_type, level, kw = _config(fid, params, inputs)
        m = inputs["mask"]
        lp, old, ref, mu, ent = _canon(inputs, "logprobs", "old_logprobs", "ref_logprobs", "sampler_logprobs",
                                       "entropy")
        if kw.get("opsm_threshold") is not None and mu is None:
            raise ValueError(f"{fid}: opsm_delta needs sampler_logprobs")
        adv = _adv(inputs)
        data = dict(logprobs=lp, mask=m, advantages=adv, old_logprobs=old, ref_logprobs=ref, sampler_logprobs=mu,
                    entropy=ent)
        loss = compute_loss(make_stub(loss_type=loss_type, level=level, **kw), **data)

        # terms, read back with autograd from TRL's per_token_loss
        d = dict(data, logprobs=lp.detach())
        if level == "token" and loss_type in CLIP_FAMILY + ("cispo", "vespo"):
            fm = m.to(lp.dtype).requires_grad_(True)
            rt = "dapo" if loss_type in CLIP_FAMILY else loss_type
            out = compute_loss(make_stub(loss_type=rt, level=level, **kw), **d, num_items_in_batch=1, float_mask=fm)
            (terms,) = _grad(out, fm)
        else:
            # the policy part: d loss / d IS ratio (an all-ones ratio); then the KL part separately
            isr = torch.ones_like(lp).requires_grad_(True)
            no_kl = dict(kw, beta=0.0)
            if loss_type == "sapo":
                out = compute_loss(make_stub(loss_type="sapo", level=level, use_is=True, **no_kl), **d, is_ratio=isr)
                (g,) = _grad(out, isr)
                terms = g * _sample_mean_scale(m, lp.dtype)
            else:
                rt = "dapo" if loss_type in CLIP_FAMILY else loss_type
                out = compute_loss(make_stub(loss_type=rt, level=level, use_is=True, **no_kl), **d, is_ratio=isr,
                                   num_items_in_batch=1)
                (terms,) = _grad(out, isr)
            if kw["beta"] != 0 and level == "sequence" and kw["bias_correction_kl"]:
                # TRL multiplies the KL by the *sequence* ratio here (trl#6586); a token-level readout of the KL
                # part would not be what TRL computes, so the optional ``terms`` output is left out
                return {"loss": loss}
            if kw["beta"] != 0:
                fm = m.to(lp.dtype).requires_grad_(True)
                kl_kw = dict(beta=kw["beta"], bias_correction_kl=kw["bias_correction_kl"], eps_high=1.0)
                out = compute_loss(make_stub(loss_type="cispo", **kl_kw), **dict(d, advantages=torch.zeros_like(
                    adv)), num_items_in_batch=1, float_mask=fm)
                (kl_part,) = _grad(out, fm)
                terms = terms + kl_part
        return {"loss": loss, "terms": terms.detach()}

    run.__name__ = fid.replace(".", "_")
    return run


RECIPES = ("grpo", "bnpo", "dapo", "dr_grpo", "gspo", "cispo", "sapo", "luspo", "vespo")
IMPLEMENTATIONS = {f"loss.{r}": _loss(f"loss.{r}") for r in RECIPES}
