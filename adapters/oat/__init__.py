"""pgspec adapter for OAT, oat-llm 0.2.4 (see adapters/oat/README.md).

Every value comes out of OAT's own code in the installed oat-llm wheel, loaded by ``loader.py``:

- ``PPOLearner.learning_step`` (``oat/algorithms/ppo.py``), OAT's whole PPO/GRPO/Dr. GRPO actor
  update, run on one micro-batch with a stand-in model: ``loss.grpo`` (``critic_type="grpo"``,
  ``masked_aggregator = masked_mean``) and ``loss.dr_grpo`` (``critic_type="drgrpo"``,
  ``masked_aggregator = partial(masked_sum, constant_normalizer=generate_max_length)``, the
  assignment of ``PPOLearner._init``).  The loss is the tensor the learner hands to
  ``strategy.backward``.  ``surrogate.ppo_clip`` and ``kl.k3`` are the per-token matrices that
  learning_step hands to ``masked_aggregator`` (the policy term ``pg_loss_max`` first, then ``kl3``).
- ``PPOLearner.compute_monte_carlo_advantages``: ``adv.group_normalized`` (``critic_type="grpo"``)
  and ``adv.group_centered`` (``"drgrpo"``).
- ``oat.utils.ops``: ``agg.token_mean`` (``masked_mean``), ``agg.sample_mean`` (``masked_mean(axis=1)``
  then ``.mean()``, the learner's reduction), ``agg.constant`` (``masked_sum(axis=1,
  constant_normalizer=...)`` then ``.mean()``).

The learner object is made with ``object.__new__`` (``PPOLearner._init`` loads models through
DeepSpeed) and given: ``args``, a real ``PPOArgs`` with the case's parameters; ``get_batch_logps``,
a stand-in for the model forward that returns the case's ``old_logprobs`` (the no-grad pass),
``logprobs`` (the training pass) or ``ref_logprobs`` (the reference model), cut to the columns the
learner asks for; ``compute_monte_carlo_advantages``, returning the case's advantages (for the loss
recipes); a ``strategy`` whose ``backward`` records the loss.  The token mask becomes OAT's layout:
one prompt token, then per row ``prompt_ids_lens`` = 1 + the leading masked positions, an attention
mask that is 1 up to the last unmasked token, and the sampler log-probs (``action_logprobs``) at the
response positions.  ``torch.cuda.current_device`` (called first thing by learning_step) is made to
return "cpu" for the duration of a call.
"""

from __future__ import annotations

import functools
import threading
import types
from pathlib import Path

from ..base import Adapter, load_deviations

NAME = "oat"
DIST = "oat-llm"
PINNED = "0.2.4"
# sail-sg/oat has no v0.2.4 tag: the 0.2.4 wheel's oat/algorithms/ppo.py and oat/utils/ops.py are
# byte-identical (git blobs a734b4c5, f0adee13) to those of this commit ("feat: add fp16 training (#70)")
COMMIT = "c1a074c320ff5ca9fe9a4f669bf05208e2f310be"
SRC = f"https://github.com/sail-sg/oat/blob/{COMMIT}/oat/algorithms/ppo.py"

PARAM_MAP = {
    "surrogate.ppo_clip": {"eps_low": "cliprange (symmetric: eps_low = eps_high)", "eps_high": "cliprange",
                           "log_ratio_clamp": "(fixed none)", "": "learning_step's pg_loss_max (tis_c=None)"},
    "kl.k3": {"log_ratio_min": "(fixed -40)", "log_ratio_max": "(fixed 40)", "output_min": "(fixed none)",
              "output_max": "(fixed none)", "": "learning_step's kl3 = expm1(clamp(ref - logp, -40, 40)) - clamp(...)"},
    "agg.token_mean": {"num_tokens": "(not supported)", "eps": "(fixed 0)", "": "oat.utils.ops.masked_mean(values, mask)"},
    "agg.sample_mean": {"num_sequences": "(not supported)", "sequence_token_counts": "(not supported)",
                        "count_empty_sequences": "(fixed true: .mean() over every row)", "eps_length": "(fixed 0)",
                        "eps_count": "(fixed 0)", "": "masked_mean(values, mask, axis=1) then (... * loss_masks).mean()"},
    "agg.constant": {"divisor": "generate_max_length", "divide_by": '(fixed "K*N")', "num_sequences": "(not supported)",
                     "count_empty_sequences": "(fixed true)",
                     "": "masked_sum(values, mask, axis=1, constant_normalizer=generate_max_length) then .mean()"},
    "adv.group_normalized": {"std": '(fixed "bessel": torch.std)', "eps": "(fixed 1e-8)", "eps_placement": '(fixed "std")',
                             "singleton": "(fixed: Bessel std of one value is NaN)",
                             "": 'compute_monte_carlo_advantages, critic_type="grpo"'},
    "adv.group_centered": {"singleton": '(fixed "zero")', "": 'compute_monte_carlo_advantages, critic_type="drgrpo"'},
    "loss.grpo": {"eps_low": "cliprange", "eps_high": "cliprange (symmetric only)", "log_ratio_clamp": "(fixed none)",
                  "is_level": '"token" + is_mode "truncate" -> tis_c; "none" -> tis_c=None',
                  "is_c_min": "(fixed none)", "is_c_max": "tis_c", "is_log_ratio_clamp": "(fixed none)",
                  "opsm_delta": "(not supported)", "entropy_quantile": "(not supported)", "beta": "beta",
                  "kl_estimator": '(fixed "k3")', "kl_log_ratio_min": "(fixed -40)", "kl_log_ratio_max": "(fixed 40)",
                  "kl_output_min": "(fixed none)", "kl_output_max": "(fixed none)",
                  "": 'learning_step, critic_type="grpo" (masked_aggregator = masked_mean)'},
    "loss.dr_grpo": {"divisor": "generate_max_length", "divide_by": '(fixed "K*N")',
                     "": 'as loss.grpo with critic_type="drgrpo" (masked_sum / generate_max_length)'},
}

from .errors import UnsupportedParameter  # noqa: E402 - raised here and by head.py


def framework_version():
    from importlib import metadata

    try:
        return metadata.version(DIST)
    except metadata.PackageNotFoundError:
        return None


def _load():
    from . import loader

    return loader.load()


_lock = threading.RLock()


def _param(params, fid, name):
    from ..base import spec_param

    return spec_param(params, fid, name)


def _only(params, fid, name, *allowed):
    value = _param(params, fid, name)
    if value not in allowed:
        shown = ", ".join("null" if a is None else repr(a) for a in allowed)
        raise UnsupportedParameter(f"oat-llm {PINNED}: {fid} {name} can only be {shown}; the case asks for {value!r}")
    return value


def _symmetric_clip(params, fid):
    lo, hi = _param(params, fid, "eps_low"), _param(params, fid, "eps_high")
    if lo != hi:
        raise UnsupportedParameter(f"oat-llm {PINNED} has one cliprange (eps_low = eps_high); the case asks for "
                                   f"eps_low={lo!r}, eps_high={hi!r}")
    return lo


def _layout(mask):
    """OAT's layout of a [B, T] token mask: (prompt_ids_lens, attention_mask [B, T+1]).

    OAT's response mask is completion_masks[:, 1:], the attention mask with each row's prompt cut:
    one contiguous run of tokens per row.  A row with a masked token between two unmasked ones
    cannot be expressed (capability: mask_gaps)."""
    import torch

    rows = mask.detach().cpu().bool().tolist()
    B, T = len(rows), len(rows[0]) if rows else 0
    att = torch.zeros(B, T + 1, dtype=torch.long)
    prompt_lens = []
    for i, row in enumerate(rows):
        on = [t for t, m in enumerate(row) if m]
        if on and on[-1] - on[0] + 1 != len(on):
            raise UnsupportedParameter("oat-llm's response mask is one contiguous run per row (an attention mask with "
                                       "its prompt cut); this mask has a masked token between unmasked ones")
        first = on[0] if on else 0
        last = on[-1] if on else -1
        prompt_lens.append(1 + first)
        att[i, : last + 2] = 1   # input position t+1 is response position t
        if not on:
            att[i, 0] = 1        # a row with no response: its prompt token only
    return prompt_lens, att


def _learner(critic_type, args, inputs, advantages=None):
    """A PPOLearner with the adapter's stand-ins (see the module docstring)."""
    ppo, ops, _ = _load()
    learner = object.__new__(ppo.PPOLearner)
    learner.args = args
    learner.model = types.SimpleNamespace(name="policy (stand-in)")
    learner.ref_model = types.SimpleNamespace(name="reference (stand-in)") if args.beta > 0 else None
    learner.optimizer = learner.scheduler = None
    recorded = {"loss": [], "aggregated": []}

    def backward(loss, model, optimizer):
        recorded["loss"].append(loss)

    learner.strategy = types.SimpleNamespace(backward=backward, optimizer_step=lambda *a, **k: None, grad_acc_step=1,
                                             get_gradient_norm=lambda model: 0.0)
    if critic_type == "drgrpo":
        aggregator = functools.partial(ops.masked_sum, constant_normalizer=args.generate_max_length)
    else:
        aggregator = ops.masked_mean

    def recording_aggregator(values, mask, *a, **k):  # the aggregator PPOLearner._init assigns, recorded
        recorded["aggregated"].append(values)
        return aggregator(values, mask, *a, **k)

    learner.masked_aggregator = recording_aggregator
    logprobs, old = inputs["logprobs"], inputs["old_logprobs"]
    ref = inputs.get("ref_logprobs")

    def get_batch_logps(model, input_ids, att_mask, temperature=1.0, compute_entropy=False):
        n = input_ids.shape[1] - 1
        if model is learner.ref_model:
            out = ref
        elif compute_entropy:      # the training pass (learning_step asks for the entropy there only)
            out = logprobs
        else:                      # the no-grad pass that fills the learner's old log-probs
            out = old
        # the rows the learner asks for: every token of row i of the stand-in's input_ids is i
        rows = input_ids[:, 0].long().to(out.device)
        # OAT's get_batch_logps returns float32 log-probs whatever the model's dtype (logits.float())
        out = out[rows, :n].float()
        entropy = out.new_zeros(out.shape[0], n) if compute_entropy else None
        return out, entropy

    learner.get_batch_logps = get_batch_logps
    if advantages is not None:
        learner.compute_monte_carlo_advantages = lambda rewards, response_masks: advantages
    return learner, recorded


def _args(critic_type, **overrides):
    ppo, _, _ = _load()
    return ppo.PPOArgs(critic_type=critic_type, num_ppo_epochs=1, kl_penalty_coef=0.0, reward_scale=1.0,
                       whiten_adv=False, reinforce_update=False, **overrides)


def _run_step(learner, inputs):
    import numpy as np
    import torch

    mask = inputs["mask"]
    B = mask.shape[0]
    prompt_lens, att = _layout(mask)
    sampler = inputs.get("sampler_logprobs")
    if sampler is None:
        sampler = inputs["old_logprobs"]
    rows = mask.detach().cpu().bool()
    trajectory = {
        "input_ids": torch.arange(B).unsqueeze(1).expand_as(att).clone(),   # row i's tokens are i
        "attention_mask": att,
        "rewards": [[0.0] for _ in range(B)],
        "prompt_ids_lens": prompt_lens,
        "action_logprobs": [sampler[i][rows[i]].detach().double().tolist() for i in range(B)],
        "loss_masks": [1.0] * B,
    }
    learner.args.train_batch_size_per_device = B
    learner.args.num_samples = B   # read by learning_step's reward statistics only (view(-1, num_samples))
    with _lock:
        saved_device, saved_state = torch.cuda.current_device, np.random.get_state()
        torch.cuda.current_device = lambda: "cpu"
        np.random.seed(0)   # learning_step permutes the rows of its batch
        try:
            learner.learning_step(trajectory)
        finally:
            torch.cuda.current_device = saved_device
            np.random.set_state(saved_state)


def _unpermute(matrix, B):
    """learning_step's rows are in np.random.permutation order (seed 0 above): back to the case's."""
    import numpy as np
    import torch

    state = np.random.get_state()
    np.random.seed(0)
    perm = np.random.permutation(B)
    np.random.set_state(state)
    inverse = torch.empty(B, dtype=torch.long)
    inverse[torch.as_tensor(perm)] = torch.arange(B)
    return matrix[inverse]


def _pad(matrix, T):
    import torch

    if matrix.shape[1] == T:
        return matrix
    return torch.cat([matrix, matrix.new_zeros(matrix.shape[0], T - matrix.shape[1])], dim=1)


def _token_advantages(inputs):
    adv = inputs["advantages"]
    if adv.dim() != 1:
        raise UnsupportedParameter("oat-llm takes one advantage per sequence ([B]); the case gives them per token")
    return adv


# policy term and KL, per token ------------------------------------------------------------------

def surrogate_ppo_clip(inputs, params):
    fid = "surrogate.ppo_clip"
    _only(params, fid, "log_ratio_clamp", None)
    eps = _symmetric_clip(params, fid)
    args = _args("grpo", cliprange=eps, beta=0.0, tis_c=None)
    learner, rec = _learner("grpo", args, inputs, advantages=_token_advantages(inputs))
    _run_step(learner, inputs)
    B, T = inputs["mask"].shape
    return {"loss": _pad(_unpermute(rec["aggregated"][0], B), T)}


def kl_k3(inputs, params):
    import torch

    fid = "kl.k3"
    _only(params, fid, "log_ratio_min", None, -40.0)
    _only(params, fid, "log_ratio_max", None, 40.0)
    _only(params, fid, "output_min", None)
    _only(params, fid, "output_max", None)
    full = dict(inputs)
    full["old_logprobs"] = inputs["logprobs"].detach()
    full["advantages"] = torch.zeros(inputs["mask"].shape[0], dtype=inputs["logprobs"].dtype)
    args = _args("grpo", cliprange=0.2, beta=1.0, tis_c=None)
    learner, rec = _learner("grpo", args, full, advantages=full["advantages"])
    _run_step(learner, full)
    B, T = inputs["mask"].shape
    return {"kl": _pad(_unpermute(rec["aggregated"][1], B), T)}


# aggregation ------------------------------------------------------------------------------------

def _no_param(params, name):
    if params.get(name) is not None:
        raise UnsupportedParameter(f"oat-llm {PINNED}'s masked_mean/masked_sum have no {name} (local batch only)")


def agg_token_mean(inputs, params):
    fid = "agg.token_mean"
    _no_param(params, "num_tokens")
    _only(params, fid, "eps", 0.0)
    _, ops, _ = _load()
    values = inputs["values"]
    return {"value": ops.masked_mean(values, inputs["mask"])}


def agg_sample_mean(inputs, params):
    fid = "agg.sample_mean"
    _no_param(params, "num_sequences")
    _no_param(params, "sequence_token_counts")
    _only(params, fid, "eps_length", 0.0)
    _only(params, fid, "eps_count", 0.0)
    # count_empty_sequences: OAT's .mean() counts every row (a case asking for false runs as OAT does)
    _, ops, _ = _load()
    values = inputs["values"]
    return {"value": ops.masked_mean(values, inputs["mask"], axis=1).mean()}


def _divisor(value):
    divisor = float(value)
    return int(divisor) if divisor.is_integer() and abs(divisor) < 2**62 else divisor  # an int in PPOArgs


def agg_constant(inputs, params):
    fid = "agg.constant"
    _only(params, fid, "divide_by", "K*N")
    _no_param(params, "num_sequences")
    if params.get("divisor") is None:
        raise UnsupportedParameter("agg.constant needs a divisor (OAT's generate_max_length)")
    _, ops, _ = _load()
    values = inputs["values"]
    return {"value": ops.masked_sum(values, inputs["mask"], axis=1,
                                    constant_normalizer=_divisor(params["divisor"])).mean()}


# advantages -------------------------------------------------------------------------------------

def _advantages(inputs, critic_type):
    ppo, _, _ = _load()
    rewards = inputs["rewards"].detach()
    g = inputs["group_ids"].detach().cpu().tolist()
    sizes = {}
    for x in g:
        sizes[x] = sizes.get(x, 0) + 1
    n = len(g) // max(len(sizes), 1)
    if len(set(sizes.values())) > 1 or any(g[i] != g[(i // n) * n] for i in range(len(g))):
        raise UnsupportedParameter("oat-llm groups a batch as view(-1, num_samples): equal, contiguous groups only")
    learner = object.__new__(ppo.PPOLearner)
    learner.args = _args(critic_type, num_samples=n)
    # OAT's rewards are [B, T] per-token rewards summed over the row; the outcome reward is one token
    adv = learner.compute_monte_carlo_advantages(rewards.unsqueeze(-1), None)
    return {"advantages": adv}


def adv_group_normalized(inputs, params):
    fid = "adv.group_normalized"
    _only(params, fid, "std", "bessel")
    _only(params, fid, "eps", 0.0, 1e-8)  # fixed 1e-8: a case at the default 0 runs with it
    _only(params, fid, "eps_placement", "std")
    return _advantages(inputs, "grpo")


def adv_group_centered(inputs, params):
    return _advantages(inputs, "drgrpo")


# loss recipes -----------------------------------------------------------------------------------

def _recipe(fid, inputs, params, critic_type, **extra):
    _only(params, fid, "log_ratio_clamp", None)
    for name in ("opsm_delta", "entropy_quantile", "is_log_ratio_clamp", "is_c_min"):
        _only(params, fid, name, None)
    eps = _symmetric_clip(params, fid)
    is_level = _param(params, fid, "is_level")
    if is_level == "none":
        tis_c = None
    elif is_level == "token" and _param(params, fid, "is_mode") == "truncate":
        tis_c = _param(params, fid, "is_c_max")
        if tis_c is None:
            raise UnsupportedParameter("oat-llm's TIS needs tis_c (is_c_max)")
    else:
        raise UnsupportedParameter(f"oat-llm {PINNED} has token-level truncated IS only (tis_c); the case asks for "
                                   f"is_level={is_level!r}, is_mode={_param(params, fid, 'is_mode')!r}")
    beta = _param(params, fid, "beta")
    if beta:
        _only(params, fid, "kl_estimator", "k3")
        _only(params, fid, "kl_log_ratio_min", None, -40.0)
        _only(params, fid, "kl_log_ratio_max", None, 40.0)
        _only(params, fid, "kl_output_min", None)
        _only(params, fid, "kl_output_max", None)
    args = _args(critic_type, cliprange=eps, beta=beta, tis_c=tis_c, **extra)
    learner, rec = _learner(critic_type, args, inputs, advantages=_token_advantages(inputs))
    _run_step(learner, inputs)
    if len(rec["loss"]) != 1:
        raise RuntimeError(f"expected one strategy.backward call in learning_step, saw {len(rec['loss'])}")
    return {"loss": rec["loss"][0]}


def loss_grpo(inputs, params):
    return _recipe("loss.grpo", inputs, params, "grpo")


def loss_dr_grpo(inputs, params):
    fid = "loss.dr_grpo"
    _only(params, fid, "divide_by", "K*N")
    return _recipe(fid, inputs, params, "drgrpo", generate_max_length=_divisor(_param(params, fid, "divisor")))


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": surrogate_ppo_clip,
    "kl.k3": kl_k3,
    "agg.token_mean": agg_token_mean,
    "agg.sample_mean": agg_sample_mean,
    "agg.constant": agg_constant,
    "adv.group_normalized": adv_group_normalized,
    "adv.group_centered": adv_group_centered,
    "loss.grpo": loss_grpo,
    "loss.dr_grpo": loss_dr_grpo,
}


class OATAdapter(Adapter):
    """available() is False (with the reason) when oat-llm is missing or its learner cannot be loaded."""
    framework_modules = ("oat",)

    def available(self):
        if framework_version() is None:
            return False, (f"oat-llm is not installed in this interpreter (its dependencies include vllm, deepspeed and "
                           f"flash-attn, and it requires Python < 3.11): in the pgspec checkout, bash ci/install-oat.sh "
                           f"VENV, then VENV/bin/pgspec run --adapter oat (oat-llm=={PINNED}; adapters/oat/README.md)")
        # No import here: `pgspec adapters` asks every adapter in one process, and the loader's stand-ins
        # must not reach another adapter; the learner is loaded on the first call.
        import importlib.util

        from . import loader

        ppo = loader.oat_dir() / "algorithms" / "ppo.py"
        if not ppo.is_file():
            return False, f"oat-llm is installed but {ppo} is missing"
        missing = [m for m in ("tyro", "tqdm", "numpy") if importlib.util.find_spec(m) is None]
        if missing:
            return False, (f"oat-llm's learner imports {', '.join(missing)}, not installed here: "
                           f"pip install -c constraints.txt {' '.join(missing)} (ci/install-oat.sh)")
        return True, ""


def make_adapter() -> Adapter:
    from .head import HEADS

    version = framework_version()
    adapter = OATAdapter(
        name=NAME,
        framework="OAT (oat-llm)",
        version=version or "not installed",
        devices=("cpu",),
        dtypes=("float64", "float32", "bfloat16"),
        implementations=dict(IMPLEMENTATIONS),
        param_map={fid: {k: v for k, v in m.items() if k} for fid, m in PARAM_MAP.items()},
        deviations=load_deviations(Path(__file__).with_name("deviations.toml")),
    )
    adapter.heads = HEADS   # the fused LM head (use_fused_lm_head=True, OAT's default): pgspec check
    return adapter
