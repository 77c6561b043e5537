"""skyrl-train: with use_kl_loss=true the GRPO loss's KL term contributes no gradient (SkyRL #1340, at the loss).

Framework: skyrl-train 0.3.1 (PyPI; byte-identical to NovaSky-AI/SkyRL ce6def0e): the actor's loss in
skyrl_train/workers/worker.py L679-L691, `policy_loss + kl_loss_coef * masked_mean(compute_approx_kl(...),
loss_mask, dim=-1).mean()`:
Source: https://github.com/NovaSky-AI/SkyRL/blob/ce6def0e8f996eb823de4f10d1c0d1528c9a2f6b/skyrl-train/skyrl_train/workers/worker.py#L679-L691
The worker itself needs a model and Ray; this script makes the same calls in the same order with SkyRL's
own functions (PolicyLossRegistry.get("regular"), compute_approx_kl, masked_mean), with SkyRL's defaults
(loss_reduction "token_mean", kl_estimator_type "k3") and kl_loss_coef = 0.04.
Spec: `loss.grpo` (pgspec spec/loss.md#loss.grpo) with the k3 KL term:
L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ -min(r A, clip(r) A) + beta k3(l_ref - l) ], k3(x) = e^x - x - 1.
Input: one token, logprobs = old_logprobs = [[-1]] (ratio 1), ref_logprobs = [[-1.5]], advantages = [[1]],
beta = 0.04.
Expected: loss -1 + 0.04 (e^-0.5 + 0.5 - 1) = -0.9957388, gradient -1 + 0.04 (1 - e^-0.5) = -0.9842612.
Got: loss -0.9957388, gradient -1: compute_approx_kl is @torch.no_grad() (#1340), so the KL term is a
constant. Same root cause as findings/skyrl/kl-no-gradient.py, seen where a user meets it (every
loss.* recipe with beta > 0).
Fix: remove the `@torch.no_grad()` decorator from compute_approx_kl (#1353).
pgspec rule: adapters/skyrl/deviations.toml, cause missing-gradient (loss.* with beta > 0).

Run: python findings/skyrl/kl-loss-term-no-gradient.py  (skyrl-train and torch installed). Exit 0: the bug reproduces; 1: fixed;
2: could not run. No stand-in: the functions are imported from skyrl_train as installed; the config
holds ppo_base_config.yaml's defaults (SkyRL reads that file through hydra, which its CI environment lacks).
"""
import sys


def skyrl():
    """skyrl_train.utils.ppo_utils and a trainer.algorithm config holding the defaults of SkyRL's
    skyrl_train/config/ppo_base_config.yaml (0.3.1) for every field the policy losses read."""
    from skyrl_train.utils import ppo_utils

    algorithm = ppo_utils.DictConfig({  # the config type the losses take (omegaconf's, as ppo_utils imports it)
        "policy_loss_type": "regular", "loss_reduction": "token_mean", "eps_clip_low": 0.2, "eps_clip_high": 0.2,
        "clip_ratio_c": 3.0, "use_tis": False, "tis_imp_ratio_cap": -1.0, "kl_estimator_type": "k3",
        "cispo": {"cispo_eps_clip_low": 0, "cispo_eps_clip_high": 5}, "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
        "max_seq_len": None})
    return ppo_utils, algorithm


def version():
    from importlib import metadata

    return metadata.version("skyrl-train")


def main():
    import torch

    ppo, cfg = skyrl()
    beta = 0.04
    eps_low, eps_high = float(cfg.eps_clip_low), float(cfg.eps_clip_high)
    old = torch.tensor([[-1.0]])
    ref = torch.tensor([[-1.5]])
    adv = torch.tensor([[1.0]])
    mask = torch.tensor([[1.0]])
    # expected, from the spec in float64
    lp64 = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    r = torch.exp(lp64 - old.double())
    x = ref.double() - lp64
    expected = (-torch.min(r * 1.0, r.clamp(1 - eps_low, 1 + eps_high) * 1.0) + beta * (torch.exp(x) - x - 1)).mean()
    expected.backward()
    exp_grad = lp64.grad[0, 0].item()
    # worker.py's actor loss (L679-L691), made of SkyRL's own functions
    lp = torch.tensor([[-1.0]], requires_grad=True)
    policy_loss, _ = ppo.PolicyLossRegistry.get(cfg.policy_loss_type)(lp, old, adv, cfg, loss_mask=mask)
    kl_loss = ppo.compute_approx_kl(lp, ref, loss_mask=mask, kl_estimator_type=cfg.kl_estimator_type)
    kl_loss = ppo.masked_mean(kl_loss, mask, dim=-1).mean()
    loss = policy_loss + kl_loss * beta
    loss.backward()
    got, got_grad = loss.item(), lp.grad[0, 0].item()
    what = (f"skyrl-train {version()} GRPO loss with beta=0.04 (k3 KL term) (expected loss {expected.item():.7g}, "
            f"gradient {exp_grad:.7g}; got loss {got:.7g}, gradient {got_grad:.7g})")
    if abs(got - expected.item()) <= 1e-6 and abs(got_grad - exp_grad) <= 1e-6:
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
