"""AReaL: padding changes the gradient: on policy, a padded position holding -inf gives a NaN gradient.

Framework: AReaL 1.0.4 (PyPI; byte-identical to commit a0f3dca2), areal/utils/functional/functional.py
`ppo_actor_loss_fn` (importance_sampling_level="token"):
Source: https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/utils/functional/functional.py#L509
Spec: the padding property (pgspec spec/properties.md, prop.padding) of `surrogate.ppo_clip`
(spec/surrogate.md#surrogate.ppo_clip), L = -min(r A, clip(r, 1 - eps, 1 + eps) A), r = exp(l - l_old):
appending masked positions, whatever they hold, changes neither the loss nor the gradient of the real
tokens, and the appended positions get gradient exactly 0. Same root cause as
findings/areal/ratio-masked-nonfinite.py, seen as the property rows prop.padding / prop.permutation /
prop.on_policy of surrogate.*, loss.* and kl.* fail it (every example of those properties holds NaN/inf in
its padding).
Input: on policy (logprobs = proximal = old), one real token l = -1, A = 1, eps_clip 0.2, unpadded
([[-1]]) and padded with one masked position whose log-probs are -inf ([[-1, -inf]], loss_mask [[True, False]]).
Expected: loss -1 and gradient (-1) unpadded; the same loss and gradient (-1, 0) padded.
Got: padded gradient (-1, NaN): exp(-inf - (-inf)) = exp(NaN) is taken before torch.where selects it out,
and its backward multiplies the zero cotangent by NaN.
Fix: select before the exponential: `ratio = torch.exp(torch.where(loss_mask, logprobs - proximal_logprobs, 0))`.
pgspec rule: adapters/areal/deviations.toml, cause masked-nonfinite (prop.on_policy / prop.padding /
prop.permutation of surrogate.*, loss.*, kl.*).

Run: python findings/areal/masked-nonfinite-props.py  (AReaL and torch installed; importing areal takes 5-40 s, its __init__
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
    from areal.utils.functional import ppo_actor_loss_fn

    eps = 0.2
    results = {}
    for label, lp0, mask in (("unpadded", [[-1.0]], [[True]]), ("padded", [[-1.0, float("-inf")]], [[True, False]])):
        lp = torch.tensor(lp0, requires_grad=True)
        old = torch.tensor(lp0)
        adv = torch.ones_like(old)
        loss, _ = ppo_actor_loss_fn(logprobs=lp, proximal_logprobs=old, old_logprobs=old, advantages=adv,
                                    eps_clip=eps, loss_mask=torch.tensor(mask))
        loss.backward()
        results[label] = (loss.item(), lp.grad[0].tolist())
    # expected, from the spec in float64: on policy r = 1, loss -A = -1, gradient -A r / N = -1; padding: 0
    lp64 = torch.tensor([-1.0], dtype=torch.float64, requires_grad=True)
    r = torch.exp(lp64 - lp64.detach())
    expected = (-torch.min(r, r.clamp(1 - eps, 1 + eps))).mean()
    expected.backward()
    exp_loss, exp_grad = expected.item(), lp64.grad.tolist()
    want = {"unpadded": (exp_loss, exp_grad), "padded": (exp_loss, exp_grad + [0.0])}
    shown = "; ".join(f"{k}: loss {v[0]:g}, gradient {[round(g, 6) for g in v[1]]}" for k, v in results.items())
    what = (f"AReaL {version()} ppo_actor_loss_fn on policy, padded with -inf log-probs (expected loss {exp_loss:g}, "
            f"gradient {[round(g, 6) for g in exp_grad]} plus 0 at the padding; got {shown})")
    ok = all(abs(results[k][0] - want[k][0]) <= 1e-6 and all(abs(a - b) <= 1e-6 for a, b in zip(results[k][1], want[k][1]))
             for k in want)
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
