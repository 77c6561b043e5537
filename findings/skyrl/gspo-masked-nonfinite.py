"""skyrl-train: a NaN log-prob at a padded position makes the GSPO sequence ratio, loss and gradient NaN.

Framework: skyrl-train 0.3.1 (PyPI; byte-identical to NovaSky-AI/SkyRL ce6def0e), skyrl_train/utils/ppo_utils.py
`gspo_policy_loss` (PolicyLossRegistry "gspo"):
Source: https://github.com/NovaSky-AI/SkyRL/blob/ce6def0e8f996eb823de4f10d1c0d1528c9a2f6b/skyrl-train/skyrl_train/utils/ppo_utils.py#L701
Spec: `surrogate.gspo` (pgspec spec/surrogate.md#surrogate.gspo): s_i = exp((1/L_i) sum_t m_{i,t} (l_{i,t} - l_old_{i,t})),
L_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), dL_i/dl_{i,t} = -A_i s_i / L_i unless clipped;
masked positions are excluded, never multiplied by 0.
Input: logprobs = [[-1, NaN]], old_logprobs = [[-1.1, -1]], advantages = [[1, 1]], loss_mask = [[1, 0]],
SkyRL's defaults (eps_clip_low = eps_clip_high = 0.2) with loss_reduction = "sequence_mean".
Expected: s = e^0.1 = 1.10517, loss -1.10517, gradient (-1.10517, 0).
Got: loss NaN and gradient (0, 0): `log_importance_weights = masked_mean(log_ratio, loss_mask, dim=-1)`
is sum(log_ratio * mask) / n, NaN * 0 = NaN, so the whole sequence's ratio is NaN (and the clamp at 10,
whose backward drops NaN inputs, leaves the real token without gradient).
Fix: the masked_mean fix (select, not multiply: `torch.where(mask.bool(), tensor, 0)`) removes this one too
(the padded token's NaN ratio is then selected out and its gradient stopped by the clamp at 10), so it is
the same one-line fix as findings/skyrl/masked-mean-masked-nonfinite.py, at a different call.
pgspec rule: adapters/skyrl/deviations.toml, cause masked-nonfinite (surrogate.gspo/masked-nan-inf).

Run: python findings/skyrl/gspo-masked-nonfinite.py  (skyrl-train and torch installed). Exit 0: the bug reproduces; 1: fixed;
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
    cfg.policy_loss_type, cfg.loss_reduction = "gspo", "sequence_mean"
    eps_low, eps_high = float(cfg.eps_clip_low), float(cfg.eps_clip_high)
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.0]])
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0]])
    # expected, from the spec in float64: the mean log-ratio over the unmasked token only
    lp64 = lp.detach().double().requires_grad_(True)
    m = mask.bool()
    s = torch.exp((lp64[m] - old.double()[m]).mean())
    expected = -torch.min(s * 1.0, s.clamp(1 - eps_low, 1 + eps_high) * 1.0)
    expected.backward()
    exp_grad = lp64.grad[0].tolist()
    loss, _ = ppo.PolicyLossRegistry.get("gspo")(lp, old, adv, cfg, loss_mask=mask)
    loss.backward()
    got, got_grad = loss.item(), lp.grad[0].tolist()
    what = (f"skyrl-train {version()} GSPO with a NaN log-prob at a padded position (expected loss "
            f"{expected.item():.6g}, got {got:.6g}; expected gradient {[round(v, 6) for v in exp_grad]}, got "
            f"{[round(v, 6) for v in got_grad]})")
    if abs(got - expected.item()) <= 1e-6 and all(abs(a - b) <= 1e-6 for a, b in zip(got_grad, exp_grad)):
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
