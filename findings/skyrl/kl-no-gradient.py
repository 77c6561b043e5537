"""skyrl-train: `compute_approx_kl` runs under @torch.no_grad(), so the KL estimate has no gradient (SkyRL #1340).

Framework: skyrl-train 0.3.1 (PyPI; byte-identical to NovaSky-AI/SkyRL ce6def0e), skyrl_train/utils/ppo_utils.py
`compute_approx_kl`:
Source: https://github.com/NovaSky-AI/SkyRL/blob/ce6def0e8f996eb823de4f10d1c0d1528c9a2f6b/skyrl-train/skyrl_train/utils/ppo_utils.py#L91-L92
Known upstream: SkyRL #1340, fixed by #1353 after 0.3.1 (this script then prints FIXED).
Spec: `kl.k3` (pgspec spec/kl.md#kl.k3): y = e^x - x - 1 with x = l_ref - l (clamped to [-20, 20], y to
[-10, 10]), dy/dl = 1 - e^x; likewise k1 (dy/dl = 1), k2 (l - l_ref) and abs (sign(l - l_ref)).
Input: logprobs = [[-1, -2]] (requires grad), ref_logprobs = [[-1.5, -1]], estimator "k3" (SkyRL's default).
Expected: kl (0.1065307, 0.7182818), gradient (0.3934693, -1.7182818).
Got: the right values and no autograd graph (the result does not require grad; gradient 0): with
use_kl_loss=true (the default) the worker adds this as the KL loss, a constant, so the KL penalty never acts.
Fix: remove the `@torch.no_grad()` decorator from compute_approx_kl (what #1353 does).
pgspec rule: adapters/skyrl/deviations.toml, cause missing-gradient (kl.*).

Run: python findings/skyrl/kl-no-gradient.py  (skyrl-train and torch installed). Exit 0: the bug reproduces; 1: fixed;
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
    ref = torch.tensor([[-1.5, -1.0]])
    # expected, from the spec in float64: k3(x) = e^x - x - 1, x = l_ref - l
    lp64 = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    x = ref.double() - lp64
    k3 = torch.exp(x) - x - 1
    k3.sum().backward()
    exp_kl, exp_grad = k3.detach()[0].tolist(), lp64.grad[0].tolist()
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    kl = ppo.compute_approx_kl(lp, ref, kl_estimator_type="k3")
    if kl.requires_grad:
        kl.sum().backward()
        got_grad = lp.grad[0].tolist()
    else:
        got_grad = [0.0, 0.0]  # no graph: the KL contributes nothing to any gradient
    got_kl = kl.detach()[0].tolist()
    what = (f"skyrl-train {version()} compute_approx_kl('k3') gradient (expected kl {[round(v, 7) for v in exp_kl]}, "
            f"gradient {[round(v, 7) for v in exp_grad]}; got kl {[round(v, 7) for v in got_kl]}, "
            f"requires_grad={kl.requires_grad}, gradient {[round(v, 7) for v in got_grad]})")
    if all(abs(a - b) <= 1e-5 for a, b in zip(got_grad + got_kl, exp_grad + exp_kl)):
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
