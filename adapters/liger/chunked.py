"""The chunked (pure PyTorch) path of Liger-Kernel 0.8.5, log-probs in.

``LigerFusedLinearGRPOLoss`` computes fp32 log-probs from hidden states and an LM head
(``_ChunkedSelectiveLogProbFunction``), then hands them to
``LigerFusedLinearPPOBase._compute_loss_from_logps``, which calls the static
``LigerFusedLinearGRPOFunction.ppo_loss_fn`` (the unit ``torch.compile`` wraps when
``compiled=True``).  This module calls that same ``_compute_loss_from_logps`` with the case's
log-probs, eagerly (compiled=False), so the loss math is Liger's and the gradient w.r.t. the
log-probs is autograd's through it.  The log-prob half is covered by ``logprob.token`` (the same
``_ChunkedSelectiveLogProbFunction`` with hidden = logits, weight = identity), and the two halves
composed end to end by ``fused.py``.

``terms`` (the per-token quantity the aggregator reduces) is not an output of Liger; it is read
from Liger's own per-token math with unit normalizers (see ``_terms``).
"""

from __future__ import annotations

import torch

from .mapping import Unsupported, liger_config, param


def _liger():
    from liger_kernel.chunked_loss.fused_linear_ppo import LigerFusedLinearPPOBase
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction

    return LigerFusedLinearPPOBase, LigerFusedLinearGRPOFunction


def compute_loss(logps, mask, advantages, *, old=None, ref=None, vllm_is_ratio=None, full_mask=None,
                 num_items_in_batch=None, **cfg):
    """Liger's ``_compute_loss_from_logps`` (-> ``ppo_loss_fn``), as the fused path calls it."""
    base, grpo = _liger()
    full_mask = mask if full_mask is None else full_mask
    return base._compute_loss_from_logps(
        logps, mask, advantages,
        ref_per_token_logps_chunk=ref, old_per_token_logps_chunk=old, vllm_is_ratio_chunk=vllm_is_ratio,
        full_attention_mask=full_mask, ppo_loss_fn=grpo.ppo_loss_fn, num_items_in_batch=num_items_in_batch, **cfg)


def vespo_is_ratio(inputs):
    """TRL's importance_sampling_ratio for VESPO: exp(l_old - l_sampler) per token, 1 where masked."""
    if "sampler_logprobs" not in inputs:
        return None
    m = inputs["mask"]
    d = inputs["old_logprobs"] - inputs["sampler_logprobs"]
    # at least float32 (TRL's ratio is float32); float64 runs keep float64
    d = d.to(torch.promote_types(d.dtype, torch.float32))
    return torch.exp(torch.where(m, d, torch.zeros_like(d)))


def validate(cfg):
    """Liger's own argument checks: ``LigerFusedLinearGRPOLoss.__init__`` (the module a user builds; this
    path calls the loss function beneath it) rejects non-positive SAPO temperatures and delta."""
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOLoss

    names = ("beta", "epsilon_low", "epsilon_high", "loss_type", "max_completion_length", "importance_sampling_level",
             "sapo_temperature_pos", "sapo_temperature_neg", "use_bias_correction_kl", "vespo_k_pos",
             "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")
    LigerFusedLinearGRPOLoss(compiled=False, **{k: cfg[k] for k in names if k in cfg})


def prepare(formula_id, inputs, params, check=True):
    """(cfg, call kwargs) for one loss.* case.  ``check``: run ``LigerFusedLinearGRPOLoss.__init__``'s
    argument checks (the chunked and fused paths); the Triton path leaves its checks to
    ``triton_grpo_loss`` itself."""
    cfg = liger_config(formula_id, params, inputs)
    if check:
        validate(cfg)
    m = inputs["mask"]
    kw = {"old": inputs["old_logprobs"], "advantages": inputs["advantages"]}
    if cfg["beta"] != 0:
        if "ref_logprobs" not in inputs:
            raise Unsupported("beta > 0 without ref_logprobs")
        kw["ref"] = inputs["ref_logprobs"]
    if formula_id == "loss.vespo":
        kw["vllm_is_ratio"] = vespo_is_ratio(inputs)
    # the mask as Liger gets it from TRL (completion_mask, an integer tensor)
    kw["mask"] = m.to(torch.int64)
    return cfg, kw


def _unit(cfg):
    """cfg with the aggregation made a plain masked sum: sum_{i,t} m term (and its loss_type)."""
    lt = cfg["loss_type"]
    out = dict(cfg)
    if lt in ("grpo", "luspo", "bnpo", "dr_grpo"):
        out["loss_type"] = "bnpo"        # same clipped per-token term; bnpo divides by the full mask
    return out


def _terms(formula_id, inputs, cfg, kw):
    """Per-token terms from Liger's per-token math, with every normalizer set to 1.

    The policy part: ``vllm_is_ratio`` (which Liger multiplies into the policy term only) is passed
    as ones that require grad; d(sum m term)/d w_{i,t} = m pg_{i,t}.  The KL part: the same call
    with zero advantages (policy term 0), differentiated w.r.t. a float mask: d/d m_{i,t} =
    beta kl_{i,t} (exact at token level; at sequence level with k3_unbiased the sequence ratio also
    depends on the mask).  VESPO (phi is per sequence and computed under no_grad) is read off the
    mask gradient directly.  The unit normalizers: bnpo with a (1, 1) full mask, dapo/cispo/vespo
    with num_items_in_batch = 1, grpo/sapo on one-token rows (token level only).
    """
    lp = inputs["logprobs"].detach()
    m = inputs["mask"]
    B, T = m.shape
    cdt = torch.promote_types(lp.dtype, torch.float32)
    unit = _unit(cfg)
    lt = unit["loss_type"]
    one = torch.ones((1, 1), dtype=cdt)
    if lt == "vespo":
        fm = m.to(cdt).requires_grad_(True)
        loss, _ = compute_loss(lp, fm, kw["advantages"], old=kw["old"], ref=kw.get("ref"),
                               vllm_is_ratio=kw.get("vllm_is_ratio"), full_mask=one, num_items_in_batch=1, **unit)
        (g,) = torch.autograd.grad(loss, fm)
        return g
    extra = {"num_items_in_batch": 1} if lt in ("dapo", "cispo") else {}
    if lt == "sapo":
        if unit["importance_sampling_level"] != "token":
            raise Unsupported("sequence-level sapo")
        # one-token rows: the per-sequence mean over a row of one token is the token itself
        rows = lambda x: x.reshape(B * T, 1)  # noqa: E731
        w = torch.ones((B * T, 1), dtype=cdt, requires_grad=True)
        adv = kw["advantages"].repeat_interleave(T)
        loss, _ = compute_loss(rows(lp), rows(m.to(cdt)), adv, old=rows(kw["old"]),
                               ref=rows(kw["ref"]) if "ref" in kw else None, vllm_is_ratio=w, full_mask=one,
                               **{**unit, "beta": 0.0})
        (gw,) = torch.autograd.grad(loss, w)
        pg = gw.reshape(B, T)
    else:
        w = torch.ones((B, T), dtype=cdt, requires_grad=True)
        loss, _ = compute_loss(lp, m.to(cdt), kw["advantages"], old=kw["old"], ref=kw.get("ref"),
                               vllm_is_ratio=w, full_mask=one, **{**unit, "beta": 0.0}, **extra)
        (pg,) = torch.autograd.grad(loss, w)
    if cfg["beta"] == 0:
        return pg
    fm = m.to(cdt).requires_grad_(True)
    kl_cfg = {**unit, "loss_type": "bnpo"}
    # zero advantages leave only the KL; old = l (ratio 1) unless the bias-corrected KL reads the ratio,
    # so an overflowing ratio cannot make the zero policy part 0 * inf = NaN
    old = kw["old"] if cfg.get("use_bias_correction_kl") else lp
    loss, _ = compute_loss(lp, fm, torch.zeros_like(kw["advantages"]), old=old, ref=kw["ref"], full_mask=one,
                           **kl_cfg)
    (gk,) = torch.autograd.grad(loss, fm)
    return pg + gk


def loss_impl(formula_id):
    def impl(inputs, params):
        cfg, kw = prepare(formula_id, inputs, params)
        loss, _metrics = compute_loss(inputs["logprobs"], kw["mask"], kw["advantages"], old=kw["old"],
                                      ref=kw.get("ref"), vllm_is_ratio=kw.get("vllm_is_ratio"), **cfg)
        out = {"loss": loss}
        with torch.enable_grad():
            out["terms"] = _terms(formula_id, inputs, cfg, kw)
        return out

    impl.__name__ = f"liger_{formula_id.replace('.', '_')}"
    return impl


def kl_k3(inputs, params):
    from liger_kernel.chunked_loss.grpo_loss import k3_loss_fn

    for name in ("log_ratio_min", "log_ratio_max", "output_min", "output_max"):
        if param("kl.k3", params, name) is not None:
            raise Unsupported(f"Liger-Kernel 0.8.5 k3_loss_fn has no clamp ({name})")
    return {"kl": k3_loss_fn(inputs["ref_logprobs"], inputs["logprobs"])}


def no_logit_transform(params):
    """Unsupported unless logprob.token's logit_scale is 1 and its softcap null: the selective log-prob
    kernel divides the logits by the temperature and does nothing else to them."""
    if param("logprob.token", params, "logit_scale") != 1:
        raise Unsupported("Liger-Kernel 0.8.5 has no logit_scale")
    if param("logprob.token", params, "softcap") is not None:
        raise Unsupported("Liger-Kernel 0.8.5 has no softcap")


def logprob_token(inputs, params):
    """Liger's selective log-prob kernel with hidden = logits and an identity LM head (exact)."""
    from liger_kernel.chunked_loss.fused_linear_ppo import (_SELECTIVE_LOGPROB_VOCAB_CHUNK_SIZE,
                                                            _ChunkedSelectiveLogProbFunction)

    no_logit_transform(params)
    tau = param("logprob.token", params, "temperature")
    logits = inputs["logits"]
    B, T, V = logits.shape
    eye = torch.eye(V, dtype=logits.dtype)
    targets = torch.where(inputs["mask"], inputs["targets"], torch.zeros_like(inputs["targets"]))
    lp = _ChunkedSelectiveLogProbFunction.apply(logits.reshape(B * T, V), eye, targets.reshape(B * T), None, tau,
                                               _SELECTIVE_LOGPROB_VOCAB_CHUNK_SIZE)
    return {"logprobs": lp.reshape(B, T)}


IMPLEMENTATIONS = {fid: loss_impl(fid) for fid in (
    "loss.grpo", "loss.dapo", "loss.bnpo", "loss.dr_grpo", "loss.gspo", "loss.cispo", "loss.sapo", "loss.luspo",
    "loss.vespo")}
IMPLEMENTATIONS["kl.k3"] = kl_k3
IMPLEMENTATIONS["logprob.token"] = logprob_token
