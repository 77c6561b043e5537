"""NeMo-RL: an importance weight that overflows to inf becomes 0, so TIS drops the token instead of capping it.

Framework: NeMo-RL main 7ea279ab (2026-08-22), nemo_rl/algorithms/loss/loss_functions.py `ClippedPGLossFn`:
`torch.nan_to_num(weights, nan=0.0, posinf=0.0, neginf=0.0)` before the TIS clamp (and on the on-policy KL
weight):
Source: https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/loss/loss_functions.py#L579-L583
https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/loss/loss_functions.py#L490-L492
Spec: `is.token.truncate` (pgspec spec/is.md#is.token.truncate): w = min(exp(l_old - l_gen), c_max), applied
to the token's loss (`loss.grpo` with is_level token, spec/loss.md#loss.grpo).
Input (float32): one token on policy (logprobs = prev = [[-1]], ratio 1), generation_logprobs = [[-201]]
(old - gen = 200, a token the sampler nearly never emits), A = 1, use_importance_sampling_correction with
truncated_importance_sampling_type "tis", truncated_importance_sampling_ratio 2, token level.
Expected: weight min(e^200, 2) = 2, loss -A r w = -2, gradient -2.
Got: loss 0 and gradient 0: exp(200) = inf in float32, nan_to_num maps it to 0, and the clamp to [0, 2] keeps 0:
the token with the largest mismatch is dropped instead of truncated.
Fix: map +inf to the cap (or clamp the log-weight before exp): `torch.nan_to_num(weights, nan=0.0,
posinf=truncated_importance_sampling_ratio or 0.0)`, or `exp((prev - gen).clamp(max=20))`.
pgspec rule: adapters/nemo_rl/deviations.toml, cause exp-overflow (is.token.truncate/log-ratio-200,
kl.k3_unbiased/ratio-200, prop.clamp/is.token.truncate; float32 and bfloat16).

Run: python findings/nemo_rl/is-weight-overflow-zero.py /path/to/NeMo-RL  (or FINDINGS_SOURCE=/path/to/NeMo-RL). Exit 0: the
bug reproduces; 1: fixed; 2: could not run. NeMo-RL's loss code is not pip-installable (PyPI's nemo-rl is
a placeholder), so the script executes nemo_rl/algorithms/loss/loss_functions.py, loss/interfaces.py and
algorithms/utils.py from the checkout, with torch, pydantic and numpy. Stand-ins (written inline below):
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
    cap = 2.0
    old = torch.tensor([[-1.0]])
    gen = torch.tensor([[-201.0]])
    mask = torch.tensor([[1.0]])
    adv = torch.tensor([[1.0]])
    # expected, from the spec in float64: w = min(exp(l_old - l_gen), c_max), loss -A r w
    lp64 = torch.tensor([[-1.0]], dtype=torch.float64, requires_grad=True)
    r = torch.exp(lp64 - old.double())
    w = torch.exp(old.double() - gen.double()).clamp(max=cap)
    expected = (-torch.min(r, r.clamp(0.8, 1.2)) * w).mean()
    expected.backward()
    exp_loss, exp_grad = expected.item(), lp64.grad[0, 0].item()
    lp = torch.tensor([[-1.0]], requires_grad=True)
    fn = loss_fn(lf, use_importance_sampling_correction=True, truncated_importance_sampling_type="tis",
                 truncated_importance_sampling_ratio=cap, token_level_loss=True)
    loss = run_loss(fn, lp, old, mask, adv, gen=gen)
    loss.backward()
    got, got_grad = loss.item(), lp.grad[0, 0].item()
    what = (f"NeMo-RL {commit(src)} float32 TIS (cap 2) with old - generation log-prob 200 (expected loss {exp_loss:g}, "
            f"gradient {exp_grad:g}; got loss {got:g}, gradient {got_grad:g})")
    if abs(got - exp_loss) <= 1e-5 and abs(got_grad - exp_grad) <= 1e-5:
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
