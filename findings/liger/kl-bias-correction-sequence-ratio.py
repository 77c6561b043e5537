"""Liger GRPO loss: at importance_sampling_level="sequence" the KL bias correction weighs every token by the sequence ratio (as trl#6586)

Framework: liger-kernel 0.8.5, LigerFusedLinearGRPOFunction.ppo_loss_fn with importance_sampling_level=
"sequence" (GSPO, LUSPO), beta > 0 and use_bias_correction_kl=True; torch 2.13.0. The same behaviour is
tracked as a bug in TRL (trl#6586, open), which Liger mirrors.
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased, inside loss.gspo, spec/loss.md#loss.gspo:
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ l^GSPO_i + beta kl_{i,t} ],  kl_{i,t} = w_{i,t} k3(l_ref - l),
    w_{i,t} = e^(l_{i,t} - l_old_{i,t})   (each token's own ratio, DeepSeek-V3.2 Eq. 7).
Input: the spec's worked example of kl.k3_unbiased as one sequence: l = (-1, -2), l_old = (-1.25, -2),
l_ref = (-1.5, -1), A = 0 (no policy term), beta = 1, loss_type="grpo", importance_sampling_level="sequence".
Expected: loss = mean_t w_t k3_t = (0.13678807 + 0.71828183) / 2 = 0.42753495.
Got: 0.46732: kl_div * torch.exp(log_importance_weights), which at sequence level is the (B, 1) geometric-mean
ratio e^0.125.
Fix: kl_div = kl_div * torch.exp(log_ratio) (the token log-ratio computed above) instead of
torch.exp(log_importance_weights).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/grpo_loss.py#L216,
https://github.com/huggingface/trl/issues/6586

Run: python findings/liger/kl-bias-correction-sequence-ratio.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once Liger agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys

try:
    import torch
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import liger_kernel/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def ppo_loss(logps, mask, advantages, old_logps, **cfg):
    """Liger's GRPO loss math on given log-probs: LigerFusedLinearGRPOFunction.ppo_loss_fn, the function
    LigerFusedLinearGRPOLoss applies to the log-probs of its LM head (and torch.compile's unit)."""
    cfg.setdefault("beta", 0.0)
    loss, _ = LigerFusedLinearGRPOFunction.ppo_loss_fn(
        per_token_logps=logps, attention_mask=mask, advantages=advantages, full_attention_mask=mask,
        old_per_token_logps=old_logps, **cfg)
    return loss


def check():
    f64 = torch.float64
    logps = torch.tensor([[-1.0, -2.0]], dtype=f64, requires_grad=True)
    old = torch.tensor([[-1.25, -2.0]], dtype=f64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=f64)
    loss = ppo_loss(logps, torch.tensor([[1, 1]]), torch.tensor([0.0], dtype=f64), old, loss_type="grpo", beta=1.0,
                    ref_per_token_logps=ref, importance_sampling_level="sequence", use_bias_correction_kl=True,
                    epsilon_low=3e-4, epsilon_high=4e-4)
    # the spec in plain float64: each token's k3 weighted by its own ratio, token mean of the sequence
    x = ref - logps.detach()
    expected = (torch.exp(logps.detach() - old) * (torch.exp(x) - x - 1)).mean().item()  # 0.42753495
    got = loss.item()
    ok = abs(got - expected) <= 1e-12 * abs(expected)
    return (not ok, "GSPO loss with beta=1, use_bias_correction_kl=True", f"{expected:.10g}", f"{got:.10g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
