"""AReaL: the unclamped ratio overflows in float32 and gives a NaN gradient on the clipped side.

Framework: AReaL 1.0.4 (PyPI; byte-identical to commit a0f3dca2), areal/utils/functional/functional.py
`ppo_actor_loss_fn` (token and sequence/GSPO level) and `sapo_loss_fn`:
Source: https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/utils/functional/functional.py#L509 (token),
https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/utils/functional/functional.py#L136 (GSPO),
https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/utils/functional/functional.py#L601 (SAPO).
Spec: `surrogate.ppo_clip` (pgspec spec/surrogate.md#surrogate.ppo_clip): L = -min(r A, clip(r, 1 - eps, 1 + eps) A),
gradient 0 on the clipped side; `surrogate.gspo` (spec/surrogate.md#surrogate.gspo) likewise with the
sequence ratio; `surrogate.sapo` (spec/surrogate.md#surrogate.sapo): L = -(4/tau) sigmoid(tau (r - 1)) A,
whose gradient vanishes where the gate saturates.
Input (float32): one token, logprobs = [[0]], proximal = old = [[-200]] (log-ratio 200), eps_clip 0.2; A = 1 for
PPO and GSPO, A = -1 for SAPO (tau_neg 1.05).
Expected: loss -1.2 (PPO, GSPO), 3.8095 (SAPO), gradient 0 in each (computed in float64, where e^200 is finite).
Got: the right loss and a NaN gradient in each: exp(200) is inf in float32, and the zero cotangent of the
clipped (or saturated) branch reaches exp's backward as 0 * inf = NaN. Because the loss is finite, nothing
flags the step. verl, OpenRLHF and skyrl-train clamp the log-ratio at +-20 before exp; AReaL has no clamp.
Fix: clamp the log-ratio before the exponential, e.g. `torch.exp((logprobs - proximal_logprobs).clamp(-20, 20))`
(and the same in _compute_sequence_level_ratio_and_advantages and sapo_loss_fn).
pgspec rule: adapters/areal/deviations.toml, cause exp-overflow (surrogate.*, loss.* with a large log-ratio,
float32 and bfloat16).

Run: python findings/areal/exp-overflow.py  (AReaL and torch installed; importing areal takes 5-40 s, its __init__
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

    eps, tau_neg = 0.2, 1.05
    old = torch.tensor([[-200.0]])
    mask = torch.tensor([[True]])

    def expected(kind, a):  # the spec in float64 (e^200 is finite there)
        lp64 = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
        r = torch.exp(lp64 - old.double())
        if kind == "sapo":
            loss = -(4 / tau_neg) * torch.sigmoid(tau_neg * (r - 1)) * a
        else:
            loss = -torch.min(r * a, r.clamp(1 - eps, 1 + eps) * a)
        loss.sum().backward()
        return loss.item(), lp64.grad[0, 0].item()

    rows, ok = [], True
    for kind, a in (("ppo", 1.0), ("gspo", 1.0), ("sapo", -1.0)):
        lp = torch.tensor([[0.0]], requires_grad=True)
        adv = torch.tensor([[a]])
        if kind == "sapo":
            loss, _ = sapo_loss_fn(logprobs=lp, old_logprobs=old, advantages=adv, tau_pos=1.0, tau_neg=tau_neg,
                                   loss_mask=mask)
        else:
            loss, _ = ppo_actor_loss_fn(logprobs=lp, proximal_logprobs=old, old_logprobs=old, advantages=adv,
                                        eps_clip=eps, loss_mask=mask,
                                        importance_sampling_level="sequence" if kind == "gspo" else "token")
        loss.backward()
        got = (loss.item(), lp.grad[0, 0].item())
        want = expected(kind, a)
        ok = ok and all(abs(g - w) <= 1e-5 * max(1.0, abs(w)) for g, w in zip(got, want))
        rows.append(f"{kind}: expected loss {want[0]:.6g} gradient {want[1]:g}, got loss {got[0]:.6g} gradient {got[1]:g}")
    what = f"AReaL {version()} float32 log-ratio 200 on the clipped/saturated side ({'; '.join(rows)})"
    if ok:
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
