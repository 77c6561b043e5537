"""pgspec adapter for Fast-LLM, loaded from the user's checkout (see adapters/fast_llm/README.md).

Fast-LLM needs Python >= 3.12 (PEP 695 generics, PEP 701 f-strings): the adapter runs in a
Python 3.12 worker (``--python`` / ``PGSPEC_FAST_LLM_PYTHON``), where the checkout imports as
shipped, with no stand-in and no rewrite; or, when the user opts in with
``PGSPEC_FAST_LLM_COMPAT=pep695``, on Python 3.11 through pgspec's line-preserving source rewrite
at import (pep695.py; the version string says so).

Fast-LLM's losses are logits-level with hand-written backward passes: they return
``(loss, grad_logits, extra)``.  The adapter feeds per-token log-probs ``lp`` through a
two-column vocabulary ``logits = (lp, log(-expm1(lp)))``, target 0 (``-100`` at masked
positions), for which ``log_softmax(logits)[0] == lp``; Fast-LLM's own ``grad_logits`` is carried
back to ``lp`` by the chain rule ``dL/dlp = g0 + g1 * exp(lp) / expm1(lp)``.  The gradient checked
is therefore Fast-LLM's hand-written one, never autograd's.

- ``loss.bnpo``, ``loss.dapo`` (token mean): the GRPO loss layer
  (``LanguageModelGRPOLossConfig(...).get_layer(...).combinable_forward_backward``) with the
  training divisor, the number of labelled tokens.
- ``loss.gspo``: ``fused_gspo_loss_forward_backward`` with one document per row and the training
  divisor, the number of documents.  On the PR #502 head: ``grpo.fused_gspo_loss_forward_backward``.
- ``surrogate.gspo_document``: the same GSPO kernel over the case's packed multi-document rows
  (its document ids), divisor 1; per-document values from one call per document.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pgspec.adapters.base import Unsupported as _PropertyUnsupported

from .._gitsource import Revision, SourceAdapter, source_env
from ..base import current_cotangent, load_deviations, spec_param
from . import loader

FRAMEWORK = "Fast-LLM"

MAIN = Revision(
    name="main 7d61a1ba",
    commit="7d61a1ba2047814955f8acc1cde7bc10a68fa198",
    blobs={
        "fast_llm/layers/language_model/loss/policy_gradient.py": "94be9224007706d1badbff2c421aacff7809e9ee",
        "fast_llm/layers/language_model/loss/loss.py": "3ed545b22407bc0065f508826d2d503405471f4a",
        "fast_llm/layers/language_model/loss/config.py": "27b73c7152716688bf3502b27c41aae6213094ef",
        "fast_llm/config.py": "61e22737a537c088cf0292fffaacbc564e0ad9fa",
    },
    clone=("git clone https://github.com/ServiceNow/Fast-LLM fast-llm && git -C fast-llm checkout "
           "7d61a1ba2047814955f8acc1cde7bc10a68fa198"),
)
PR502 = Revision(
    name="PR #502 head 227f8bc1",
    commit="227f8bc15a57a8b4365cae3cc43bff4c3fa80024",
    blobs=dict(loader.PR502_BLOBS),
    clone=("git clone https://github.com/ServiceNow/Fast-LLM fast-llm-pr502 && git -C fast-llm-pr502 fetch origin "
           "pull/502/head && git -C fast-llm-pr502 checkout 227f8bc15a57a8b4365cae3cc43bff4c3fa80024"),
)
REVISIONS = [MAIN, PR502]


class FastLLMUnsupported(_PropertyUnsupported, NotImplementedError):
    """A parameter value or input form Fast-LLM's loss cannot express (declared as a capability)."""


def _unsupported(fid, why):
    raise FastLLMUnsupported(f"fast_llm: {fid}: {why}")


_param = spec_param   # every parameter read here is a scalar or a choice (same values as before)


def _mods():
    src = ADAPTER.source()
    if src is None:
        raise RuntimeError(f"no Fast-LLM checkout ({source_env('fast_llm')} is not set)")
    return loader.load(src)


def _logits(lp):
    import torch

    return torch.stack([lp, torch.log(-torch.expm1(lp))], dim=-1)


def _to_lp(grad_logits, lp):
    import torch

    g = grad_logits.to(lp.dtype)
    return g[..., 0] + g[..., 1] * (torch.exp(lp) / torch.expm1(lp))


def _compute(x):
    import torch

    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _common(params, fid):
    for n in ("is_log_ratio_clamp", "opsm_delta", "entropy_quantile"):
        if _param(params, fid, n) is not None:
            _unsupported(fid, f"{n}: no counterpart in Fast-LLM's policy losses")
    if _param(params, fid, "is_level") != "none":
        _unsupported(fid, "is_level: Fast-LLM's policy losses have no train/inference IS correction")
    if _param(params, fid, "beta"):
        _unsupported(fid, "beta: Fast-LLM's policy losses have no KL term")


def _inputs(inputs):
    import torch

    lp = _compute(inputs["logprobs"]).detach()
    old, m = _compute(inputs["old_logprobs"]).detach(), inputs["mask"]
    # masked positions hold a finite dummy log-prob: the loss never reads them (target -100)
    lp_safe = torch.where(m, lp, torch.full_like(lp, -1.0))
    old_safe = torch.where(m, old, torch.full_like(old, -1.0))
    adv = _compute(inputs["advantages"]).detach()
    adv = adv.unsqueeze(-1).expand_as(lp).contiguous() if adv.dim() == 1 else adv
    adv = torch.where(m, adv, torch.zeros_like(adv))
    target = torch.where(m, 0, -100)
    return lp_safe, old_safe, adv, m, target


def _grpo(fid):
    def run(inputs, params):
        import torch

        mods = _mods()
        _common(params, fid)
        if _param(params, fid, "log_ratio_clamp") is not None:
            _unsupported(fid, "log_ratio_clamp: the ratio is never clamped")
        if fid == "loss.dapo" and _param(params, fid, "aggregation") != "token_mean":
            _unsupported(fid, "aggregation: the GRPO loss divides by the labelled-token count")
        lp, old, adv, m, target = _inputs(inputs)
        lo, hi = _param(params, fid, "eps_low"), _param(params, fid, "eps_high")
        ntok = int(m.sum())
        loss, grad_logits = loader.grpo(mods, _logits(lp), target, adv, old, ntok, lo, hi, m)
        g = _to_lp(grad_logits, lp) if grad_logits is not None else torch.zeros_like(lp)
        return {"loss": loss.to(lp.dtype), "grad": {"logprobs": torch.where(m, g, torch.zeros_like(g))}}

    run.__name__ = fid.replace(".", "_")
    return run


def loss_gspo(inputs, params):
    import torch

    fid = "loss.gspo"
    mods = _mods()
    _common(params, fid)
    if _param(params, fid, "log_ratio_max") is not None:
        _unsupported(fid, "log_ratio_max: the sequence log-ratio is never capped")
    lp, old, adv, m, target = _inputs(inputs)
    B, T = lp.shape
    docs = torch.arange(B).unsqueeze(-1).expand(B, T).contiguous()
    loss, grad_logits = loader.gspo(mods, _logits(lp), target, adv, old, docs, m, B,
                                    _param(params, fid, "eps_low"), _param(params, fid, "eps_high"))
    g = _to_lp(grad_logits, lp) if grad_logits is not None else torch.zeros_like(lp)
    return {"loss": loss.to(lp.dtype), "grad": {"logprobs": torch.where(m, g, torch.zeros_like(g))}}


def surrogate_gspo_document(inputs, params):
    """GSPO over packed documents: the case's rows and document ids go to Fast-LLM's GSPO kernel as
    they are (ids renumbered 0..K-1 in increasing order, as Fast-LLM's 0-based document index).
    ``weighted_loss[s]`` (N_s l_s) is the kernel's loss with only document s labelled; the gradient is
    the VJP with the case's cotangent c (pgspec.adapters.base.current_cotangent, one value per
    document): the sum over documents of the kernel's hand-written gradient with only document s
    labelled and ``grad_output`` c_s (divisor 1)."""
    import torch

    fid = "surrogate.gspo_document"
    mods = _mods()
    lp, old, adv, m, target = _inputs(inputs)
    ids = inputs["document_ids"]
    seg = sorted({int(x) for x in ids[m].tolist()})
    index = {s: k for k, s in enumerate(seg)}
    docs = torch.tensor([[index.get(int(x), 0) if keep else 0 for x, keep in zip(row, mrow)]
                         for row, mrow in zip(ids.tolist(), m.tolist())], dtype=torch.int64)
    counts = torch.zeros(max(len(seg), 1), dtype=torch.int32).index_add_(
        0, docs[m], torch.ones(int(m.sum()), dtype=torch.int32))
    n_per_tok = torch.where(m, counts[docs], torch.zeros_like(counts[docs]))
    lo, hi = _param(params, fid, "eps_low"), _param(params, fid, "eps_high")
    logits = _logits(lp)
    weighted = []
    c = current_cotangent(like=torch.zeros(len(seg), dtype=torch.float64))
    grad_logits = None
    for k in range(len(seg)):
        only = torch.where(m & (docs == k), target, torch.full_like(target, -100))
        loss_k, grad_k = loader.gspo_packed(mods, logits, only, adv, old, docs, n_per_tok, len(seg) or 1, lo, hi,
                                            float(c[k]))
        weighted.append(loss_k.reshape(()))
        if grad_k is not None:
            grad_logits = grad_k if grad_logits is None else grad_logits + grad_k
    g = _to_lp(grad_logits, lp) if grad_logits is not None else torch.zeros_like(lp)
    out = torch.stack(weighted).to(lp.dtype) if weighted else torch.zeros(0, dtype=lp.dtype)
    return {"weighted_loss": out, "grad": {"logprobs": torch.where(m, g, torch.zeros_like(g))}}


IMPLEMENTATIONS = {"loss.bnpo": _grpo("loss.bnpo"), "loss.dapo": _grpo("loss.dapo"), "loss.gspo": loss_gspo,
                   "surrogate.gspo_document": surrogate_gspo_document}


class FastLLMAdapter(SourceAdapter):
    framework_modules = ("fast_llm",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    revisions = REVISIONS

    def load(self):
        return loader.load(self.source())


def make_adapter():
    global ADAPTER
    a = FastLLMAdapter(name="fast_llm", framework=FRAMEWORK, version="no checkout", devices=("cpu", "cuda"),
                       dtypes=("float64", "float32", "bfloat16"), implementations=dict(IMPLEMENTATIONS))
    a.refresh_version()
    if loader.compile_mode() != "eager":
        a.version += f"; torch.compile mode {loader.compile_mode()}"
    if loader.rewritten():
        a.version += ("; on Python %d.%d through pgspec's line-preserving PEP 695 rewrite "
                      "(PGSPEC_FAST_LLM_COMPAT=pep695)" % sys.version_info[:2])
    path = Path(__file__).with_name("deviations.toml")
    check = getattr(a, "check", None)
    if check is not None and check.revision is PR502:
        path = Path(__file__).with_name("deviations-pr502.toml")
    a.deviations = load_deviations(path)
    ADAPTER = a
    return a


ADAPTER = None
