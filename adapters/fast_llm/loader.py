"""Import Fast-LLM's policy-gradient losses from a checkout, in a Python >= 3.12 worker, or on
Python 3.11 through pgspec's line-preserving rewrite when the user asks for it
(``PGSPEC_FAST_LLM_COMPAT=pep695``: pep695.py, adapters/fast_llm/README.md).

Executed from the checkout: ``fast_llm`` as shipped (its package ``__init__`` files included),
through ``fast_llm.layers.language_model.loss.policy_gradient`` (main) or
``fast_llm.layers.language_model.loss.grpo`` (PR #502 head).  No stand-in; on 3.12 no rewrite.
Third-party needs: torch, numpy, pyyaml, packaging, requests.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

PR502_BLOBS = {
    "fast_llm/layers/language_model/loss/grpo.py": "3c49ae13104fd2ae79cafb073961778c78d969a6",
    "fast_llm/layers/language_model/loss/loss.py": "53e6e6e881df92878348fd091dcee1dbeda2dcb1",
    "fast_llm/layers/language_model/loss/config.py": "c05359ba7827513797a284cba8c830703d7e2679",
    "fast_llm/config.py": "61e22737a537c088cf0292fffaacbc564e0ad9fa",
}

_loaded = {}


def compile_mode() -> str:
    import os

    mode = os.environ.get("PGSPEC_FAST_LLM_COMPILE", "eager")
    if mode not in ("eager", "default"):
        raise ValueError(f"PGSPEC_FAST_LLM_COMPILE must be 'eager' or 'default', got {mode!r}")
    return mode


def compat_mode() -> str:
    """``PGSPEC_FAST_LLM_COMPAT``: ``off`` (the default: Fast-LLM needs Python >= 3.12) or ``pep695``
    (on Python < 3.12, import the checkout through pep695.py's rewrite)."""
    from pgspec.conformance.base.settings import get

    return get("PGSPEC_FAST_LLM_COMPAT", "off")


def rewritten() -> bool:
    """Whether this interpreter imports Fast-LLM through the PEP 695 rewrite."""
    return sys.version_info < (3, 12) and compat_mode() == "pep695"


def load(src: Path) -> dict:
    key = str(src)
    if key in _loaded:
        return _loaded[key]
    if sys.version_info < (3, 12):
        if not rewritten():
            raise RuntimeError(f"Fast-LLM needs Python >= 3.12; this worker runs {sys.version.split()[0]} "
                               "(pass --python or set PGSPEC_FAST_LLM_PYTHON, or opt in to the line-preserving "
                               "rewrite with PGSPEC_FAST_LLM_COMPAT=pep695: adapters/fast_llm/README.md)")
        from . import pep695

        pep695.install("fast_llm")
    import torch

    # GRPO's combinable_forward_backward and GSPO's forward core, segment weights, segment loss
    # (epsilons as Python floats) and backward core are @torch.compile'd (README).  Their inputs
    # never require grad here (Fast-LLM computes the gradient by hand), the precondition of the
    # stale-float trap (pytorch #194976 / #197889), but the adapter still runs them eagerly by
    # default so that no compiled graph can carry a float across cases;
    # PGSPEC_FAST_LLM_COMPILE=default keeps torch's default.
    if compile_mode() == "eager":
        torch._dynamo.config.disable = True
    sys.path.insert(0, str(src))
    cfg = importlib.import_module("fast_llm.layers.language_model.loss.config")
    from fast_llm.engine.distributed.config import DistributedConfig

    dist = DistributedConfig()
    dist.validate()
    mods = {"config": cfg, "distributed": dist}
    if (Path(src) / "fast_llm/layers/language_model/loss/policy_gradient.py").is_file():
        mods["pg"] = importlib.import_module("fast_llm.layers.language_model.loss.policy_gradient")
        mods["revision"] = "main"
    else:
        mods["grpo"] = importlib.import_module("fast_llm.layers.language_model.loss.grpo")
        mods["revision"] = "pr502"
    _loaded[key] = mods
    return mods


def grpo(mods, logits, target, adv, old, ntok, lo, hi, mask):
    """(loss, grad_logits) of Fast-LLM's GRPO loss with the labelled-token divisor."""
    import torch

    if mods["revision"] == "main":
        layer = mods["config"].LanguageModelGRPOLossConfig(epsilon_low=lo, epsilon_high=hi).get_layer(
            mods["distributed"], name="grpo", logits_scale_factor=1.0)
        nlis = torch.where(mask, torch.tensor(ntok), torch.tensor(0))
        loss, grad_logits, _ = layer.combinable_forward_backward(
            logits, None, None, (target, adv, old, 1.0, ntok, lo, hi, nlis, False))
        return loss, grad_logits
    nlis = torch.where(mask, torch.tensor(ntok), torch.tensor(0))
    loss, grad_logits, _ = mods["grpo"].fused_grpo_loss_forward_backward(
        logits, target, adv, old, grad_output=1.0, epsilon_low=lo, epsilon_high=hi, num_labels_in_seq=nlis,
        divisor=float(ntok))
    return loss, grad_logits


def gspo(mods, logits, target, adv, old, docs, mask, num_docs, lo, hi):
    """(loss, grad_logits) of Fast-LLM's GSPO loss, one document per row, with the divisor its
    training uses by default: main divides by the number of documents; the PR #502 head, without
    normalize_by_documents, by the labelled-token count."""
    import torch

    n_per_doc = mask.sum(-1, keepdim=True).expand_as(mask).to(torch.int32)
    if mods["revision"] == "main":
        loss, grad_logits, _ = mods["pg"].fused_gspo_loss_forward_backward(
            logits, target, adv, old, docs, num_docs, divisor=float(num_docs), num_labels_in_seq=n_per_doc,
            grad_output=1.0, epsilon_low=lo, epsilon_high=hi)
        return loss, grad_logits
    V = logits.shape[-1]
    loss, grad_logits, _ = mods["grpo"].fused_gspo_loss_forward_backward(
        logits.reshape(-1, V), target.reshape(-1), adv.reshape(-1), old.reshape(-1), docs.reshape(-1),
        grad_output=1.0, epsilon_low=lo, epsilon_high=hi, num_labels_in_seq=n_per_doc.reshape(-1),
        divisor=float(max(int(mask.sum()), 1)))
    return loss, grad_logits.reshape(logits.shape) if grad_logits is not None else None


def gspo_packed(mods, logits, target, adv, old, docs, n_per_tok, num_docs, lo, hi, grad):
    """(loss, grad_logits) of Fast-LLM's GSPO kernel over packed rows: ``docs`` holds each token's
    0-based document index (documents may span rows), ``n_per_tok`` its document's labelled-token
    count; divisor 1, so the loss is Fast-LLM's undivided sum over documents of n_s times the
    document loss.  ``grad``: whether to ask for the hand-written gradient (True: of the loss; a number:
    of that number times the loss, Fast-LLM's ``grad_output``)."""
    g = (1.0 if grad is True else float(grad)) if grad is not False and grad is not None else None
    if mods["revision"] == "main":
        loss, grad_logits, _ = mods["pg"].fused_gspo_loss_forward_backward(
            logits, target, adv, old, docs, num_docs, divisor=1.0, num_labels_in_seq=n_per_tok,
            grad_output=g, epsilon_low=lo, epsilon_high=hi)
        return loss, grad_logits
    V = logits.shape[-1]
    loss, grad_logits, _ = mods["grpo"].fused_gspo_loss_forward_backward(
        logits.reshape(-1, V), target.reshape(-1), adv.reshape(-1), old.reshape(-1), docs.reshape(-1),
        grad_output=g, epsilon_low=lo, epsilon_high=hi, num_labels_in_seq=n_per_tok.reshape(-1), divisor=1.0)
    return loss, grad_logits.reshape(logits.shape) if grad_logits is not None else None
