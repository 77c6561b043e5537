"""pgspec adapter for NeMo-RL, loaded from the user's checkout (see adapters/nemo_rl/README.md).

Every value comes out of NeMo-RL's own functions; the adapter only moves tensors between pgspec's
canonical layout and NeMo-RL's arguments:

- ``ClippedPGLossFn`` (``nemo_rl/algorithms/loss/loss_functions.py``): ``surrogate.ppo_clip``,
  ``surrogate.dual_clip`` (``ratio_clip_c``), ``surrogate.cispo`` (``use_cispo``), ``surrogate.gspo``
  (``sequence_level_importance_ratios``), ``kl.k3_unbiased`` (the KL term with
  ``use_on_policy_kl_approximation``), ``is.token.truncate`` / ``is.token.mask``
  (``truncated_importance_sampling_type`` ``tis`` / ``icepop``), ``mask.geometric_sequence``
  (``seq-mask-tis``), and the recipes ``loss.grpo``, ``loss.bnpo``, ``loss.dapo``, ``loss.cispo``,
  ``loss.gspo``; ``dist.accumulate`` through micro-batches with the global ``global_valid_seqs`` /
  ``global_valid_toks`` NeMo-RL's workers pass.
- ``calculate_kl`` (``nemo_rl/algorithms/utils.py``): ``kl.k1``, ``kl.k2``, ``kl.k3``.
- ``GRPOAdvantageEstimator`` (``advantage_estimator.py``): ``adv.group_normalized``,
  ``adv.group_centered``.

NeMo-RL's loss returns one scalar, ``Σ_t w_t m_t ℓ_t / (D + 1e-8)`` with ``m`` the float token mask
and ``D`` the ``global_valid_toks`` (or ``global_valid_seqs``) the caller passes.  For the per-token
outputs of ``surrogate.*``, ``is.*`` and ``kl.k3_unbiased`` the adapter passes ``D = 1`` and reads
each token's term as the derivative of that scalar with respect to the token's mask weight (the
mask is a float tensor in NeMo-RL); the gradient reported is that of the same scalar.  No formula
is re-computed here.

Every data tensor is indexed ``[:, 1:]`` by NeMo-RL (position 0 is the first prompt token), so the
adapter prepends one column.  bfloat16 inputs are computed in float32, as NeMo-RL casts logits to
float32 before the loss.
"""

from __future__ import annotations

from pathlib import Path

from .._gitsource import Revision, SourceAdapter, check_source, source_env
from ..base import current_cotangent, load_deviations, spec_param
from . import loader

FRAMEWORK = "NeMo-RL"
REPO = "https://github.com/NVIDIA-NeMo/RL"

MAIN = Revision(
    name="main 7ea279ab",
    commit="7ea279abfbeb698b092856d0dab61e7cf39bc909",
    blobs={
        "nemo_rl/algorithms/loss/loss_functions.py": "11e68df88dcb7a9a4549c4574afa2ad301a6a540",
        "nemo_rl/algorithms/loss/interfaces.py": "4ccfbf834e6f97673417083e9f457552fd168ffe",
        "nemo_rl/algorithms/utils.py": "bca9766c404aac0e06a9b6f4dc4db5034464ac63",
        "nemo_rl/algorithms/advantage_estimator.py": "491de0d9414c48112118b5ed4ada6a240f1cbd35",
    },
    clone="git clone https://github.com/NVIDIA-NeMo/RL nemo-rl && git -C nemo-rl checkout 7ea279abfbeb698b092856d0dab61e7cf39bc909",
)
PR2269 = Revision(
    name="PR #2269 head c7b1b01d",
    commit="c7b1b01d215ed1b662f011bf6b88e13d1ef3ef22",
    blobs={
        "nemo_rl/algorithms/loss/loss_functions.py": "7dc9e693dfb65ea3fff6d9a6b95a22c45d105832",
        "nemo_rl/algorithms/loss/interfaces.py": "abf0b89095fb756cdd942053a6f698340e468d9b",
        "nemo_rl/algorithms/utils.py": "f46b49ace7d44591a27b6567ba6afb83f6578519",
        "nemo_rl/algorithms/advantage_estimator.py": "6a7288ff526c07390b7a52f3a9ad80e0a7732210",
    },
    clone=("git clone https://github.com/NVIDIA-NeMo/RL nemo-rl-pr2269 && git -C nemo-rl-pr2269 fetch origin "
           "pull/2269/head && git -C nemo-rl-pr2269 checkout c7b1b01d215ed1b662f011bf6b88e13d1ef3ef22"),
)
REVISIONS = [MAIN, PR2269]


from pgspec.adapters.base import Unsupported as _PropertyUnsupported  # noqa: E402


class NeMoRLUnsupported(_PropertyUnsupported, NotImplementedError):
    """A parameter value or input form that NeMo-RL's configuration cannot express (declared as a
    capability in deviations.toml; a property check that needs one reports it as unsupported)."""


def _unsupported(fid, why):
    raise NeMoRLUnsupported(f"nemo_rl: {fid}: {why}")


# ------------------------------------------------------------------------------------ helpers

def _modules():
    src = ADAPTER.source()
    if src is None:
        raise RuntimeError(f"no NeMo-RL checkout ({source_env('nemo_rl')} is not set)")
    return loader.load(src)


_param = spec_param   # a spec parameter's value, defaulted, as the framework's config holds it


def _compute(x):
    import torch

    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _pad1(x):
    """NeMo-RL reads data[...][:, 1:]: prepend the (prompt) column it skips."""
    import torch

    return torch.cat([torch.zeros_like(x[:, :1]), x], dim=1)


def _token_adv(adv, like):
    return adv.unsqueeze(-1).expand_as(like) if adv.dim() == 1 else adv


class _Config(dict):
    """An estimator config readable as attributes (pydantic on main) and as keys (TypedDict before)."""

    __getattr__ = dict.__getitem__


def _has_is_correction_level():
    lf, _, _ = _modules()
    return "is_correction_level" in Path(lf.__file__).read_text()


def _is_pydantic(lf):
    try:
        from pydantic import BaseModel
    except ImportError:
        return False
    return isinstance(lf.ClippedPGLossConfig, type) and issubclass(lf.ClippedPGLossConfig, BaseModel)


# the full key set of the TypedDict config of older revisions (PR #2269 head)
_DICT_DEFAULTS = dict(
    reference_policy_kl_penalty=0.0, reference_policy_kl_type="k3", kl_input_clamp_value=20.0,
    kl_output_clamp_value=10.0, ratio_clip_min=0.2, ratio_clip_max=0.2, ratio_clip_c=None,
    use_on_policy_kl_approximation=False, use_importance_sampling_correction=False,
    truncated_importance_sampling_ratio=None, truncated_importance_sampling_type=None,
    truncated_importance_sampling_ratio_min=None, token_level_loss=True, sequence_level_importance_ratios=False,
    disable_ppo_ratio=False, force_on_policy_ratio=False, use_kl_in_reward=False, use_cispo=False,
)


def _loss_fn(**cfg):
    """ClippedPGLossFn with these config fields (others at NeMo-RL's defaults, KL off unless given)."""
    lf, _, _ = _modules()
    cfg.setdefault("reference_policy_kl_penalty", 0.0)
    if _is_pydantic(lf):
        config = lf.ClippedPGLossConfig(**cfg)
    else:
        if "is_correction_level" in cfg and "is_correction_level" not in lf.ClippedPGLossConfig.__annotations__:
            _unsupported("loss", "this revision has no is_correction_level")
        unknown = set(cfg) - set(lf.ClippedPGLossConfig.__annotations__)
        if unknown:
            _unsupported("loss", f"this revision's config has no {sorted(unknown)}")
        config = dict(_DICT_DEFAULTS) | cfg
    return lf.ClippedPGLossFn(config)


def _run_loss(fn, lp, old, mask, adv, *, gen=None, ref=None, valid_seqs, valid_toks, mask_grad=False,
              sample_grad=False, metrics=None):
    """Call NeMo-RL's loss; return (loss, float token mask, float sample mask).  ``metrics``, a dict,
    receives the loss's own metrics."""
    import torch

    dt = lp.dtype
    B, T = mask.shape
    token_mask = mask.to(dt).detach().requires_grad_(mask_grad)
    sample_mask = torch.ones(B, dtype=dt, device=lp.device).requires_grad_(sample_grad)
    data = {
        "token_mask": _pad1(token_mask),
        "sample_mask": sample_mask,
        "advantages": _pad1(_token_adv(adv.to(dt), lp)),
        "prev_logprobs": _pad1(old.to(dt)),
        "generation_logprobs": _pad1((old if gen is None else gen).to(dt)),
        "reference_policy_logprobs": _pad1((old if ref is None else ref).to(dt)),
    }
    loss, _metrics = fn(lp, data, global_valid_seqs=torch.tensor(float(valid_seqs), dtype=dt),
                        global_valid_toks=torch.tensor(float(valid_toks), dtype=dt))
    if metrics is not None:
        metrics.update(_metrics)
    return loss, token_mask, sample_mask


def _readout_vjp(loss, weight, lp, keep, wants):
    """(r = d loss / d weight, the VJP sum_k c_k r_k of r with the case's cotangent c
    (pgspec.adapters.base.current_cotangent) w.r.t. lp, or None unless ``wants``).  NeMo-RL's loss is
    linear in its token-mask (or sample-mask) weight, so r is the per-token (per-sample) loss; its VJP
    is formed by differentiating the readout again (create_graph) through NeMo-RL's own forward;
    ``keep``: the elements of r that are compared (the others selected away)."""
    import torch

    c = current_cotangent(like=weight)
    (r,) = torch.autograd.grad(loss, [weight], create_graph=wants, allow_unused=True)
    if r is None:
        r = torch.zeros_like(weight)
    if not wants:
        return r.detach(), None
    obj = torch.where(keep, r * c, torch.zeros((), dtype=r.dtype)).sum()
    g = torch.autograd.grad(obj, [lp], allow_unused=True)[0] if obj.requires_grad else None
    return r.detach(), (torch.zeros_like(lp) if g is None else g)


def _per_token(fn, lp, old, mask, adv, *, gen=None, ref=None, want_lp_grad=True):
    """Per-token terms as d(loss)/d(token-mask weight) with D = 1, and their VJP with the case's
    cotangent w.r.t. lp."""
    import torch

    with torch.enable_grad():
        wants = lp.requires_grad and want_lp_grad
        loss, tm, _ = _run_loss(fn, lp, old, mask, adv, gen=gen, ref=ref, valid_seqs=1.0, valid_toks=1.0,
                                mask_grad=True)
        if not loss.requires_grad:
            return torch.zeros_like(lp), None
        return _readout_vjp(loss, tm, lp, mask, wants)


def _with_grad(out, name, g):
    if g is not None:
        out["grad"] = {name: g}
    return out


def _require_null(params, fid, *names):
    for n in names:
        if _param(params, fid, n) is not None:
            _unsupported(fid, f"{n}={params.get(n)!r} has no NeMo-RL counterpart; only null is expressible")


# ------------------------------------------------------------------------------------ surrogates

def _surrogate(fid):
    def run(inputs, params):
        _require_null(params, fid, "log_ratio_clamp")
        lp, old, m = _compute(inputs["logprobs"]), _compute(inputs["old_logprobs"]), inputs["mask"]
        adv = _compute(inputs["advantages"])
        if fid == "surrogate.cispo":
            if _param(params, fid, "cap_form") != "relative":
                _unsupported(fid, "cap_form 'absolute': NeMo-RL clips the ratio to [1 - ratio_clip_min, 1 + ratio_clip_max]")
            lo = _param(params, fid, "eps_low")
            cfg = dict(use_cispo=True, ratio_clip_min=1.0 if lo is None else lo,
                       ratio_clip_max=_param(params, fid, "eps_high"))
        else:
            cfg = dict(ratio_clip_min=_param(params, fid, "eps_low"), ratio_clip_max=_param(params, fid, "eps_high"))
            if fid == "surrogate.dual_clip":
                cfg["ratio_clip_c"] = _param(params, fid, "c")
        terms, g = _per_token(_loss_fn(**cfg), lp, old, m, adv)
        out = {"loss": terms}
        return _with_grad(out, "logprobs", g)

    run.__name__ = fid.replace(".", "_")
    return run


def surrogate_gspo(inputs, params):
    """GSPO: sequence_level_importance_ratios with the sequence-level loss; the sequence's loss is
    the derivative of the scalar with respect to its sample-mask weight (global_valid_seqs = 1)."""
    import torch

    fid = "surrogate.gspo"
    _require_null(params, fid, "log_ratio_max")
    lp, old, m = _compute(inputs["logprobs"]), _compute(inputs["old_logprobs"]), inputs["mask"]
    adv = _compute(inputs["advantages"])
    if adv.dim() != 1:
        _unsupported(fid, "per-token advantages: GSPO takes one advantage per sequence")
    fn = _loss_fn(sequence_level_importance_ratios=True, token_level_loss=False,
                  ratio_clip_min=_param(params, fid, "eps_low"), ratio_clip_max=_param(params, fid, "eps_high"))
    with torch.enable_grad():
        loss, _, sm = _run_loss(fn, lp, old, m, adv, valid_seqs=1.0, valid_toks=1.0, sample_grad=True)
        wants = lp.requires_grad
        value, g = _readout_vjp(loss, sm, lp, torch.ones_like(sm, dtype=torch.bool), wants)
    out = {"loss": value}
    if wants:
        out["grad"] = {"logprobs": g}
    return out


# ------------------------------------------------------------------------------------------- kl

def _kl_clamps(params, fid):
    a, b = _param(params, fid, "log_ratio_min"), _param(params, fid, "log_ratio_max")
    c, d = _param(params, fid, "output_min"), _param(params, fid, "output_max")
    if (a is None) != (b is None) or (a is not None and a != -b):
        _unsupported(fid, f"input clamp [{a}, {b}]: kl_input_clamp_value is one symmetric bound")
    if (c is None) != (d is None) or (c is not None and c != -d):
        _unsupported(fid, f"output clamp [{c}, {d}]: kl_output_clamp_value is one symmetric bound")
    return b, d


def _fill(x, mask):
    import torch

    return torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))


def _kl(fid):
    kind = fid.split(".")[1]

    def run(inputs, params):
        _, ut, _ = _modules()
        inp, outp = _kl_clamps(params, fid)
        m = inputs["mask"]
        # calculate_kl has no mask: padding holds 0, as in NeMo-RL's padded batches
        kl = ut.calculate_kl(_fill(_compute(inputs["logprobs"]), m), _fill(_compute(inputs["ref_logprobs"]), m), kl_type=kind,
                             input_clamp_value=inp, output_clamp_value=outp)
        return {"kl": kl}

    run.__name__ = fid.replace(".", "_")
    return run


def kl_k3_unbiased(inputs, params):
    """The KL term of ClippedPGLossFn with use_on_policy_kl_approximation (weight
    exp(curr - generation), generation = old), β = 1, the policy part switched off
    (disable_ppo_ratio with zero advantages)."""
    import torch

    fid = "kl.k3_unbiased"
    inp, outp = _kl_clamps(params, fid)
    if not _param(params, fid, "sg_ratio_where_clamped"):
        _unsupported(fid, "sg_ratio_where_clamped false: calculate_kl always detaches the weight where the input clamp binds")
    lp, old, ref = (_compute(inputs[k]) for k in ("logprobs", "old_logprobs", "ref_logprobs"))
    m = inputs["mask"]
    fn = _loss_fn(reference_policy_kl_penalty=1.0, reference_policy_kl_type="k3", kl_input_clamp_value=inp,
                  kl_output_clamp_value=outp, use_on_policy_kl_approximation=True, disable_ppo_ratio=True)
    zero_adv = torch.zeros(lp.shape[0], dtype=lp.dtype, device=lp.device)
    terms, g = _per_token(fn, lp, old, m, zero_adv, gen=old, ref=ref)
    return _with_grad({"kl": terms}, "logprobs", g)


# ------------------------------------------------------------------------------------------- is

def _is(fid):
    mode = fid.split(".")[2]

    def run(inputs, params):
        """The IS weight as NeMo-RL applies it: with disable_ppo_ratio and advantages -1 the loss is
        Σ w_t m_t ℓ_t, so its derivative with respect to the current log-prob ℓ_t is w_t."""
        import torch

        _require_null(params, fid, "log_ratio_clamp")
        lo, hi = _param(params, fid, "c_min"), _param(params, fid, "c_max")
        if hi is None:
            _unsupported(fid, "c_max null: truncated_importance_sampling_ratio must be positive")
        old, mu, m = _compute(inputs["old_logprobs"]), _compute(inputs["sampler_logprobs"]), inputs["mask"]
        if mode == "mask" and lo is None:
            lo = 0.0  # icepop needs a lower bound; the weights are positive, so 0 is none
        fn = _loss_fn(disable_ppo_ratio=True, use_importance_sampling_correction=True,
                      truncated_importance_sampling_type="tis" if mode == "truncate" else "icepop",
                      truncated_importance_sampling_ratio=hi, truncated_importance_sampling_ratio_min=lo)
        cur = torch.zeros_like(old).requires_grad_(True)
        minus_one = torch.full((old.shape[0],), -1.0, dtype=old.dtype, device=old.device)
        with torch.enable_grad():
            loss, _, _ = _run_loss(fn, cur, old, m, minus_one, gen=mu, valid_seqs=1.0, valid_toks=1.0)
            (w,) = torch.autograd.grad(loss, [cur], allow_unused=True)
        return {"weight": torch.zeros_like(old) if w is None else w}

    run.__name__ = fid.replace(".", "_")
    return run


def mask_geometric_sequence(inputs, params):
    """seq-mask-tis: NeMo-RL zeroes the token IS weights of a sequence whose geometric-mean ratio
    exp(mean(prev - gen)) leaves [min, max].  The keep decision is read, one sequence at a time,
    from the loss's own metric is_oob_ratio = masked_mean(1 - seq_kept_mask, sample_mask, 1): 0 for
    a kept sequence, 1 / (1 + 1e-8) for a dropped one (an empty row included, which has no token
    weight to read the decision from)."""
    import torch

    fid = "mask.geometric_sequence"
    if _param(params, fid, "numerator") != "old_logprobs":
        _unsupported(fid, "numerator 'logprobs': seq-mask-tis compares prev_logprobs with generation_logprobs")
    old, mu, m = _compute(inputs["old_logprobs"]), _compute(inputs["sampler_logprobs"]), inputs["mask"]
    fn = _loss_fn(disable_ppo_ratio=True, use_importance_sampling_correction=True,
                  truncated_importance_sampling_type="seq-mask-tis",
                  truncated_importance_sampling_ratio=_param(params, fid, "upper"),
                  # seq-mask-tis needs a lower bound; a geometric ratio is positive, so 0 is none
                  truncated_importance_sampling_ratio_min=_param(params, fid, "lower") or 0.0)
    keep = []
    for b in range(old.shape[0]):
        o, g, mb = old[b:b + 1], mu[b:b + 1], m[b:b + 1]
        minus_one = torch.full((1,), -1.0, dtype=old.dtype, device=old.device)
        metrics = {}
        with torch.no_grad():
            _run_loss(fn, torch.zeros_like(o), o, mb, minus_one, gen=g, valid_seqs=1.0, valid_toks=1.0,
                      metrics=metrics)
        keep.append(float(metrics["is_oob_ratio"]) < 0.5)
    return {"seq_keep": torch.tensor(keep, dtype=torch.bool, device=old.device)}


# ------------------------------------------------------------------------------------------ adv

def _adv(fid):
    def run(inputs, params):
        import torch

        _, _, adv = _modules()
        normalize = fid == "adv.group_normalized"
        if _param(params, fid, "singleton") != "zero":
            _unsupported(fid, "singleton 'mean0_std1': a prompt with one valid sample gets baseline = reward (A = 0)")
        if normalize:
            if _param(params, fid, "std") != "bessel":
                _unsupported(fid, "std 'population': calculate_baseline_and_std_per_prompt uses the Bessel-corrected std")
            if _param(params, fid, "eps") != 1e-6 or _param(params, fid, "eps_placement") != "std":
                _unsupported(fid, "eps: GRPOAdvantageEstimator divides by std + 1e-6 (fixed)")
        rewards = inputs["rewards"]
        # the leave-one-out matrix is float32: NeMo-RL rewards are float32
        rewards = rewards.float()
        prompt_ids = inputs["group_ids"].reshape(-1, 1)
        # main reads a pydantic config's attributes, older revisions a dict's keys: give both
        est = adv.GRPOAdvantageEstimator(_Config(use_leave_one_out_baseline=False, normalize_rewards=normalize), {})
        a = est.compute_advantage(prompt_ids, rewards, torch.ones(rewards.shape[0], 1))
        return {"advantages": a[:, 0]}

    run.__name__ = fid.replace(".", "_")
    return run


# ----------------------------------------------------------------------------------------- dist

def dist_accumulate(inputs, params):
    """Micro-batch accumulation as NeMo-RL's workers do it: every micro-batch's loss is reduced with
    ClippedPGLossFn's reduction (masked_mean) over the global denominators the worker computes once
    per step (global_valid_toks = Σ token_mask·sample_mask, global_valid_seqs = Σ sample_mask), and
    the micro-batches' gradients are summed.  Token mean: masked_mean(x, mask, global_valid_toks);
    sample mean: masked_mean(masked_mean(x, token_mask, dim=-1), sample_mask, global_valid_seqs)."""
    import torch

    _, ut, _ = _modules()
    fid = "dist.accumulate"
    agg = _param(params, fid, "aggregator")
    if agg not in ("agg.token_mean", "agg.sample_mean"):
        _unsupported(fid, f"aggregator {agg!r}: NeMo-RL's loss reduces by a token mean or a sample mean")
    agg_params = params.get("agg_params") or {}
    if any(v is not None for v in agg_params.values()):
        _unsupported(fid, "agg_params: the global denominators are the step's own counts")
    x, m = _compute(inputs["values"]), inputs["mask"]
    B = x.shape[0]
    sizes = params.get("micro_batch_sizes") or [1] * B
    mf = m.to(x.dtype)
    n_tok = mf.sum()
    n_seq = torch.tensor(float(B), dtype=x.dtype)
    contributions, start = [], 0
    for size in sizes:
        xs, ms = x[start:start + size], mf[start:start + size]
        start += size
        if agg == "agg.token_mean":
            contributions.append(ut.masked_mean(xs, ms, global_normalization_factor=n_tok))
        else:
            sample_mask = torch.ones(xs.shape[0], dtype=x.dtype)
            contributions.append(ut.masked_mean(ut.masked_mean(xs, ms, dim=-1), sample_mask,
                                                global_normalization_factor=n_seq))
    c = torch.stack(contributions) if contributions else x.new_zeros((0,))
    return {"contributions": c, "total": c.sum()}


# ----------------------------------------------------------------------------------------- loss

_AGG = {"loss.grpo": "sample_mean", "loss.bnpo": "token_mean", "loss.gspo": "sample_mean"}


def _loss(fid):
    def run(inputs, params):
        import torch

        _require_null(params, fid, "is_log_ratio_clamp", "opsm_delta", "entropy_quantile")
        if fid != "loss.gspo":
            _require_null(params, fid, "log_ratio_clamp")
        else:
            _require_null(params, fid, "log_ratio_max")
        agg = _AGG.get(fid) or _param(params, fid, "aggregation")
        if agg not in ("token_mean", "sample_mean"):
            _unsupported(fid, f"aggregation {agg!r}: NeMo-RL's loss is a token mean (token_level_loss) or a sample mean")
        lp, old, m = _compute(inputs["logprobs"]), _compute(inputs["old_logprobs"]), inputs["mask"]
        adv = _compute(inputs["advantages"])
        cfg = {}
        if fid == "loss.cispo":
            if _param(params, fid, "cap_form") != "relative":
                _unsupported(fid, "cap_form 'absolute'")
            lo = _param(params, fid, "eps_low")
            cfg.update(use_cispo=True, ratio_clip_min=1.0 if lo is None else lo,
                       ratio_clip_max=_param(params, fid, "eps_high"))
        else:
            cfg.update(ratio_clip_min=_param(params, fid, "eps_low"), ratio_clip_max=_param(params, fid, "eps_high"))
        if fid == "loss.gspo":
            cfg.update(sequence_level_importance_ratios=True)
        cfg["token_level_loss"] = agg == "token_mean"
        beta = _param(params, fid, "beta")
        ref = None
        if beta:
            a, b = _param(params, fid, "kl_log_ratio_min"), _param(params, fid, "kl_log_ratio_max")
            c, d = _param(params, fid, "kl_output_min"), _param(params, fid, "kl_output_max")
            if (a is None) != (b is None) or (a is not None and a != -b) or (c is None) != (d is None) \
                    or (c is not None and c != -d):
                _unsupported(fid, "KL clamps: NeMo-RL's are symmetric")
            est = _param(params, fid, "kl_estimator")
            if est not in ("k1", "k2", "k3"):
                _unsupported(fid, f"kl_estimator {est!r}")
            cfg.update(reference_policy_kl_penalty=beta, reference_policy_kl_type=est, kl_input_clamp_value=b,
                       kl_output_clamp_value=d)
            ref = _compute(inputs["ref_logprobs"])
        gen = None
        level = _param(params, fid, "is_level")
        if level != "none":
            if _has_is_correction_level():
                # PR #2269: is_correction_level sets the IS weight's level for every loss
                cfg["is_correction_level"] = {"token": "token", "sequence": "sequence", "geometric": "sequence_mean"}[level]
            else:
                # NeMo-RL's IS weight is per token, except with sequence_level_importance_ratios
                # (GSPO), where it is the sequence product exp(Σ (prev - gen))
                expressible = "sequence" if fid == "loss.gspo" else "token"
                if level != expressible:
                    _unsupported(fid, f"is_level {level!r}: NeMo-RL's IS weight here is at the {expressible} level")
            hi, lo = _param(params, fid, "is_c_max"), _param(params, fid, "is_c_min")
            if hi is None and lo is None:
                cfg.update(use_importance_sampling_correction=True)  # the untruncated weight
            elif hi is None:
                _unsupported(fid, "is_c_max null with a lower bound: truncation needs truncated_importance_sampling_ratio")
            else:
                cfg.update(use_importance_sampling_correction=True,
                           truncated_importance_sampling_type="tis" if _param(params, fid, "is_mode") == "truncate" else "icepop",
                           truncated_importance_sampling_ratio=hi,
                           # icepop needs a lower bound; the weights are positive, so 0 is none
                           truncated_importance_sampling_ratio_min=lo or 0.0)
            gen = _compute(inputs["sampler_logprobs"])
        fn = _loss_fn(**cfg)
        B = m.shape[0]
        loss, _, _ = _run_loss(fn, lp, old, m, adv, gen=gen, ref=ref, valid_seqs=float(B),
                               valid_toks=float(m.sum()))
        return {"loss": loss}

    run.__name__ = fid.replace(".", "_")
    return run


IMPLEMENTATIONS = {
    "surrogate.ppo_clip": _surrogate("surrogate.ppo_clip"),
    "surrogate.dual_clip": _surrogate("surrogate.dual_clip"),
    "surrogate.cispo": _surrogate("surrogate.cispo"),
    "surrogate.gspo": surrogate_gspo,
    "kl.k1": _kl("kl.k1"),
    "kl.k2": _kl("kl.k2"),
    "kl.k3": _kl("kl.k3"),
    "kl.k3_unbiased": kl_k3_unbiased,
    "is.token.truncate": _is("is.token.truncate"),
    "is.token.mask": _is("is.token.mask"),
    "mask.geometric_sequence": mask_geometric_sequence,
    "dist.accumulate": dist_accumulate,
    "adv.group_normalized": _adv("adv.group_normalized"),
    "adv.group_centered": _adv("adv.group_centered"),
    "loss.grpo": _loss("loss.grpo"),
    "loss.bnpo": _loss("loss.bnpo"),
    "loss.dapo": _loss("loss.dapo"),
    "loss.cispo": _loss("loss.cispo"),
    "loss.gspo": _loss("loss.gspo"),
}


class NeMoRLAdapter(SourceAdapter):
    framework_modules = ("nemo_rl",)   # its exceptions are the framework's rejections (spec/verdicts.md)

    revisions = REVISIONS

    def load(self):
        return loader.load(self.source())


def _declarations_path(adapter):
    check = getattr(adapter, "check", None)
    if check is not None and check.revision is PR2269:
        return Path(__file__).with_name("deviations-pr2269.toml")
    return Path(__file__).with_name("deviations.toml")


def make_adapter():
    global ADAPTER
    a = NeMoRLAdapter(name="nemo_rl", framework=FRAMEWORK, version="no checkout", devices=("cpu", "cuda"),
                      dtypes=("float64", "float32", "bfloat16"), implementations=dict(IMPLEMENTATIONS))
    a.refresh_version()
    src = a.source()
    lf_path = src / loader.EXECUTED[0] if src is not None else None
    if lf_path is not None and lf_path.is_file() and "use_cispo" not in lf_path.read_text():
        # revisions before CISPO landed (the PR #2269 head) have no use_cispo
        for fid in ("surrogate.cispo", "loss.cispo"):
            a.implementations.pop(fid)
    a.deviations = load_deviations(_declarations_path(a))
    ADAPTER = a
    return a


ADAPTER = None
__all__ = ["make_adapter", "check_source", "REVISIONS"]
