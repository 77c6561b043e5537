"""Liger fused GRPO loss: a NaN hidden state at a padded position poisons the LM head's gradient

Framework: liger-kernel 0.8.5, the selective log-prob kernel of LigerFusedLinearGRPOLoss
(fused_linear_ppo._ChunkedSelectiveLogProbFunction), which scores every position, padded or not; torch 2.13.0.
Spec: logprob.token, spec/logprob.md#logprob.token, with the masking rule of spec/conventions.md (a masked
position's inputs are never read; the gradient there is exactly 0):
    l_t = z_{t, y_t} - log sum_v e^{z_{t,v}},  z_t = h_t W^T / tau   (only for unmasked t).
Input: two positions, hidden size 2, LM head W = I (2 x 2), targets (0, 0); position 1 is padding and its
hidden state is NaN (what an attention row with every key masked can produce); the caller keeps only the
unmasked log-prob: loss = l_0 (a torch.where on the mask, so the padded log-prob is never used).
Expected: gradient w.r.t. W finite, equal to that of position 0 alone; gradient w.r.t. the padded hidden state 0.
Got: NaN in the whole gradient of W and at the padded hidden state: the backward recomputes the padded row's
probabilities (NaN) and multiplies them by its zero cotangent (0 * NaN = NaN), and the weight gradient sums
over all rows.
Fix: score only the unmasked positions, as TRL's fused head does: call the kernel on
_input[attention_mask.bool()] and scatter the log-probs back (or zero grad_logits where grad_logprobs == 0).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/fused_linear_ppo.py#L119

Run: python findings/liger/logprob-masked-nonfinite.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once Liger agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys

try:
    import torch
    from liger_kernel.chunked_loss.fused_linear_ppo import _ChunkedSelectiveLogProbFunction
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import liger_kernel/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def check():
    f32 = torch.float32
    hidden = torch.tensor([[0.5, -1.0], [float("nan"), float("nan")]], dtype=f32, requires_grad=True)
    weight = torch.eye(2, dtype=f32, requires_grad=True)
    targets = torch.tensor([0, 0])
    mask = torch.tensor([True, False])
    logps = _ChunkedSelectiveLogProbFunction.apply(hidden, weight, targets, None, 1.0, 4096)
    torch.where(mask, logps, torch.zeros_like(logps)).sum().backward()
    # the spec in plain float64: only position 0 is read; d l_0 / d W = (onehot(y_0) - softmax(z_0)) h_0^T
    h0 = hidden.detach()[0].double()
    p = torch.softmax(h0, -1)
    expected_gw = torch.outer(torch.tensor([1.0, 0.0], dtype=torch.float64) - p, h0)
    got_gw, got_gh = weight.grad.double(), hidden.grad[1].tolist()
    ok = torch.allclose(got_gw, expected_gw, rtol=1e-5, atol=1e-7) and got_gh == [0.0, 0.0]
    return (not ok, "LM-head gradient with a NaN hidden state at a padded position",
            f"grad W {[[round(v, 6) for v in r] for r in expected_gw.tolist()]}, padded grad [0, 0]",
            f"grad W {weight.grad.tolist()}, padded grad {got_gh}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
