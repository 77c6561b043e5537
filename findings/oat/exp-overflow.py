"""OAT PPOLearner: NaN gradient when the log-ratio overflows exp on the clipped side (float32)

Framework: oat-llm 0.2.4, PPOLearner.learning_step (critic_type "grpo", "drgrpo" and "ppo": the policy term
pg_loss_max); torch 2.13.0.
Spec: surrogate.ppo_clip, spec/surrogate.md#surrogate.ppo_clip (here through loss.grpo, spec/loss.md#loss.grpo):
    term = max(-A r, -A clip(r, 1 - eps, 1 + eps)),  r = e^(l - l_old);
    d term / d l = -A r where the unclipped branch is active, else 0.
Input: one response of one token, A = 1, cliprange 0.2, beta 0, tis_c None, critic_type "grpo"; the stand-in
model gives l_old = -200 in learning_step's no-grad pass and l = 0 in its training pass (a log-ratio of 200: a
stale or mis-scored old log-prob, or a policy that moved far between the passes). OAT's log-probs are float32
(get_batch_logps returns logits.float() log-probs), so this is OAT's own precision.
Expected: loss -1.2 (r is far beyond 1 + eps: the clipped branch is active) and gradient 0.
Got: loss -1.2 but gradient NaN. ratio = torch.exp(logprobs_diff) is inf in float32, and autograd multiplies the
inactive branch's zero cotangent by exp's derivative inf: 0 * inf = NaN, which then reaches every parameter.
(The KL term of the same function clamps its log-ratio to [-40, 40]; the ratio has no clamp.)
Fix: clamp the log-ratio before exp, as verl and OpenRLHF do: ratio = torch.exp(logprobs_diff.clamp(max=20.0))
(any bound below log(float32 max) = 88.7 keeps the clipped branch exact).
Source: https://github.com/sail-sg/oat/blob/c1a074c320ff5ca9fe9a4f669bf05208e2f310be/oat/algorithms/ppo.py#L529-L535
(sail-sg/oat has no v0.2.4 tag; the 0.2.4 wheel's ppo.py is byte-identical to this commit's).

Run: python findings/oat/exp-overflow.py  (in an environment with oat-llm 0.2.4 and torch; oat-llm
installed with --no-deps plus tyro, tqdm and numpy is enough, as pgspec's ci/install-oat.sh does).
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once OAT agrees with the
spec; 2 when it cannot run (findings/README.md).
The script runs OAT's own learning_step from the installed wheel. oat.algorithms.ppo imports vLLM, DeepSpeed,
launchpad and datasets at import time, none of which the loss uses, so it executes the wheel's files with
stand-ins (written inline below), registered only where the real module cannot be imported: package shells
for oat, oat.utils and oat.algorithms (their __init__ files import the actor and learner stacks); deepspeed
(deepspeed.zero.GatheredParameters, for the fused-LM-head branch of get_batch_logps, replaced here); tree
(dm-tree, used outside learning_step); oat.actors, oat.actors.base, oat.learners (empty base classes:
RewardActor, ActorBase, RLLearner, OfflineLearner); oat.utils.data (dataset helpers used by _init only).
The learner is made with object.__new__(PPOLearner) and given args (a real PPOArgs), the aggregator that
PPOLearner._init assigns, a stand-in model forward (get_batch_logps returns the given log-probs, as float32,
as OAT's returns them), the given advantages, and a strategy whose backward() records the loss.
"""
import importlib
import importlib.machinery
import sys
import types
from pathlib import Path

try:
    import numpy as np
    import torch
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import torch/numpy: {type(e).__name__}: {e}")
    sys.exit(2)


def _module(name, path=None, **attrs):
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__path__ = [str(path)] if path else []
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    if path:
        mod.__spec__.submodule_search_locations = [str(path)]
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def _unused(what):
    def fn(*a, **k):
        raise RuntimeError(f"the stand-in for {what} was called: learning_step was not expected to use it")
    return fn


def load_oat():
    """(oat.algorithms.ppo, oat.utils.ops) executed from the installed oat-llm, with the stand-ins above."""
    from importlib import metadata

    try:
        version = metadata.version("oat-llm")
    except metadata.PackageNotFoundError:
        raise RuntimeError("oat-llm is not installed in this interpreter (pgspec's ci/install-oat.sh installs it: pip "
                           "install --no-deps --ignore-requires-python oat-llm==0.2.4, then tyro, tqdm and numpy)") from None
    root = Path(metadata.distribution("oat-llm").locate_file("oat"))
    for name, path in (("oat", root), ("oat.utils", root / "utils"), ("oat.algorithms", root / "algorithms")):
        if name not in sys.modules:
            _module(name, path)
    stand_ins = {
        "deepspeed": dict(zero=types.SimpleNamespace(GatheredParameters=_unused("deepspeed.zero.GatheredParameters"))),
        "tree": dict(flatten=_unused("tree.flatten"), map_structure=_unused("tree.map_structure")),
        "oat.actors": dict(RewardActor=type("RewardActor", (), {})),
        "oat.actors.base": dict(ActorBase=type("ActorBase", (), {})),
        "oat.learners": dict(RLLearner=type("RLLearner", (), {}), OfflineLearner=type("OfflineLearner", (), {})),
        "oat.utils.data": dict(TransitionDataset=type("TransitionDataset", (), {}), get_datasets=_unused("get_datasets"),
                               load_data_from_disk_or_hf=_unused("load_data_from_disk_or_hf"),
                               shard_buffer=_unused("shard_buffer")),
    }
    for name, attrs in stand_ins.items():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - not installed (or its own imports fail): the stand-in
            _module(name, **attrs)
    return version, importlib.import_module("oat.algorithms.ppo"), importlib.import_module("oat.utils.ops")


def learner_loss(ppo, ops, critic_type, lengths, logps, old_logps, advantages, cliprange=0.2, generate_max_length=512):
    """The loss PPOLearner.learning_step hands to strategy.backward, for responses of the given lengths (one
    prompt token each): logps/old_logps [B, T] are what the stand-in model forward returns in the training
    pass and in the no-grad pass."""
    B, T = logps.shape
    learner = object.__new__(ppo.PPOLearner)
    learner.args = ppo.PPOArgs(critic_type=critic_type, num_ppo_epochs=1, kl_penalty_coef=0.0, reward_scale=1.0,
                               whiten_adv=False, reinforce_update=False, cliprange=cliprange, beta=0.0, tis_c=None,
                               generate_max_length=generate_max_length, train_batch_size_per_device=B, num_samples=B)
    learner.model, learner.ref_model, learner.optimizer, learner.scheduler = object(), None, None, None
    losses = []
    learner.strategy = types.SimpleNamespace(backward=lambda loss, model, opt: losses.append(loss),
                                             optimizer_step=lambda *a, **k: None, grad_acc_step=1,
                                             get_gradient_norm=lambda model: 0.0)
    # the assignment of PPOLearner._init
    learner.masked_aggregator = (ops.masked_mean if critic_type == "grpo" else
                                 lambda v, m, axis=None: ops.masked_sum(v, m, axis=axis,
                                                                        constant_normalizer=generate_max_length))

    def get_batch_logps(model, input_ids, att_mask, temperature=1.0, compute_entropy=False):
        rows = input_ids[:, 0].long()           # the stand-in's tokens of row i are all i
        out = (logps if compute_entropy else old_logps)[rows, : input_ids.shape[1] - 1].float()
        return out, (torch.zeros_like(out) if compute_entropy else None)

    learner.get_batch_logps = get_batch_logps
    learner.compute_monte_carlo_advantages = lambda rewards, response_masks: advantages
    att = torch.zeros(B, T + 1, dtype=torch.long)
    for i, n in enumerate(lengths):
        att[i, : 1 + n] = 1                      # one prompt token, then the response
    trajectory = {"input_ids": torch.arange(B).unsqueeze(1).expand(B, T + 1).clone(), "attention_mask": att,
                  "rewards": [[0.0]] * B, "prompt_ids_lens": [1] * B, "loss_masks": [1.0] * B,
                  "action_logprobs": [old_logps[i, :n].tolist() for i, n in enumerate(lengths)]}
    saved = torch.cuda.current_device
    torch.cuda.current_device = lambda: "cpu"    # learning_step's first line
    np.random.seed(0)                            # it permutes the rows
    try:
        learner.learning_step(trajectory)
    finally:
        torch.cuda.current_device = saved
    if len(losses) != 1:
        raise RuntimeError(f"learning_step called strategy.backward {len(losses)} times, expected once")
    return losses[0]


def check():
    version, ppo, ops = load_oat()
    logps = torch.tensor([[0.0]], requires_grad=True)
    loss = learner_loss(ppo, ops, "grpo", [1], logps, torch.tensor([[-200.0]]), torch.tensor([1.0]))
    loss.backward()
    got, grad = loss.item(), logps.grad.item()
    # the spec in plain float64: r = e^200 > 1.2 with A > 0, so the clipped branch -A (1 + eps) is active
    lv = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    r = torch.exp(lv - (-200.0))
    spec = torch.max(-1.0 * r, -1.0 * r.clamp(0.8, 1.2))
    spec.backward()
    expected, exp_grad = spec.item(), lv.grad.item()                   # -1.2, 0
    ok = abs(got - expected) <= 1e-6 and abs(grad - exp_grad) <= 1e-6
    return (not ok, f"oat-llm {version} learning_step (grpo): float32 ppo-clip gradient at log-ratio 200 (clipped side)",
            f"loss {expected:.6g}, grad {exp_grad:g}", f"loss {got:.6g}, grad {grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
