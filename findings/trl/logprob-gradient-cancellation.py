"""TRL chunked log-prob kernel: the log-prob gradient loses p's digits (backward exponentiates unshifted logits)

Framework: trl 1.16.0, trl.kernels.chunked_logprob.ChunkedLogProbFunction (the training log-probs of
GRPOTrainer's fused LM head), the backward of its torch path `_backward_tile` (CPU; the Triton kernel's
`_backward_kernel` computes the same expression); torch 2.13.0.
Spec: logprob.token, spec/logprob.md#logprob.token:
    log p_{t,y} = z'_{t,y} - log sum_v exp(z'_{t,v}),   z' = s z / tau,
    d log p_{t,y} / d z_{t,j} = (s / tau) (1[j = y] - p_{t,j}).
Input: one position, logits (0, 0, 2.625, 3.25) in float32 (an identity LM head), logit_scale s = 10,
temperature tau = 0.5 (z' = (0, 0, 52.5, 65)), target 0; the gradient of log p_0 w.r.t. logit 3.
Expected: -20 p_3 = -20 (1 - 3.7266e-6) = -19.999925 (torch's own float32 torch.log_softmax backward gives
-19.9999256, within 1e-8 relative).
Got: -20, a relative error of 3.7e-6 (39 float32 ulps of 20). The backward forms log_p = z' - log_z with the
unshifted logits z' and log Z = 65 + 3.7e-6 rounded in float32 (to 65), then p = exp(log_p): the rounding of
log Z, about 2^-24 |log Z|, becomes a relative error of p, so p_3 = 1 - 3.7e-6 becomes exactly 1. The error
grows with |log Z| (large logits, logit_scale, low temperature).
Fix: exponentiate the max-shifted logits, as the forward does: keep the row max m (or log(sum exp(z' - m))
next to m) from the forward and form log_p = (z' - m) - log(sum_exp) in the backward, so no float32
quantity of the size of log Z is differenced before exp.
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/kernels/chunked_logprob.py#L282

Run: python findings/trl/logprob-gradient-cancellation.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once TRL agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys

try:
    import torch
    import trl  # noqa: F401
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import trl/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def check():
    try:
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"cannot import trl.kernels.chunked_logprob: {e}") from e
    scale, temperature, target = 10.0, 0.5, 0
    logits = torch.tensor([[0.0, 0.0, 2.625, 3.25]], dtype=torch.float32, requires_grad=True)  # hidden states
    logps, *_ = ChunkedLogProbFunction.apply(logits, torch.eye(4), None, torch.tensor([target]), temperature,
                                             4096, None, scale, ())  # against an identity head: logits
    logps.sum().backward()
    got = logits.grad[0, 3].item()
    # the spec in plain float64: (s / tau) (1[j = y] - p_j) at j = 3
    z = logits.detach().double() * scale / temperature
    p = torch.softmax(z, -1)
    expected = (scale / temperature * (0.0 - p[0, 3])).item()  # -19.999925
    # float32 accuracy: a few ulps (torch.log_softmax's own float32 backward is within 1e-8 relative here)
    ok = abs(got - expected) <= 4 * torch.finfo(torch.float32).eps * abs(expected)
    return (not ok, "float32 gradient of log p_0 w.r.t. logit 3 at logits (0, 0, 2.625, 3.25), scale 10, "
            "temperature 0.5", f"{expected:.8g}", f"{got:.8g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
