"""OAT PPOLearner: what a padded position holds changes the Dr. GRPO loss (-inf there gives NaN)

Framework: oat-llm 0.2.4, PPOLearner.learning_step with critic_type "drgrpo" (the aggregator
masked_sum(..., constant_normalizer=generate_max_length)); the same with "grpo" (masked_mean); torch 2.13.0.
Spec: loss.dr_grpo, spec/loss.md#loss.dr_grpo, and the invariance the properties prop.padding and
prop.permutation check (spec/properties.md: masked positions, whatever they hold, NaN and +-inf included,
change neither the loss nor the gradient, and their gradient is exactly 0):
    L = (1/(K N)) sum_{i,t} m_{i,t} max(-A_i r_{i,t}, -A_i clip(r_{i,t}, 1 - eps, 1 + eps)),  r = e^(l - l_old).
Input: on policy (the stand-in model gives the same log-probs in the no-grad and the training pass), a batch of
two responses of 1 and 2 tokens with log-prob -1, so the first is padded to the batch width with one masked
position; A = (1, 1), cliprange 0.2, beta 0, generate_max_length K = 4. The padded position holds -1 (a finite
filler), then -inf (e.g. the log-prob of a pad token the model gives probability 0).
Expected: the same for both fillers: loss -3 / (4 * 2) = -0.375, gradient -1/8 at each of the three tokens
and 0 at the padded position.
Got: with the -inf filler, loss NaN and a NaN gradient at the padded position: the ratio there is
exp(-inf - (-inf)) = exp(NaN), and masked_sum's (values * mask).sum(...) keeps the NaN (NaN * 0 = NaN). The
same root cause as findings/oat/masked-nonfinite.py, as pgspec's property rows show (their examples hold
NaN/inf at masked positions): prop.permutation of loss.grpo and loss.dr_grpo (loss NaN), prop.padding,
prop.on_policy and prop.permutation of the per-token policy term pg_loss_max (gradient NaN at a masked
position). Columns that are padding in every row of a micro-batch never reach the loss (learning_step cuts
them, "Remove unnecessary padding"); a response padded to a longer one's width does, as here.
Fix: select instead of multiplying: torch.where(mask.bool(), values, 0).sum(...) in masked_sum and
masked_mean, and logprobs_diff = torch.where(mb_response_masks, new_logps - mb_logps, 0) before the
exponential in learning_step.
Source: https://github.com/sail-sg/oat/blob/c1a074c320ff5ca9fe9a4f669bf05208e2f310be/oat/utils/ops.py#L26-L46
(and oat/algorithms/ppo.py#L529-L568 at the same commit; sail-sg/oat has no v0.2.4 tag, and the 0.2.4 wheel's
ppo.py and ops.py are byte-identical to this commit's).

Run: python findings/oat/masked-nonfinite-props.py  (in an environment with oat-llm 0.2.4 and torch; oat-llm
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
    K = 4
    got = {}
    for label, filler in (("filler -1", -1.0), ("filler -inf", float("-inf"))):
        logps = torch.tensor([[-1.0, filler], [-1.0, -1.0]], requires_grad=True)
        loss = learner_loss(ppo, ops, "drgrpo", [1, 2], logps, logps.detach(), torch.tensor([1.0, 1.0]),
                            generate_max_length=K)
        loss.backward()
        got[label] = (loss.item(), logps.grad.tolist())
    # the spec in plain float64, reading the valid tokens only: the sum of the terms over K N
    f64 = torch.float64
    lv = torch.full((3,), -1.0, dtype=f64, requires_grad=True)        # (0,0), (1,0), (1,1)
    r = torch.exp(lv - lv.detach())
    spec = torch.max(-r, -r.clamp(0.8, 1.2)).sum() / (K * 2)           # A = 1
    spec.backward()
    expected = spec.item()
    g = lv.grad.tolist()
    exp_grad = [[g[0], 0.0], [g[1], g[2]]]
    ok = all(abs(v - expected) <= 1e-6 and all(abs(a - b) <= 1e-6 for ra, rb in zip(gr, exp_grad) for a, b in zip(ra, rb))
             for v, gr in got.values())
    fmt = lambda m: "[" + ", ".join("[" + ", ".join(f"{x:.6g}" for x in row) + "]" for row in m) + "]"  # noqa: E731
    shown = "; ".join(f"{k}: loss {v:.8g}, grad {fmt(gr)}" for k, (v, gr) in got.items())
    return (not ok, f"oat-llm {version} learning_step (drgrpo): a padded position holding -inf instead of -1",
            f"loss {expected:.8g}, grad {fmt(exp_grad)} for both", shown)


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
