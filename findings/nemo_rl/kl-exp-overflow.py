"""NeMo-RL: calculate_kl's k3 overflows exp without the input clamp and gives a NaN gradient under the output clamp.

Framework: NeMo-RL main 7ea279ab (2026-08-22), nemo_rl/algorithms/utils.py `calculate_kl` with kl_type "k3",
input_clamp_value=None, output_clamp_value=10 (`kl = torch.exp(logr) - 1 - logr` in the input dtype, then
`kl.clamp(-output_clamp_value, output_clamp_value)`).
Source: https://github.com/NVIDIA-NeMo/RL/blob/7ea279abfbeb698b092856d0dab61e7cf39bc909/nemo_rl/algorithms/utils.py#L89-L99
Spec: `kl.k3` (pgspec spec/kl.md#kl.k3): k3(x) = e^x - 1 - x with x = l_ref - l, here clipped to [c, d] = [-10, 10]:
kl = clip(k3(x), c, d), whose gradient is 0 where the clamp holds (k3(x) > d).
Input (float32): one token, logprobs = [[-201]], reference logprobs = [[-1]] (x = l_ref - l = 200),
kl_type "k3", input_clamp_value None, output_clamp_value 10, no importance weights. The same happens in
float64 past x = 709.78 (e.g. x = 768, the float64 case pgspec found).
Expected: kl 10 (the clamp holds: k3(200) = e^200 - 201 > 10), gradient d kl / d logprobs = 0 (computed in
plain float64 torch, where e^200 is finite).
Got: kl 10, gradient NaN: exp(200) is inf in float32, and the backward of the output clamp sends a zero
cotangent through exp's infinite derivative (0 * inf = NaN).
Fix: without importance weights, cap logr before exp when the output clamp is set:
`logr = logr.clamp(max=output_clamp_value + 1)` (k3(d + 1) = e^(d+1) - d - 2 > d, so the clamped kl and its
zero gradient are unchanged and exp stays finite); with importance weights, form w * k3 as
exp(logr.clamp(max=cap) + log w) or keep the input clamp on.
pgspec rule: adapters/nemo_rl/deviations.toml, kl-exp-overflow (kl.k3 / kl.k3_unbiased, large_log_ratio;
kl.k3/log-ratio-200-output-clamp-only).

Run: python findings/nemo_rl/kl-exp-overflow.py /path/to/NeMo-RL  (or FINDINGS_SOURCE=/path/to/NeMo-RL). Exit 0:
the bug reproduces; 1: fixed; 2: could not run. NeMo-RL's code is not pip-installable (PyPI's nemo-rl is a
placeholder), so the script executes nemo_rl/algorithms/utils.py from the checkout, with torch and numpy.
Stand-ins (written inline below): package shells for the nemo_rl packages (their __init__ files, which
import ray, megatron and the model stack, are not run); modules whose every name refuses to be called for
the imports utils.py uses only for tokenizers and logging (data.chat_templates, models.policy,
utils.fastokens, utils.logger, and the others the loss scripts share); transformers' tokenizer names when
transformers is missing.
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
    if not (Path(src) / "nemo_rl/algorithms/utils.py").is_file():
        raise RuntimeError(f"{src} is not a NeMo-RL checkout (no nemo_rl/algorithms/utils.py)")
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
    """nemo_rl/algorithms/utils.py executed from the checkout; package __init__ files are not run."""
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
    return importlib.import_module("nemo_rl.algorithms.utils")


def main():
    import torch

    src = checkout()
    ut = load_nemo_rl(src)
    lp_val, ref_val, clamp = -201.0, -1.0, 10.0
    # expected, from the spec in plain float64 (e^200 is finite there): clip(k3(x), -d, d), x = l_ref - l
    lp64 = torch.tensor([[lp_val]], dtype=torch.float64, requires_grad=True)
    x = torch.tensor([[ref_val]], dtype=torch.float64) - lp64
    expected = (torch.exp(x) - 1 - x).clamp(-clamp, clamp)
    expected.sum().backward()
    exp_kl, exp_grad = expected[0, 0].item(), lp64.grad[0, 0].item() + 0.0  # + 0.0: -0 prints as 0
    lp = torch.tensor([[lp_val]], requires_grad=True)
    kl = ut.calculate_kl(lp, torch.tensor([[ref_val]]), kl_type="k3", input_clamp_value=None,
                         output_clamp_value=clamp)
    kl.sum().backward()
    got_kl, got_grad = kl[0, 0].item(), lp.grad[0, 0].item()
    ok = abs(got_kl - exp_kl) <= 1e-6 * max(1.0, abs(exp_kl)) and abs(got_grad - exp_grad) <= 1e-6 * max(1.0, abs(exp_grad))
    what = (f"NeMo-RL {commit(src)} calculate_kl k3, float32, x = l_ref - l = {ref_val - lp_val:g}, input clamp off, "
            f"output clamp {clamp:g} (expected kl {exp_kl:g}, gradient {exp_grad:g}; got kl {got_kl:g}, gradient {got_grad:g})")
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
