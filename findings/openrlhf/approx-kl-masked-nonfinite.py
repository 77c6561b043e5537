"""OpenRLHF: `compute_approx_kl` differentiates padded positions; an infinite log-ratio there gives a NaN gradient.

Framework: OpenRLHF 0.11.2 (PyPI), openrlhf/models/utils.py `compute_approx_kl` (kl_estimator="k2", and
the k2 gradient of unbiased_gradient=True):
Source: https://github.com/OpenRLHF/OpenRLHF/blob/v0.11.2/openrlhf/models/utils.py#L97-L101
Spec: `kl.k2` (pgspec spec/kl.md#kl.k2): y = clip(x^2 / 2, -10, 10) with x = l - l_ref,
gradient l - l_ref where unclamped, else 0; `kl.k3_straight_through` (spec/kl.md#kl.k3_straight_through):
gradient l - l_ref. A masked position is not read: its gradient is exactly 0.
Input: logprobs = [[-1, -1]], ref_logprobs = [[-1.5, inf]], mask = [[1, 0]] (junk inf at the padded position);
the caller reduces over the unmasked tokens only (here by selection, so the caller adds no NaN itself).
Expected: gradient (0.5, 0) for both estimators.
Got: (0.5, NaN). compute_approx_kl takes no mask and squares the infinite log-ratio; the clamp's zero
cotangent times the square's derivative is 0 * inf = NaN (k2); with unbiased_gradient=True the unclamped
k2 surrogate makes the value NaN as well (inf - inf).
Fix: pass the action mask in and zero the log-ratio at padded positions before the estimators:
`log_ratio = torch.where(action_mask.bool(), log_ratio, 0)`.
pgspec rule: adapters/openrlhf/deviations.toml, cause masked-nonfinite (kl.k2/masked-nan-inf,
kl.k3_straight_through/masked-nan-inf).

Run: python findings/openrlhf/approx-kl-masked-nonfinite.py  (OpenRLHF and torch installed). Exit 0: the bug reproduces;
1: fixed; 2: could not run. If `openrlhf.models` cannot be imported (its __init__ needs peft, deepspeed,
transformers, ...), loss.py and utils.py are loaded from the installed package by path with two stand-ins:
an empty `openrlhf.models` package module and, when deepspeed is missing, an empty `deepspeed` module.
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

    _, utils = load_openrlhf()
    ref = torch.tensor([[-1.5, float("inf")]])
    mask = torch.tensor([[True, False]])
    # expected, from the spec in float64: k2's gradient l - l_ref at the unmasked token, 0 at the padded one
    lp64 = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    (0.5 * (lp64[mask] - ref.double()[mask]) ** 2).clamp(-10, 10).sum().backward()
    expected = lp64.grad[0].tolist()
    got = {}
    for label, kwargs in (("k2", dict(kl_estimator="k2")),
                          ("k3 unbiased_gradient", dict(kl_estimator="k3", unbiased_gradient=True))):
        lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
        kl = utils.compute_approx_kl(lp, ref, **kwargs)
        kl[mask].sum().backward()
        got[label] = lp.grad[0].tolist()
    shown = "; ".join(f"{k}: {[round(v, 6) for v in g]}" for k, g in got.items())
    what = (f"compute_approx_kl gradient with an infinite log-ratio at a padded position (expected "
            f"{[round(v, 6) for v in expected]}; got {shown})")
    if all(all(abs(a - b) <= 1e-6 for a, b in zip(g, expected)) for g in got.values()):
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
