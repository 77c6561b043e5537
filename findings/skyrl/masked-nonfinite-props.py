"""skyrl-train: a NaN or inf at a padded position makes `masked_mean` / `reduce_loss` NaN. (the property rows)

The property rows of SkyRL's masked-position rules: their examples hold NaN/inf at masked positions,
which reach the result through the same x * mask products; this script reproduces them through
reduce_loss / masked_mean.

Framework: skyrl-train 0.3.1 (PyPI; byte-identical to NovaSky-AI/SkyRL ce6def0e), skyrl_train/utils/ppo_utils.py
`masked_mean`, used by `reduce_loss` for every loss_reduction:
Source: https://github.com/NovaSky-AI/SkyRL/blob/ce6def0e8f996eb823de4f10d1c0d1528c9a2f6b/skyrl-train/skyrl_train/utils/ppo_utils.py#L85-L88
Spec: `agg.token_mean` (pgspec spec/agg.md#agg.token_mean): T(q) = sum_{i,t} m_{i,t} q_{i,t} / N_tok, and
`agg.sample_mean` (spec/agg.md#agg.sample_mean): S(q) = (1/N) sum_i (sum_t m_{i,t} q_{i,t}) / L_i; masked
positions are excluded, never multiplied by 0.
Input: q = [[1, NaN, inf]], mask = [[1, 0, 0]] (one real token; the padded positions hold junk).
Expected: 1.0 for reduce_loss "token_mean" and "sequence_mean". Got: NaN for both
(`(tensor * mask).sum(...)`: NaN * 0 = NaN).
Fix: `return torch.where(mask.bool(), tensor, 0).sum(axis=dim) / mask.sum(axis=dim).clamp(min=1.0)` in masked_mean.
pgspec rule: adapters/skyrl/deviations.toml, cause masked-nonfinite (agg.*, loss.*/masked-nan-inf).

Run: python findings/skyrl/masked-nonfinite-props.py  (skyrl-train and torch installed). Exit 0: the bug reproduces; 1: fixed;
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

    ppo, _ = skyrl()
    q = torch.tensor([[1.0, float("nan"), float("inf")]])
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    # expected, from the spec in float64: masked positions selected out
    m = mask.bool()
    expected = (q.double()[m].sum() / m.sum()).item()  # token mean; one sequence, so also the sample mean
    got = {red: ppo.reduce_loss(q, mask, red).item() for red in ("token_mean", "sequence_mean")}
    what = (f"skyrl-train {version()} reduce_loss with NaN/inf at a padded position (expected {expected:g}; got "
            + ", ".join(f"{k} {v:g}" for k, v in got.items()) + ")")
    if all(abs(v - expected) <= 1e-6 for v in got.values()):
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
