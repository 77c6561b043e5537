"""``liger_kernel.transformers.grpo_loss.triton_grpo_loss`` (the Triton kernel).

Runs on CUDA, or on CPU under Triton's interpreter (``TRITON_INTERPRET=1`` set before triton is
imported; slow, for small cases).  The same code serves both: the kernel runs on the device of the
case's tensors (``--device cuda``), or on the CPU when the interpreter is on.  Logits (B, T+1, V=2)
come from construct.py (the last row is ignored by the kernel); ``reduce=True`` applies Liger's own
aggregation; the gradient w.r.t. the logits comes from the kernel's backward and is turned into the
gradient w.r.t. the log-probs.  Argument checks are the kernel's own (``triton_grpo_loss`` and
``GrpoLossFunction.forward``), not the chunked module's.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from .chunked import prepare
from .construct import grad_from_z1, logits_for
from .head import HEAD_LOSSES


def triton_available() -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "the Triton path needs the triton package: in the pgspec checkout, pip install -c constraints.txt triton==3.9.0"
    if os.environ.get("TRITON_INTERPRET") == "1":
        if importlib.util.find_spec("numpy") is None:
            return False, "TRITON_INTERPRET=1 needs numpy"
        return True, ""
    if torch.cuda.is_available():
        return True, ""
    return False, ("the Triton path needs a CUDA device, or TRITON_INTERPRET=1 (set before triton is imported) "
                   "to run the kernels on CPU in Triton's interpreter")


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def device_available(device: str) -> tuple[bool, str]:
    """Where the kernel can run: CUDA tensors (compiled kernels), or CPU tensors under the interpreter."""
    if device == "cpu" and not interpreted():
        return False, ("the Triton kernels run on CPU tensors only in Triton's interpreter: set TRITON_INTERPRET=1 "
                       "(before triton is imported), or run with --device cuda")
    return True, ""


def _kernel_device(like):
    return torch.device("cpu") if interpreted() else like.device


def loss_impl(formula_id):
    def impl(inputs, params):
        from liger_kernel.transformers.grpo_loss import triton_grpo_loss

        cfg, kw = prepare(formula_id, inputs, params, check=False)
        lp, m = inputs["logprobs"], inputs["mask"]
        B, T = m.shape
        dev = _kernel_device(lp)
        z = logits_for(lp, m, torch.float32).to(dev)
        logits = torch.cat([z, torch.zeros((B, 1, 2), dtype=torch.float32, device=dev)], dim=1).contiguous()
        logits.requires_grad_(True)
        loss = _kernel_loss(triton_grpo_loss, logits, torch.zeros((B, T), dtype=torch.long, device=dev), cfg, kw, dev)
        (gl,) = torch.autograd.grad(loss, logits)
        home = lp.device
        return {"loss": loss.to(home), "grad": {"logprobs": grad_from_z1(gl[:, :T, 1].to(home), lp, m)}}

    return impl


def _kernel_loss(triton_grpo_loss, logits, completion_ids, cfg, kw, dev):
    """triton_grpo_loss on (B, T+1, V) ``logits`` with Liger's configuration ``cfg`` and the call's tensors
    ``kw`` (chunked.prepare), temperature 1, ``reduce=True`` (Liger's own aggregation): the loss."""
    args = dict(temperature=1.0, beta=cfg["beta"], eps_low=cfg.get("epsilon_low", 0.2),
                eps_high=cfg.get("epsilon_high", 0.2), inplace=False, loss_type=cfg["loss_type"],
                importance_sampling_level=cfg["importance_sampling_level"], reduce=True,
                max_completion_length=cfg.get("max_completion_length"),
                use_bias_correction_kl=cfg.get("use_bias_correction_kl", False))
    if "sapo_temperature_pos" in cfg:
        args.update(sapo_temperature_pos=cfg["sapo_temperature_pos"], sapo_temperature_neg=cfg["sapo_temperature_neg"])
    for k in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
        if k in cfg:
            args[k] = cfg[k]
    f32 = lambda x: None if x is None else x.detach().float().to(dev).contiguous()  # noqa: E731
    out = triton_grpo_loss(logits, f32(kw["old"]), f32(kw.get("ref")), completion_ids, f32(kw["advantages"]),
                           kw["mask"].to(torch.int32).to(dev).contiguous(), vllm_is_ratio=f32(kw.get("vllm_is_ratio")),
                           **args)
    return out[0] if isinstance(out, tuple) else out


def head_loss(fid):
    """``_head_loss`` for the token loss ``fid`` (check_head_loss.FORMULAS)."""
    def head(hidden, weight, targets, mask, old_logprobs, advantages, params, ref_logprobs=None, sampler_logprobs=None):
        return _head_loss(fid, hidden, weight, targets, mask, old_logprobs, advantages, params, ref_logprobs,
                          sampler_logprobs)

    return head


def _head_loss(fid, hidden, weight, targets, mask, old_logprobs, advantages, params, ref_logprobs=None,
               sampler_logprobs=None):
    """`pgspec check --formula fid --vocab V` (conformance/check/head_loss.py): triton_grpo_loss on the
    logits ``hidden @ weight^T`` formed in the run's dtype, as a model's LM head hands them over, in the
    (B, T+1, V) layout the kernel takes (its last row is ignored): the kernel's own loop over the
    vocabulary in blocks of 4,096 (an online log-sum-exp in float32), forward and backward, and its
    aggregation.  The gradient reaches the hidden states through the matmul.  The hidden states get a zero
    row appended before the matmul, so the logits are formed once, already in that layout (a model's head
    also computes the row after the last completion token): the call holds two [B, T+1, V] tensors at its
    peak, the logits and the kernel's gradient of them: about 4 B T V bytes in bfloat16 (8 B T V in float32)
    must fit in the device's memory.  With beta > 0 the kernel takes ``ref_logprobs`` as its ``ref_logp``;
    VESPO's sampler log-probs (``--sampler``) reach it as ``vllm_is_ratio`` (chunked.vespo_is_ratio)."""
    from liger_kernel.transformers.grpo_loss import triton_grpo_loss

    inputs = {"mask": mask, "old_logprobs": old_logprobs, "advantages": advantages}
    if ref_logprobs is not None:
        inputs["ref_logprobs"] = ref_logprobs
    if sampler_logprobs is not None:
        inputs["sampler_logprobs"] = sampler_logprobs
    cfg, kw = prepare(fid, inputs, params, check=False)
    B, T = mask.shape
    dev = _kernel_device(hidden)
    x = hidden.detach().to(dev).requires_grad_(True)
    with torch.enable_grad():
        logits = torch.cat([x, x.new_zeros((B, 1, x.shape[-1]))], dim=1) @ weight.detach().to(dev).T
        loss = _kernel_loss(triton_grpo_loss, logits, targets.to(dev).contiguous(), cfg, kw, dev)
        (g,) = torch.autograd.grad(loss, [x])
    return {"loss": loss.detach().to(hidden.device), "grad": {"hidden": g.to(hidden.device)}}


HEADS = {fid: head_loss(fid) for fid in HEAD_LOSSES}


IMPLEMENTATIONS = {fid: loss_impl(fid) for fid in (
    "loss.grpo", "loss.dapo", "loss.bnpo", "loss.dr_grpo", "loss.gspo", "loss.cispo", "loss.sapo", "loss.luspo",
    "loss.vespo")}
