"""slime: a NaN at a masked position keeps an OPSM sequence that must be dropped.

Framework: slime main 624b824a (2026-08-21), slime/utils/ppo_utils.py `compute_opsm_mask`:
`seq_kl = ((full_old_log_prob - full_log_prob) * loss_mask).sum() / ...`, then
`mask = ((advantage < 0) & (seq_kl > args.opsm_delta))`:
Source: https://github.com/THUDM/slime/blob/624b824a898ab0ec1fcb4d373004c7f3852bf515/slime/utils/ppo_utils.py#L83-L86
Spec: `mask.opsm` (pgspec spec/mask.md#mask.opsm): kappa_i = (1/L_i) sum_t m_{i,t} (l_mu - l), M_i = 0 if A_i < 0
and kappa_i > delta, else 1; masked positions are excluded from kappa, never multiplied by 0.
Input: one sample, log_probs = [-1, 0], old (sampler) log_probs = [-0.5, NaN], loss_mask = [1, 0],
advantages = [-1, -1], opsm_delta = 0.
Expected: kappa = 0.5 > 0 with A < 0: the sequence is dropped (OPSM mask 0 on every token).
Got: kept (mask 1): seq_kl is NaN (NaN * 0 = NaN), and NaN > delta is False.
Fix: `seq_kl = torch.where(loss_mask.bool(), full_old_log_prob - full_log_prob, 0).sum() / torch.clamp_min(loss_mask.sum(), 1)`.
pgspec rule: adapters/slime/deviations.toml, cause masked-nonfinite (mask.opsm on masked NaN/inf).

Run: python findings/slime/opsm-masked-nan-keeps-sequence.py /path/to/slime  (or FINDINGS_SOURCE=/path/to/slime). Exit 0: the bug
reproduces; 1: fixed; 2: could not run. slime is not pip-installable (PyPI's "slime" is an unrelated
package), so the script executes slime/utils/ppo_utils.py, slime/backends/megatron_utils/cp_utils.py and
loss.py (and the slime/utils modules they import) from the checkout, with torch and packaging. Stand-ins
(written inline below): package shells for slime, slime.utils, slime.backends and
slime.backends.megatron_utils (the last one's __init__, accelerator init and Megatron patches, is not run);
megatron.core.mpu reporting context-parallel size 1, as slime's own CPU tests stub it; slime.utils.http_utils
(a port check); loss.py's get_log_probs_and_entropy returns the given log-probs (the logits step, which
needs a model, is skipped). The @torch.compile(dynamic=True) functions run eagerly
(torch._dynamo.config.disable): compiling them on CPU reuses stale float arguments (pytorch #194976, #197889).
"""
import importlib
import importlib.machinery
import os
import subprocess
import sys
import types
from argparse import Namespace
from pathlib import Path


def checkout():
    src = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FINDINGS_SOURCE")
    if not src:
        raise RuntimeError("give the slime checkout as the first argument or in FINDINGS_SOURCE")
    if not (Path(src) / "slime/utils/ppo_utils.py").is_file():
        raise RuntimeError(f"{src} is not a slime checkout (no slime/utils/ppo_utils.py)")
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


def load_slime(src):
    """(ppo_utils, cp_utils, loss) executed from the checkout, context parallelism 1, compiled functions eager."""
    import torch

    torch._dynamo.config.disable = True  # the @torch.compile functions run as the Python they are written as
    _module("megatron")
    _module("megatron.core")
    _module("megatron.core.mpu", get_context_parallel_world_size=lambda: 1, get_context_parallel_rank=lambda: 0,
            get_context_parallel_group=lambda: None, get_tensor_model_parallel_group=lambda: None,
            get_data_parallel_world_size=lambda with_context_parallel=False: 1)
    root = src / "slime"
    _module("slime", root)
    _module("slime.utils", root / "utils")
    _module("slime.backends", root / "backends")
    _module("slime.backends.megatron_utils", root / "backends" / "megatron_utils")
    _module("slime.utils.http_utils", is_port_available=lambda *a, **k: True)
    ppo = importlib.import_module("slime.utils.ppo_utils")
    cp = importlib.import_module("slime.backends.megatron_utils.cp_utils")
    loss = importlib.import_module("slime.backends.megatron_utils.loss")
    return ppo, cp, loss


def slime_args(**kw):
    """slime's command-line defaults for the options loss_function reads (slime/utils/arguments.py)."""
    a = dict(use_rollout_logprobs=False, advantage_estimator="grpo", use_opsm=False, opsm_delta=1e-4,
             eps_clip=0.2, eps_clip_high=0.2, eps_clip_c=None, get_mismatch_metrics=False, use_tis=False,
             tis_clip=2.0, tis_clip_low=0.0, custom_tis_function_path=None, calculate_per_token_loss=False,
             entropy_coef=0.0, use_kl_loss=False, kl_loss_type="k3", kl_loss_coef=0.0, use_unbiased_kl=False,
             custom_pg_loss_reducer_function_path=None, rollout_temperature=1.0, log_probs_chunk_size=-1,
             allgather_cp=False, rollout_top_p=1.0, loss_type="policy_loss", recompute_loss_function=False,
             # options of the PR #2060 (--pg-loss-divisor, --qkv-format) and #2090 (--loss-aggregation) heads
             qkv_format="thd", pg_loss_divisor=None, loss_aggregation="sample_mean", loss_aggregation_divisor=None,
             n_samples_per_prompt=1)
    a.update(kw)
    return Namespace(**a)


def run_loss_function(lossmod, args, logprob_rows, old_rows, adv_rows, mask_rows):
    """slime's loss_function on given per-sample log-probs (one micro-batch, step_global_batch_size = #samples).
    Returns the loss as Megatron uses it (divided by num_tokens in per-token mode)."""
    import torch

    B = len(logprob_rows)
    lens = [len(r) for r in logprob_rows]
    batch = {"advantages": adv_rows, "log_probs": old_rows, "unconcat_tokens": [None] * B,
             "response_lengths": lens, "total_lengths": [n + 1 for n in lens], "loss_masks": mask_rows,
             "rollout_mask_sums": None}
    entropy = [torch.zeros_like(r) for r in logprob_rows]
    lossmod.get_log_probs_and_entropy = lambda logits, **k: (None, {"log_probs": logprob_rows, "entropy": entropy})
    logits = torch.zeros(1, max(sum(lens), 1), 1, dtype=logprob_rows[0].dtype)
    loss, normalizer, _ = lossmod.loss_function(args, batch, 1, B, logits)
    return loss / normalizer if args.calculate_per_token_loss else loss


def main():
    import torch

    src = checkout()
    ppo, _, _ = load_slime(src)
    delta = 0.0
    lp = torch.tensor([-1.0, 0.0])
    mu = torch.tensor([-0.5, float("nan")])
    mask = torch.tensor([1.0, 0.0])
    adv = torch.tensor([-1.0, -1.0])
    # expected, from the spec in float64: kappa over the unmasked tokens, M = 0 if A < 0 and kappa > delta
    m = mask.bool()
    kappa = (mu.double()[m] - lp.double()[m]).mean().item()
    a = adv.double()[m].mean().item()
    expected_keep = 0.0 if (a < 0 and kappa > delta) else 1.0
    keep, _ = ppo.compute_opsm_mask(Namespace(opsm_delta=delta), [lp], [mu], [adv], [mask])
    got_keep = keep.reshape(-1)[0].item()
    what = (f"slime {commit(src)} compute_opsm_mask with a NaN sampler log-prob at a masked position (kappa = "
            f"{kappa:g} > delta = {delta:g}, A < 0: expected keep {expected_keep:g}, got {got_keep:g})")
    if got_keep == expected_keep:
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
