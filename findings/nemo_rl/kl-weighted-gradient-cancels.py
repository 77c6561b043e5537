"""NeMo-RL: the importance-weighted k3's gradient cancels catastrophically in float32 (x = 20 gives -32, not -20).

Framework: NeMo-RL main 7ea279ab (2026-08-22), nemo_rl/algorithms/loss/loss_functions.py `ClippedPGLossFn`'s
KL term `calculate_kl(..., importance_sampling_weights=kl_importance_weights)`, i.e. w * k3(x):
Source: https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/loss/loss_functions.py#L484-L500
Spec: `kl.k3_unbiased` (pgspec spec/kl.md#kl.k3_unbiased): y = w k3(x), w = exp(l - l_old) (l_old the sampler's),
x = l_ref - l, k3(x) = e^x - x - 1; dy/dl = w k3(x) - w (e^x - 1) = -w x exactly, which the spec evaluates
as such.
Input (float32): one token on policy (logprobs = prev = generation = [[0]], weight e^0 = 1), reference_policy_logprobs
= [[20]] (x = l_ref - l = 20), reference_policy_kl_penalty 1, use_on_policy_kl_approximation, KL clamps off
(kl_input_clamp_value = kl_output_clamp_value = None), the policy term off (disable_ppo_ratio, A = 0).
Expected: gradient -w x = -20.
Got: -32 (the ulp of e^20 in float32 is 32): autograd forms w k3(x) + w (1 - e^x), two float32 terms of
size e^20 whose exact sum is -x. At x = 88 it gives 0, and past 88.7 NaN (inf - inf).
Fix: give the product its exact derivative with a straight-through form (value w k3, gradient -w x, no
e^x formed twice): `kl = (w * k3).detach() + (-(w * x)).detach() * (curr - curr.detach())` for the
on-policy weight w = exp(curr - gen), x = ref - curr (unclamped; where the input clamp binds, 0 as now).
pgspec rule: adapters/nemo_rl/deviations.toml, cause cancellation (kl.k3_unbiased where `k3_unbiased_gradient_cancels`: e^x > 16 |x| at a token; float32 and bfloat16).

Run: python findings/nemo_rl/kl-weighted-gradient-cancels.py /path/to/NeMo-RL  (or FINDINGS_SOURCE=/path/to/NeMo-RL). Exit 0: the
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
    dt = torch.float32
    x0 = 20.0
    zero = torch.zeros(1, 1, dtype=dt)
    lp = torch.zeros(1, 1, dtype=dt, requires_grad=True)
    fn = loss_fn(lf, reference_policy_kl_penalty=1.0, reference_policy_kl_type="k3", kl_input_clamp_value=None,
                 kl_output_clamp_value=None, use_on_policy_kl_approximation=True, disable_ppo_ratio=True,
                 token_level_loss=True)
    loss = run_loss(fn, lp, zero, torch.ones(1, 1, dtype=dt), zero, gen=zero, ref=torch.full((1, 1), x0, dtype=dt))
    loss.backward()
    got = lp.grad[0, 0].item()
    # expected, from the spec in float64: dy/dl = -w x with w = exp(l - l_gen) = 1, x = l_ref - l
    w = torch.exp(torch.tensor(0.0, dtype=torch.float64))
    expected = (-w * torch.tensor(x0, dtype=torch.float64)).item()
    what = (f"NeMo-RL {commit(src)} float32 gradient of the importance-weighted k3 at x = l_ref - l = {x0:g}, weight 1 "
            f"(expected {expected:g}, got {got:g})")
    if abs(got - expected) <= 1e-4 * abs(expected):
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
