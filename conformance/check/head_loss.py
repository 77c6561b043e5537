"""`pgspec check --formula loss.grpo --vocab V`: a token loss from hidden states and an LM head.

The losses ``FORMULAS`` (GRPO, BNPO, Dr.GRPO, DAPO and CISPO with the batch-pooled token mean, and the
sequence-level GSPO and LUSPO, SAPO, and VESPO, with ``--sampler`` the sampler's log-probs it folds into
phi), with or without their KL term (beta > 0: any estimator, clamps and aggregation), their IS weight,
OPSM and entropy mask off.  A fused linear loss (Liger's ``LigerFusedLinearGRPOLoss``,
whose ``loss_type`` picks the loss) takes the hidden states X [B, T, H] and
the LM head W [V, H], computes the token log-probs l = log softmax(X W^T)_y chunk by chunk, and the
loss on them, and returns the gradient with respect to X: the log-prob step and the loss arithmetic
in one call.  The check feeds the linear head of exact logits of check_logprob.py and the loss's
other inputs:

- advantages per sequence as ``check.seeded_inputs`` draws them for the loss (the same seed);
- old log-probs around the policy's: old = fp32(l - rho) at unmasked positions (0 elsewhere), l the
  oracle's float64 log-probs and rho, the log-ratio, drawn by ``check.draw_log_ratios`` (for CISPO
  about where it truncates its weight, ``draws.clip_kinks``): with equal
  chance from a band of width 0.1 at 0.25 to 0.35 below log(1 - eps_low), one around the middle of
  the clip range (narrowed to keep 0.15 from either end, or its midpoint), and one at 0.25 to 0.35
  above log(1 + eps_high) (with a log-ratio clamp c, away from +-c too; see draws.py for narrow or
  one-sided clip ranges).  So a third of the tokens is clipped on either side and a third is not, and
  no ratio lies near a kink of the clip: a kernel's error in l (a few hundredths in bfloat16, whose
  logits are rounded) cannot flip a branch, which no tolerance could judge.  A sequence-level loss
  (GSPO, LUSPO at ratio_level 'sequence') has each row's mean log-ratio so placed instead
  (``check.old_logprobs_per_sequence``), SAPO's smooth gate a wide spread of ratios
  (``check.old_logprobs_spread``), VESPO's row sums spread (``check.old_logprobs_row_sums``), each as
  the check without --vocab draws them around the input l; with ``--sampler``, VESPO's sampler
  log-probs so that each row's total log-ratio to them is spread (``check.sampler_logprobs_for_vespo``),
  passed as the old log-probs are.  Old log-probs and
  advantages reach the adapter in float32 in a bfloat16 or float16 run (as training frameworks keep
  them), in the run's dtype otherwise: exact in every case;
- with the KL term, reference log-probs l_ref = l + x, x drawn by ``check.ref_logprobs_spread`` around
  the oracle's l (off the KL clamps' kinks by 0.15 or more, after the old log-probs: k3_unbiased's
  kinks move with its ratio), rounded to bfloat16 and passed as the old log-probs are.

The oracle is the composite l -> the loss (with its KL term where beta > 0) in float64: the log-probs,
E(l), the gradient of l with respect to X and its scales come from ``check_logprob.oracle_chunks``;
the loss and dloss/dl from the built-in torch backend on l; the loss's scales follow the
reference's nodes as ``check.oracle_scales`` does for the loss (``terms.ppo_terms`` or
``terms.cispo_terms``, ``terms.gspo_terms``, ``terms.sapo_terms``, ``terms.kl_penalty_terms`` and
``scales.aggregate_scales``), with two changes that make l an inner node of one graph instead of an
exact input (``oracle_scales(El=..., split=True)``):

- forward: each token's term node adds |dx/dl| E(l) to its error (E(n) = rounding(n) + sum over
  operands |dn/dp| E(p), reference ``_ad``), so E(l) reaches E(loss) and the relative errors of the
  scale pass (CISPO's weight sg[w] is computed from l's value, a constant, in the reference: it
  carries no E(l), nor does VESPO's phi, computed from l's value); GSPO's mean log-ratio node adds sum_t E(l_t) / L by its edges of 1/L, SAPO's
  d = l - l_old E(l) by its edge of +1; the KL term's x = l_ref - l adds E(l) by its edge of -1, and k3_unbiased's fused
  node E(l) times its slope; with l inexact, no KL value but 0 or a clamp's bound is exact;
- backward: the scale pass reaches l with (A_l, C_l), the sum over paths of |local derivatives|
  and the accumulated error of evaluating them.  From there on the pass is linear in that pair, and
  a C-only seed travels as the path sum (the edges below l are +-1 or the products' constant
  factors W, whose step is c + a rel = c when a = 0), so S(dloss/dX_t) = A_l S1(X_t) + C_l P(X_t),
  with S1 the scale of the log-prob's own gradient (seed (1, 0)) and P its path sum.

Memory: the log-prob step's [n, V] temporaries are chunked over the positions (check_logprob.py); the
composite keeps, for the loss's pass over the whole batch, three float64 [B T, H] arrays (the gradient of
l with respect to X, its scale and its path sum): 24 B T H bytes, three times the hidden states in float64.

``tests/test_check_head_loss.py`` checks the values and every scale against ``reference._ad`` run on
the same composite (log_softmax_at of the head's logits into the reference's loss, its KL term included).
"""

from __future__ import annotations

import numpy as np

from pgspec.adapters.base import HEAD_LOSS_FORMULAS as FORMULAS  # noqa: E402 - the head protocol's losses

HEAD_PROTOCOL = """adapter.heads[formula](hidden [B,T,H], weight [V,H], targets [B,T] int64, mask [B,T] bool,
old_logprobs [B,T], advantages [B], params[, ref_logprobs=[B,T]][, sampler_logprobs=[B,T]])
-> {"loss": scalar, "grad": {"hidden": [B,T,H]}}:
the loss (one of loss.grpo, loss.bnpo, loss.dr_grpo, loss.dapo, loss.cispo, loss.gspo, loss.luspo, loss.sapo,
loss.vespo) on the log-probs log softmax(hidden weight^T)_targets (temperature 1), the gradient that of the loss;
hidden and weight in the run's dtype, old_logprobs, advantages, ref_logprobs and sampler_logprobs in float32 in a bfloat16 or float16 run, else in the run's dtype;
params are the formula's (IS weight, OPSM and entropy mask off; loss.dapo's and loss.cispo's aggregation token_mean);
ref_logprobs, the KL term's reference log-probs, is passed where params' beta > 0, and only then;
sampler_logprobs, the sampler's log-probs that loss.vespo folds into phi, is passed with --sampler, and only then."""


def takes_keyword(head, name: str) -> bool:
    """Whether ``head`` takes the keyword ``name``: ref_logprobs (a head without it has no KL term to
    check), sampler_logprobs (none to fold into VESPO's phi)."""
    import inspect

    try:
        ps = inspect.signature(head).parameters.values()
    except (TypeError, ValueError):
        return True         # not introspectable: called, and judged on what it does
    return any(q.kind == q.VAR_KEYWORD or (q.name == name and q.kind != q.POSITIONAL_ONLY) for q in ps)


def side_dtype(dtype: str) -> str:
    """The dtype of the old log-probs and advantages in a run of ``dtype``."""
    return "float32" if dtype in ("bfloat16", "float16") else dtype


def old_logprobs_for(formula: str, lp: np.ndarray, mask: np.ndarray, adv: np.ndarray, seed: int, params: dict):
    """The old log-probs of a check of ``formula`` around the oracle's log-probs ``lp`` (float64 arrays,
    exact in float32), as ``check.old_logprobs_for`` draws them, per token rounded to float32
    (``old_logprobs``)."""
    from . import draws

    return draws.old_logprobs_for(formula, lp, mask, adv, seed, params,
                                  per_token=lambda l, m, s, p: old_logprobs(l, m, s, *draws.clip_kinks(p)))


def old_logprobs(lp: np.ndarray, mask: np.ndarray, seed: int, eps_low: float, eps_high: float,
                 clamp=None) -> np.ndarray:
    """fp32(l - rho) where the mask holds, 0 elsewhere (float64 array, exact in float32): rho from the
    bands of ``check.draw_log_ratios`` around the clip's log-bounds log(1 - eps_low), log(1 + eps_high)
    (and away from +-clamp, the log-ratio clamp)."""
    from .draws import draw_log_ratios

    rho = draw_log_ratios(lp.shape, seed, eps_low, eps_high, clamp)
    return np.where(mask, lp - rho, 0.0).astype(np.float32).astype(np.float64)


def loss_oracle(formula, lp, El, old, adv, mask, params: dict, chunk: int = 8, ref=None, sampler=None):
    """(loss, dloss/dl [B, T], E(loss), A_l [B, T], C_l [B, T]) of ``formula`` on float64 log-probs
    ``lp`` [B, T] with forward errors ``El`` [B, T] (tensors on one device; ``ref``: the KL term's
    reference log-probs, where beta > 0; ``sampler``: the sampler's log-probs VESPO folds into phi)."""
    from ..judge import compare
    from ..run import runner
    from .scales import oracle_scales

    torch_adapter = runner.load_adapter("torch")
    l = lp.detach().clone().requires_grad_(True)
    tensors = {"logprobs": l, "old_logprobs": old, "advantages": adv, "mask": mask,
               **({} if ref is None else {"ref_logprobs": ref}), **({} if sampler is None else {"sampler_logprobs": sampler})}
    out, grads = compare.call(torch_adapter, formula, tensors, params)
    sc = oracle_scales(formula, tensors, params, chunk, El=El, split=True)
    S_l, A_l = sc["grad.logprobs"], sc["A.logprobs"]
    return out["loss"].detach(), grads["logprobs"].detach(), sc["loss"], A_l, S_l - A_l


def oracle(arrays: dict, adv, params: dict, device: str = "cpu", seed: int = 0, old=None, ref=None,
           chunk_tokens: int | None = None, chunk: int = 8, formula: str = "loss.grpo", sampler=None):
    """The composite's float64 oracle of ``formula`` on the head ``arrays`` (check_logprob.seeded_head) with
    advantages ``adv`` [B] and old log-probs ``old`` [B, T] (numpy; None: drawn from the oracle's
    log-probs and ``seed`` by ``old_logprobs_for``), ``params`` the formula's (check.oracle_params); with
    beta > 0 the KL term's reference log-probs ``ref`` [B, T] (numpy; None: drawn around the oracle's
    log-probs by ``check.ref_logprobs_spread``); for loss.vespo ``sampler``, the sampler's log-probs it
    folds into phi ([B, T] numpy; True: drawn by ``check.sampler_logprobs_for_vespo``; None: none); positions
    ``chunk_tokens`` at a time for the log-prob step, sequences ``chunk`` at a time for the loss's scales:
    {"loss", "E(loss)", "grad.hidden" [N, H], "S(grad.hidden)" [N, H], "logprobs" [B, T] (the oracle's),
    "old_logprobs" [B, T], "advantages" [B], with beta > 0 "ref_logprobs" [B, T], with ``sampler``
    "sampler_logprobs" [B, T]} (float64 tensors on ``device``; N = B T)."""
    import torch

    from . import logprob as lp

    B, T, H = arrays["hidden"].shape
    N = B * T
    lp_all = torch.zeros(N, dtype=torch.float64, device=device)
    El = torch.zeros_like(lp_all)
    g1 = torch.zeros((N, H), dtype=torch.float64, device=device)
    S1, P1 = torch.zeros_like(g1), torch.zeros_like(g1)
    head_params = {"temperature": 1, "logit_scale": 1, "softcap": None}
    for sl, l_c, E_c, g_c, S_c, P_c in lp.oracle_chunks(arrays, head_params, device, chunk_tokens, paths=True):
        lp_all[sl], El[sl], g1[sl], S1[sl], P1[sl] = l_c, E_c, g_c, S_c, P_c
    mask = torch.as_tensor(arrays["mask"], device=device)
    if old is None:
        old = old_logprobs_for(formula, lp_all.reshape(B, T).cpu().numpy(), arrays["mask"], np.asarray(adv), seed,
                               params)
    old_t = torch.as_tensor(old, dtype=torch.float64, device=device)
    adv_t = torch.as_tensor(adv, dtype=torch.float64, device=device)
    ref_t = None
    if float(params.get("beta") or 0):
        if ref is None:
            from .draws import ref_logprobs_spread

            ref = ref_logprobs_spread(lp_all.reshape(B, T).cpu().numpy(), arrays["mask"], seed, params, old)
        ref_t = torch.as_tensor(ref, dtype=torch.float64, device=device)
    sampler_t = None
    if sampler is not None:
        if sampler is True:
            from .draws import sampler_logprobs_for_vespo

            sampler = sampler_logprobs_for_vespo(lp_all.reshape(B, T).cpu().numpy(), np.asarray(old), arrays["mask"],
                                                 seed)
        sampler_t = torch.as_tensor(sampler, dtype=torch.float64, device=device)
    loss, g, Ev, A_l, C_l = loss_oracle(formula, lp_all.reshape(B, T), El.reshape(B, T), old_t, adv_t, mask, params,
                                        chunk, ref_t, sampler_t)
    with torch.no_grad():
        gX = g1.mul_(g.reshape(N, 1))                                   # dloss/dl_t dl_t/dX_t
        SX = S1.mul_(A_l.reshape(N, 1)).add_(P1.mul_(C_l.reshape(N, 1)))
    return {"loss": loss, "E(loss)": Ev, "grad.hidden": gX, "S(grad.hidden)": SX, "logprobs": lp_all.reshape(B, T),
            "old_logprobs": old_t, "advantages": adv_t, **({} if ref_t is None else {"ref_logprobs": ref_t}),
            **({} if sampler_t is None else {"sampler_logprobs": sampler_t})}
