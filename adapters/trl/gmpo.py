"""surrogate.gmpo and loss.gmpo: TRL 1.16.0's experimental ``GMPOTrainer._compute_loss`` on a stub trainer.

``GMPOTrainer`` (trl/experimental/gmpo/gmpo_trainer.py) overrides only ``_compute_loss``: log-space token clip,
geometric mean over the (entropy-masked) tokens, ``-coef * A`` per sequence, an optional sequence-mean k3 KL, and
a plain mean over the B rows.  It has no OPSM, no vLLM IS multiply and no KL bias correction.  Its scalar is a
mean over rows, so the per-sequence loss of ``surrogate.gmpo`` is read by calling TRL on one row at a time (B = 1:
the returned scalar is that row's loss, its gradient that row's gradient); the gradient returned is the VJP with the
case's cotangent, sum_i c_i (row i's gradient).
"""

from __future__ import annotations

from pgspec.adapters.base import cotangent_context, current_cotangent

from ._engine import UnsupportedParameter, compute_loss, make_stub
from .impls import _adv, _canon, _p, _require


def _trainer_cls():
    from trl.experimental.gmpo import GMPOTrainer

    return GMPOTrainer


def _check_advantages(fid, adv):
    if adv.dim() != 1:
        raise UnsupportedParameter(f"{fid}: GMPOTrainer takes [B] advantages (advantages.unsqueeze(1)); it has no "
                                   "per-token advantages")


def surrogate_gmpo(inputs, params):
    import torch

    fid = "surrogate.gmpo"
    m = inputs["mask"]
    lp, old = _canon(inputs, "logprobs", "old_logprobs")
    adv = _adv(inputs)
    _check_advantages(fid, adv)
    stub = make_stub(loss_type="grpo", eps_low=_p(params, fid, "eps_low"), eps_high=_p(params, fid, "eps_high"),
                     trainer_cls=_trainer_cls())
    losses, grads = [], []
    c = current_cotangent(like=torch.zeros(m.shape[0], dtype=lp.dtype))   # one per sequence: the VJP's weights
    for i in range(m.shape[0]):
        row = slice(i, i + 1)
        loss = compute_loss(stub, logprobs=lp[row], mask=m[row], advantages=adv[row], old_logprobs=old[row])
        # the rows share the zero-filled input's graph, so keep it for the next row
        g = torch.autograd.grad(loss, inputs["logprobs"], retain_graph=True, allow_unused=True)[0]
        losses.append(loss.detach())
        grads.append(None if g is None else g * c[i])
    value = torch.stack(losses) if losses else torch.zeros(0, dtype=lp.dtype)
    grad = sum((torch.zeros_like(inputs["logprobs"]) if g is None else g) for g in grads) if grads else \
        torch.zeros_like(inputs["logprobs"])
    return {"loss": value, "grad": {"logprobs": grad}}


def loss_gmpo(inputs, params):
    import torch

    fid = "loss.gmpo"
    P = lambda n: _p(params, fid, n)  # noqa: E731
    if P("is_level") != "none":
        raise UnsupportedParameter(f"{fid}: is_level={P('is_level')!r}: GMPOTrainer applies no vLLM IS ratio")
    _require(params, fid, "opsm_delta", None, "GMPOTrainer has no off-policy sequence mask")
    for n in ("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max"):
        _require(params, fid, n, None, "TRL 1.16.0 clamps neither the KL input nor its output (trl#3015)")
    if P("kl_estimator") != "k3":
        raise UnsupportedParameter(f"{fid}: kl_estimator={P('kl_estimator')!r}: GMPOTrainer has only k3 (no "
                                   "use_bias_correction_kl)")
    m = inputs["mask"]
    lp, old, ref, ent = _canon(inputs, "logprobs", "old_logprobs", "ref_logprobs", "entropy")
    adv = _adv(inputs)
    _check_advantages(fid, adv)
    kw = dict(eps_low=P("eps_low"), eps_high=P("eps_high"), beta=float(P("beta")), trainer_cls=_trainer_cls())
    if P("entropy_quantile") is not None:
        kw["top_entropy_quantile"] = P("entropy_quantile")
    loss = compute_loss(make_stub(loss_type="grpo", **kw), logprobs=lp, mask=m, advantages=adv, old_logprobs=old,
                        ref_logprobs=ref, entropy=ent)
    if kw["beta"] != 0 or P("entropy_quantile") is not None:
        # ``terms`` (optional) is left out: TRL adds the KL as a sequence mean and puts the entropy mask inside the
        # geometric mean, so there is no per-token read-out of what it computes
        return {"loss": loss}
    # terms: the sequence loss broadcast to its tokens, read by calling TRL on one row at a time (B = 1)
    # (a value read-out, not this case's gradient: the call sees no cotangent, ones)
    with cotangent_context(None):
        seq = surrogate_gmpo(dict(inputs, logprobs=inputs["logprobs"].detach().requires_grad_(True)),
                             {k: v for k, v in params.items() if k in ("eps_low", "eps_high")})["loss"]
    terms = torch.where(m, seq.to(lp.dtype).unsqueeze(-1).expand(m.shape), torch.zeros((), dtype=lp.dtype))
    return {"loss": loss, "terms": terms}


IMPLEMENTATIONS = {"surrogate.gmpo": surrogate_gmpo, "loss.gmpo": loss_gmpo}
PARAM_MAP = {
    "surrogate.gmpo": {"eps_low": "epsilon (log space, GMPOConfig default 0.4)",
                       "eps_high": "epsilon_high (log space; None -> epsilon)",
                       "(trainer)": "trl.experimental.gmpo.GMPOTrainer"},
    "loss.gmpo": {"eps_low": "epsilon (log space)", "eps_high": "epsilon_high (log space)", "beta": "beta",
                  "kl_estimator": "k3 only", "entropy_quantile": "top_entropy_quantile (inside the geometric mean)",
                  "is_level/opsm_delta": "(none: must be off)", "(trainer)": "trl.experimental.gmpo.GMPOTrainer"},
}
