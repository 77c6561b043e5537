"""AReaL: NaN/inf at a masked position gives a NaN gradient: the ratio exp(l - l_prox) is taken before masking.

Framework: AReaL 1.0.4 (PyPI; the wheel is byte-identical to commit a0f3dca2), areal/utils/functional/functional.py
`ppo_actor_loss_fn` (importance_sampling_level="token") and `sapo_loss_fn`:
Source: https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/utils/functional/functional.py#L509
https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/utils/functional/functional.py#L601
Spec: `surrogate.ppo_clip` (pgspec spec/surrogate.md#surrogate.ppo_clip): L = -min(r A, clip(r, 1 - eps, 1 + eps) A),
r = exp(l - l_old), token mean over the unmasked tokens (`loss.bnpo`, spec/loss.md#loss.bnpo), and
`surrogate.sapo` (spec/surrogate.md#surrogate.sapo); a masked position is not read, so its gradient is exactly 0.
Input: logprobs = [[-1, NaN]], proximal_logprobs = old_logprobs = [[-1.1, -1]], advantages = [[1, 1]],
loss_mask = [[True, False]], eps_clip = 0.2 (SAPO: tau_pos = 1, tau_neg = 1.05).
Expected: gradient (-1.105171, 0) for PPO (r = e^0.1, unclipped); SAPO (-4 s(1 - s) r, 0) with s = sigmoid(r - 1).
Got: the loss is right but the gradient at the masked position is NaN, for both.
`ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)` selects after the exponential,
so the backward multiplies the masked position's zero cotangent by exp(NaN) = NaN; SAPO does not mask the
ratio at all before its sigmoid gate. A NaN/-inf log-prob in the padding (which some engines produce)
poisons the whole parameter gradient although the loss is finite.
Fix: select before the exponential: `ratio = torch.exp(torch.where(loss_mask, logprobs - proximal_logprobs, 0))`
(and the same for SAPO's `log_ratio`).
pgspec rule: adapters/areal/deviations.toml, cause masked-nonfinite (surrogate.*, loss.* on masked NaN/inf).

Run: python findings/areal/ratio-masked-nonfinite.py  (AReaL and torch installed; importing areal takes 5-40 s, its __init__
imports areal.infra). Exit 0: the bug reproduces; 1: fixed; 2: could not run. No stand-in: the functions are
imported from areal as installed (pgspec CI installs areal==1.0.4 with --no-deps plus its import chain on
torch 2.13.0 CPU, ci/install-areal.sh).
"""
import sys


def version():
    from importlib import metadata

    return metadata.version("areal")


def main():
    import torch
    from areal.utils.functional import ppo_actor_loss_fn, sapo_loss_fn

    old = torch.tensor([[-1.1, -1.0]])
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.tensor([[True, False]])
    eps, tau_pos, tau_neg = 0.2, 1.0, 1.05

    def expected(kind):  # the spec in float64, over the unmasked token only (token mean)
        lp64 = torch.tensor([[-1.0, float("nan")]], dtype=torch.float64, requires_grad=True)
        r = torch.exp(lp64[mask] - old.double()[mask])
        a = adv.double()[mask]
        if kind == "ppo":
            loss = -torch.min(r * a, r.clamp(1 - eps, 1 + eps) * a)
        else:
            tau = torch.where(a > 0, torch.tensor(tau_pos, dtype=torch.float64), torch.tensor(tau_neg, dtype=torch.float64))
            loss = -(4 / tau) * torch.sigmoid(tau * (r - 1)) * a
        loss.mean().backward()
        return lp64.grad[0].tolist()

    got = {}
    for kind in ("ppo", "sapo"):
        lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
        if kind == "ppo":
            loss, _ = ppo_actor_loss_fn(logprobs=lp, proximal_logprobs=old, old_logprobs=old, advantages=adv,
                                        eps_clip=eps, loss_mask=mask)
        else:
            loss, _ = sapo_loss_fn(logprobs=lp, old_logprobs=old, advantages=adv, tau_pos=tau_pos, tau_neg=tau_neg,
                                   loss_mask=mask)
        loss.backward()
        got[kind] = (lp.grad[0].tolist(), expected(kind))
    shown = "; ".join(f"{k}: expected {[round(v, 6) for v in e]}, got {[round(v, 6) for v in g]}"
                      for k, (g, e) in got.items())
    what = f"AReaL {version()} gradient with a NaN log-prob at a masked position ({shown})"
    if all(all(abs(a - b) <= 1e-6 for a, b in zip(g, e)) for g, e in got.values()):
        print(f"FIXED: {what}")
        return 1
    print(f"REPRODUCED: {what}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - any failure to run is exit 2, on one line
        print(f"ERROR: {type(e).__name__}: {e}".replace("\n", " "))
        sys.exit(2)
