"""AReaL: the actor masks the KL's log-probs by a product; a NaN log-prob in the padding makes every advantage NaN.

Framework: AReaL 1.0.4 (PyPI; byte-identical to commit a0f3dca2): `PPOActor._compute_advantages`
(areal/trainer/ppo/actor.py) masks the inputs of `KLEstimator` (areal/utils/data.py) as
`ref_logp *= loss_mask; old_logp *= loss_mask`, so NaN * 0 = NaN stays in the KL:
Source: https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/trainer/ppo/actor.py#L195
https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/utils/data.py#L1650
Spec: `kl.k1` / `kl.k2` / `kl.k3` (pgspec spec/kl.md#kl.k1): the per-token estimate of the unmasked
tokens (k1: y = l - l_ref); a masked position is not read, so nothing non-finite may come out of it (its
gradient is exactly 0).
Input: one sequence of 4 positions, a prompt token and one response token (attention_mask [1, 1, 0, 0],
loss_mask [0, 1, 0, 0]), inference logprobs [0, -1, 0, NaN] (NaN at a padded position), ref_logp
[-1.5, 0, 0, 0], reward 1; PPOActorConfig() defaults (kl_estimator "k1", kl_ctl 0.1, discount = gae_lambda = 1,
no decoupled loss, no normalization).
Expected: KL of the response token -1 - (-1.5) = 0.5, KL reward -0.05, advantage 1 - 0.05 = 0.95; finite KL
rewards everywhere.
Got: KL reward NaN at the padded position and advantage NaN for every position, the response token's
included: the NaN reward enters GAE's delta, and the loop's `lastgaelam * (1 - mask) + newgaelam * mask`
carries it back (NaN * 0 = NaN). pgspec saw it as NaN in `kl.*`'s value and gradient at masked positions.
Fix: select instead of multiplying (actor.py L195-L196): `ref_logp = torch.where(loss_mask.bool(), ref_logp, 0)`
and the same for old_logp.
Stand-in: when `import areal.trainer` fails (its __init__ imports the DPO trainer, which needs `datasets`,
absent from pgspec's CI environment), an empty `areal.trainer` package module pointing at the installed
folder, so that areal/trainer/ppo/actor.py loads unchanged.
pgspec rule: adapters/areal/deviations.toml, cause masked-nonfinite (kl.* on masked NaN/inf).

Run: python findings/areal/kl-masked-nonfinite.py  (AReaL and torch installed; importing areal takes 5-40 s, its __init__
imports areal.infra). Exit 0: the bug reproduces; 1: fixed; 2: could not run.
"""
import sys


def version():
    from importlib import metadata

    return metadata.version("areal")


def ppo_actor():
    try:
        from areal.trainer.ppo.actor import PPOActor
    except ImportError:
        import types

        import areal

        pkg = types.ModuleType("areal.trainer")
        pkg.__path__ = [areal.__path__[0] + "/trainer"]
        sys.modules["areal.trainer"] = pkg
        from areal.trainer.ppo.actor import PPOActor
    from areal.api.cli_args import PPOActorConfig

    return PPOActor, PPOActorConfig


def main():
    import torch

    PPOActor, PPOActorConfig = ppo_actor()
    config = PPOActorConfig()
    log = getattr(sys.modules[PPOActor.__module__], "logger", None)
    if log is not None:
        log.disabled = True  # quiet the configuration log
    actor = PPOActor(config, engine=None)  # _compute_advantages uses the config only
    logprobs = torch.tensor([[0.0, -1.0, 0.0, float("nan")]])  # inference log-prob of token t at position t
    ref = torch.tensor([[-1.5, 0.0, 0.0, 0.0]])  # aligned with the rolled log-probs, as the actor expects
    data = {"input_ids": torch.zeros(1, 4, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 0, 0]]),
            "loss_mask": torch.tensor([[0, 1, 0, 0]]), "logprobs": logprobs.clone(), "ref_logp": ref.clone(),
            "rewards": torch.tensor([1.0])}
    out = actor._compute_advantages(data)
    # expected, from the spec in float64: k1 of the one response token (rolled position 0), then its one-step GAE
    x = torch.tensor(-1.0, dtype=torch.float64) - torch.tensor(-1.5, dtype=torch.float64)
    assert config.kl_estimator == "k1", config.kl_estimator
    exp_kl_reward = -config.kl_ctl * x.item()
    exp_adv = 1.0 + exp_kl_reward  # values 0, one step: advantage = reward + KL reward
    kl_rewards, adv = out["kl_rewards"][0], out["advantages"][0]
    what = (f"AReaL {version()} PPOActor._compute_advantages with a NaN log-prob at a padded position (expected KL "
            f"reward {exp_kl_reward:g} and advantage {exp_adv:g} for the response token, finite KL rewards; got KL "
            f"rewards {[round(v, 6) for v in kl_rewards.tolist()]}, advantage {adv[0].item():g})")
    ok = (torch.isfinite(kl_rewards).all().item() and abs(kl_rewards[0].item() - exp_kl_reward) <= 1e-6
          and abs(adv[0].item() - exp_adv) <= 1e-6)
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
