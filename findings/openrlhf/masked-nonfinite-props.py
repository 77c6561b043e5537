"""OpenRLHF: a NaN or inf at a padded position makes `aggregate_loss` NaN. (the property rows)

The property rows of OpenRLHF's masked-position rules: their examples hold NaN/inf at masked positions,
which reach the result through the same x * mask products; this script reproduces them through
aggregate_loss.

Framework: OpenRLHF 0.11.2 (PyPI), openrlhf/models/loss.py `aggregate_loss` and
openrlhf/models/utils.py `masked_mean`:
Source: https://github.com/OpenRLHF/OpenRLHF/blob/v0.11.2/openrlhf/models/loss.py#L29-L38
Spec: `agg.token_mean` and `agg.sample_mean` (pgspec spec/agg.md#agg.token_mean,
spec/agg.md#agg.sample_mean): T(q) = sum_{i,t} m_{i,t} q_{i,t} / N_tok and
S(q) = (1/N) sum_i (sum_t m_{i,t} q_{i,t}) / L_i, where masked positions are excluded, never multiplied by 0.
Input: q = [[1, NaN, inf]], mask = [[1, 0, 0]] (one real token, two padded positions holding junk).
Expected: token mean 1.0, sample mean 1.0. Got: NaN for both (`(loss * loss_mask).sum()`: NaN * 0 = NaN).
Fix: select instead of multiplying, in aggregate_loss (`torch.where(loss_mask.bool(), loss, 0).sum(...)` for
both `(loss * loss_mask).sum(...)`) and in utils.masked_mean, which the token mode without batch_num_tokens uses
(`torch.where(mask.bool(), tensor, 0).sum(dim=dim)`); OpenRLHF PR #1240 (open) does this.
pgspec rule: adapters/openrlhf/deviations.toml, cause masked-nonfinite (agg.*, loss.*/masked-nan-inf).

Run: python findings/openrlhf/masked-nonfinite-props.py  (OpenRLHF and torch installed). Exit 0: the bug reproduces;
1: fixed; 2: could not run. If `openrlhf.models` cannot be imported (its __init__ needs peft, deepspeed,
transformers, ...), loss.py and utils.py are loaded from the installed package by path with two stand-ins:
an empty `openrlhf.models` package module and, when deepspeed is missing, an empty `deepspeed` module
(utils.py imports it at the top and uses it only in set_z3_leaf_modules).
"""
import sys


def load_openrlhf():
    try:
        from openrlhf.models import loss, utils
        return loss, utils
    except ImportError:
        pass
    import importlib.util
    import types
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("openrlhf is not installed")
    models = spec.submodule_search_locations[0] + "/models"
    pkg = types.ModuleType("openrlhf.models")
    pkg.__path__ = [models]
    sys.modules["openrlhf.models"] = pkg
    if importlib.util.find_spec("deepspeed") is None:
        sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    loaded = {}
    for name in ("utils", "loss"):
        s = importlib.util.spec_from_file_location(f"openrlhf.models.{name}", f"{models}/{name}.py")
        m = importlib.util.module_from_spec(s)
        sys.modules[s.name] = m
        s.loader.exec_module(m)
        loaded[name] = m
    return loaded["loss"], loaded["utils"]


def version():
    from importlib import metadata

    return metadata.version("openrlhf")


def main():
    import torch

    loss_mod, _ = load_openrlhf()
    q = torch.tensor([[1.0, float("nan"), float("inf")]], dtype=torch.float32)
    mask = torch.tensor([[1.0, 0.0, 0.0]])
    # expected, from the spec in float64: masked positions selected out, never multiplied by 0
    q64, m = q.double(), mask.bool()
    exp_token = q64[m].sum() / m.sum()
    exp_sample = torch.stack([q64[i][m[i]].sum() / m[i].sum() for i in range(q.shape[0]) if m[i].any()]).mean()
    got_token = loss_mod.aggregate_loss(q, mask, token_level_loss=True).item()
    got_sample = loss_mod.aggregate_loss(q, mask, token_level_loss=False).item()
    ok = [abs(got - exp.item()) <= 1e-6 for got, exp in ((got_token, exp_token), (got_sample, exp_sample))]
    what = (f"aggregate_loss with NaN/inf at a padded position (expected token mean {exp_token.item():g}, got "
            f"{got_token:g}; expected sample mean {exp_sample.item():g}, got {got_sample:g})")
    if all(ok):
        print(f"FIXED: OpenRLHF {version()} {what}")
        return 1
    print(f"REPRODUCED: OpenRLHF {version()} {what}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - any failure to run is exit 2, on one line
        print(f"ERROR: {type(e).__name__}: {e}".replace("\n", " "))
        sys.exit(2)
