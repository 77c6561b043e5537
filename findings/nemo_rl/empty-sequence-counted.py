"""NeMo-RL: an empty response is counted in the sample mean's divisor (global_valid_seqs = sum(sample_mask)).

Framework: NeMo-RL main 7ea279ab (2026-08-22): nemo_rl/models/automodel/data.py `process_global_batch`
computes `global_valid_seqs` as the (all-reduced) sum of `sample_mask`, which counts a sample with no valid
token; `ClippedPGLossFn` with token_level_loss = False divides the sum of per-sequence means by it:
Source: https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/models/automodel/data.py#L408-L420
https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/loss/loss_functions.py#L684-L692
(nemo_rl/models/megatron/data.py computes it the same way.)
Spec: `loss.grpo` (pgspec spec/loss.md#loss.grpo) with `agg.sample_mean` (spec/agg.md#agg.sample_mean):
L = (1/N) sum_i (1/L_i) sum_t m_{i,t} l_{i,t}, N the number of sequences with L_i > 0.
Input: two responses on policy (logprobs = prev = generation), the first with one token (A = 1), the
second empty (token_mask all 0, sample_mask 1, as a response truncated to nothing); ratio clip 0.2, KL off.
Expected: loss -1 (the mean over the one non-empty response), gradient -1.
Got: loss -0.5 and gradient -0.5: the empty response is in global_valid_seqs = 2 and halves the other's weight.
Fix: count sequences with at least one valid token: `local_valid_seqs = torch.sum(batch["sample_mask"] *
(batch["token_mask"][:, 1:].sum(-1) > 0))` (or drop empty responses' sample_mask).
Stand-ins for process_global_batch, besides those below: `Tensor.cuda` returns the tensor and
`torch.distributed.all_reduce` is a no-op (a one-rank data-parallel group on CPU).
pgspec rule: adapters/nemo_rl/deviations.toml, cause empty-rows-in-sequence-count (loss.grpo, loss.gspo,
dist.accumulate with an empty row).

Run: python findings/nemo_rl/empty-sequence-counted.py /path/to/NeMo-RL  (or FINDINGS_SOURCE=/path/to/NeMo-RL). Exit 0: the
bug reproduces; 1: fixed; 2: could not run. NeMo-RL's loss code is not pip-installable (PyPI's nemo-rl is
a placeholder), so the script executes nemo_rl/algorithms/loss/loss_functions.py, loss/interfaces.py and
algorithms/utils.py and models/automodel/data.py from the checkout, with torch, pydantic and numpy. Stand-ins (written inline below):
package shells for the nemo_rl packages (their __init__ files, which import ray, megatron and the model
stack, are not run); modules whose every name refuses to be called for the imports those files use only
for other losses and tokenizers (x_token.loss_utils, distributed.model_utils, models.dtensor.parallelize,
data.chat_templates, models.policy, utils.fastokens, utils.logger, models.huggingface.common); a plain dict
for BatchedDataDict; transformers' tokenizer names when transformers is missing.
"""
import importlib
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path


def checkout():
    src = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FINDINGS_SOURCE")
    if not src:
        raise RuntimeError("give the NeMo-RL checkout as the first argument or in FINDINGS_SOURCE")
    if not (Path(src) / "nemo_rl/algorithms/loss/loss_functions.py").is_file():
        raise RuntimeError(f"{src} is not a NeMo-RL checkout (no nemo_rl/algorithms/loss/loss_functions.py)")
    return Path(src)


def commit(src):
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=8", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


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


class _Unused:
    """A name the loss code imports but this script's path never uses: calling it raises."""

    def __init__(self, *a, **k):
        raise RuntimeError(f"{type(self).__name__} is a stand-in the loss path was not expected to use")

    def __class_getitem__(cls, item):
        return cls


def _refusing(name):
    mod = _module(name)

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        cls = type(attr, (_Unused,), {})
        setattr(mod, attr, cls)
        return cls

    mod.__getattr__ = __getattr__
    return mod


def load_nemo_rl(src):
    """(loss_functions, utils) executed from the checkout; package __init__ files are not run."""
    root = src / "nemo_rl"
    for name in ("nemo_rl", "nemo_rl.algorithms", "nemo_rl.algorithms.loss", "nemo_rl.algorithms.x_token",
                 "nemo_rl.distributed", "nemo_rl.models", "nemo_rl.models.dtensor", "nemo_rl.models.automodel",
                 "nemo_rl.models.huggingface", "nemo_rl.data", "nemo_rl.utils"):
        _module(name, root.joinpath(*name.split(".")[1:]))
    for name in ("nemo_rl.algorithms.x_token.loss_utils", "nemo_rl.distributed.model_utils",
                 "nemo_rl.models.dtensor.parallelize", "nemo_rl.data.chat_templates", "nemo_rl.models.policy",
                 "nemo_rl.utils.fastokens", "nemo_rl.utils.logger", "nemo_rl.models.huggingface.common"):
        _refusing(name)
    sys.modules["nemo_rl.models.dtensor.parallelize"].to_local_if_dtensor = lambda t: t

    class BatchedDataDict(dict):
        """The loss only indexes its data argument: a plain dict."""

        def __class_getitem__(cls, item):
            return cls

        def get_batch(self, batch_idx, batch_size):
            return self

    _module("nemo_rl.distributed.batched_data_dict", BatchedDataDict=BatchedDataDict)
    if importlib.util.find_spec("transformers") is None:
        _module("transformers", AutoProcessor=_Unused, AutoTokenizer=_Unused, PreTrainedTokenizerBase=_Unused)
    lf = importlib.import_module("nemo_rl.algorithms.loss.loss_functions")
    ut = importlib.import_module("nemo_rl.algorithms.utils")
    return lf, ut


# the full key set of the TypedDict config of older revisions (PR #2269 head); main's is a pydantic model
_DICT_DEFAULTS = dict(
    reference_policy_kl_penalty=0.0, reference_policy_kl_type="k3", kl_input_clamp_value=20.0,
    kl_output_clamp_value=10.0, ratio_clip_min=0.2, ratio_clip_max=0.2, ratio_clip_c=None,
    use_on_policy_kl_approximation=False, use_importance_sampling_correction=False,
    truncated_importance_sampling_ratio=None, truncated_importance_sampling_type=None,
    truncated_importance_sampling_ratio_min=None, token_level_loss=True, sequence_level_importance_ratios=False,
    disable_ppo_ratio=False, force_on_policy_ratio=False, use_kl_in_reward=False, use_cispo=False,
)


def loss_fn(lf, **cfg):
    """ClippedPGLossFn with these config fields, the others at NeMo-RL's defaults (the KL off unless given)."""
    cfg.setdefault("reference_policy_kl_penalty", 0.0)
    config_cls = lf.ClippedPGLossConfig
    if hasattr(config_cls, "model_fields"):  # pydantic (main)
        return lf.ClippedPGLossFn(config_cls(**cfg))
    return lf.ClippedPGLossFn({k: v for k, v in (_DICT_DEFAULTS | cfg).items() if k in config_cls.__annotations__})


def run_loss(fn, lp, old, mask, adv, *, gen=None, ref=None, valid_seqs=None, valid_toks=None):
    """Call ClippedPGLossFn as NeMo-RL's workers do: data columns start with a prompt column the loss skips."""
    import torch

    def pad(x):
        return torch.cat([torch.zeros_like(x[:, :1]), x], dim=1)

    dt = lp.dtype
    data = {"token_mask": pad(mask.to(dt)), "sample_mask": torch.ones(mask.shape[0], dtype=dt),
            "advantages": pad(adv.to(dt)), "prev_logprobs": pad(old.to(dt)),
            "generation_logprobs": pad((old if gen is None else gen).to(dt)),
            "reference_policy_logprobs": pad((old if ref is None else ref).to(dt))}
    seqs = float(mask.shape[0]) if valid_seqs is None else valid_seqs
    toks = float(mask.sum()) if valid_toks is None else valid_toks
    loss, _ = fn(lp, data, global_valid_seqs=torch.tensor(seqs, dtype=dt), global_valid_toks=torch.tensor(toks, dtype=dt))
    return loss


def main():
    import torch

    src = checkout()
    lf, _ = load_nemo_rl(src)
    data_mod = importlib.import_module("nemo_rl.models.automodel.data")
    fn = loss_fn(lf, token_level_loss=False)
    lp = torch.tensor([[-1.0], [-1.0]], requires_grad=True)
    old = torch.tensor([[-1.0], [-1.0]])
    mask = torch.tensor([[1.0], [0.0]])
    adv = torch.tensor([[1.0], [1.0]])
    batch = sys.modules["nemo_rl.distributed.batched_data_dict"].BatchedDataDict(
        token_mask=torch.cat([torch.zeros(2, 1), mask], dim=1), sample_mask=torch.ones(2),
        input_ids=torch.zeros(2, 2, dtype=torch.long))
    cuda, all_reduce = torch.Tensor.cuda, torch.distributed.all_reduce
    torch.Tensor.cuda = lambda self, *a, **k: self  # one CPU rank: no device move
    torch.distributed.all_reduce = lambda *a, **k: None  # one rank: the sum is the local value
    try:
        counts = data_mod.process_global_batch(batch, fn, None, batch_idx=0, batch_size=2)
    finally:
        torch.Tensor.cuda, torch.distributed.all_reduce = cuda, all_reduce
    seqs, toks = float(counts["global_valid_seqs"]), float(counts["global_valid_toks"])
    loss = run_loss(fn, lp, old, mask, adv, valid_seqs=seqs, valid_toks=toks)
    loss.backward()
    got, got_grad = loss.item(), lp.grad[0, 0].item()
    # expected, from the spec in float64: the sample mean over the sequences with a valid token
    lp64 = torch.tensor([-1.0], dtype=torch.float64, requires_grad=True)
    r = torch.exp(lp64 - torch.tensor([-1.0], dtype=torch.float64))
    expected = (-torch.min(r, r.clamp(0.8, 1.2))).mean()  # one non-empty sequence of one token
    expected.backward()
    exp_grad = lp64.grad[0].item()
    what = (f"NeMo-RL {commit(src)} sample-mean loss with one empty response of two (global_valid_seqs = {seqs:g}; "
            f"expected loss {expected.item():g}, gradient {exp_grad:g}; got loss {got:g}, gradient {got_grad:g})")
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
