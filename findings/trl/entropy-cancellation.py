"""TRL chunked log-prob kernel: the entropy of a near-deterministic row is 0 (cancellation on unshifted logits)

Framework: trl 1.16.0, trl.kernels.chunked_logprob.ChunkedLogProbFunction (the training log-probs and
entropies of GRPOTrainer's fused LM head), its torch path (CPU; the Triton kernel computes the same
expression); torch 2.13.0.
Spec: logprob.entropy, spec/logprob.md#logprob.entropy:
    H_t = -sum_v p_{t,v} log p_{t,v},   p_t = softmax(z_t / tau).
Input: one position, logits (20, 0) in float32 (an identity LM head), temperature 1.
Expected: H = log(1 + e^-20) + 20 e^-20 / (1 + e^-20) = 4.3284e-8 (torch's own float32
-(softmax * log_softmax).sum() gives 4.1223e-8, within 5%).
Got: 0. The kernel computes H = log Z - sum(e^(z - m) z) / sum(e^(z - m)) with the unshifted logits z:
log Z = 20.000000002 and the weighted mean 19.99999996 both round to 20 in float32, and the difference
(the whole entropy) is lost. Entropy-based token masks (top_entropy_quantile) and the entropy bonus get 0, or
a value without a correct digit, at near-deterministic positions; the gradient -p (log p + H) inherits the error.
Fix: accumulate the shifted logits, sum(e^(z - m) (z - m)), rescaling the running sum when the running max m
changes, and return H = log(sum_exp) - x_sum_exp / sum_exp (the shift then cancels exactly).
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/kernels/chunked_logprob.py#L380

Run: python findings/trl/entropy-cancellation.py
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
    logits = torch.tensor([[20.0, 0.0]], dtype=torch.float32)  # hidden states against an identity head
    _, ent, *_ = ChunkedLogProbFunction.apply(logits, torch.eye(2), None, torch.zeros(1, dtype=torch.long), 1.0,
                                              4096, None, 1.0, ("entropy",))
    # the spec in plain float64
    z = logits.double()
    expected = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum().item()  # 4.3284e-8
    got = ent.item()
    ok = abs(got - expected) <= 0.1 * expected  # torch's own float32 formula is within 5% here
    return (not ok, "float32 entropy of logits (20, 0)", f"{expected:.5g}", f"{got:.5g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
