"""Liger LUSPO loss: padded tokens enter the loss and get gradient (the pre-trl#6654 formula)

Framework: liger-kernel 0.8.5, LigerFusedLinearGRPOFunction.ppo_loss_fn with loss_type="luspo" (chunked
and fused paths; at importance_sampling_level="token", TRL's default, or with beta > 0); torch 2.13.0.
Spec: loss.luspo, spec/loss.md#loss.luspo:
    L = (1/N) sum_i sum_t m_{i,t} term_{i,t}   (ratio_level = token: term = the token PPO clip loss);
    on policy d L / d l_{i,t} = -A_i / N at unmasked tokens, 0 at padded ones.
Input: the spec's worked example: on policy, A = (1, -1), lengths 2 and 1 (T = 2), epsilon 0.2,
importance_sampling_level="token".
Expected: loss -0.5, gradient ((-0.5, -0.5), (0.5, 0)).
Got: loss -0.5 but gradient ((-0.5, -0.5), (0.25, 0.25)): the loss is
(per_token_loss * L_i).sum() / (B * T) with the per-token loss not masked, so the padded token (1, 1) enters
and gets gradient, and every token of row i is scaled by L_i / T instead of 1 (TRL fixed the same formula in
trl#6654).
Fix: loss = (per_token_loss * attention_mask).sum(-1).sum() / full_attention_mask.shape[0] (TRL's
(per_token_loss * mask).sum(-1).mean()).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/grpo_loss.py#L242-L245,
https://github.com/huggingface/trl/pull/6654

Run: python findings/liger/luspo-unmasked-padding.py
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
    logps = torch.tensor([[-1.0, -2.0], [-0.5, -1.0]], dtype=f64, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    A = torch.tensor([1.0, -1.0], dtype=f64)
    loss = ppo_loss(logps, mask, A, logps.detach().clone(), loss_type="luspo", epsilon_low=0.2, epsilon_high=0.2)
    loss.backward()
    # the spec in plain float64: on policy every unmasked term is -A_i (r = 1), gradient -A_i / N at those tokens
    m = mask.to(f64)
    N = (m.sum(-1) > 0).sum()
    expected_loss = ((-A[:, None] * m).sum() / N).item()  # -0.5
    expected_grad = (-A[:, None] * m / N).tolist()  # ((-0.5, -0.5), (0.5, 0))
    got_loss, got_grad = loss.item(), logps.grad.tolist()
    ok = abs(got_loss - expected_loss) <= 1e-12 and all(
        abs(g - e) <= 1e-12 for gr, er in zip(got_grad, expected_grad) for g, e in zip(gr, er))
    return (not ok, "token-level LUSPO with one padded token", f"loss {expected_loss:g}, grad {expected_grad}",
            f"loss {got_loss:g}, grad {got_grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
