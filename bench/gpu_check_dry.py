"""The CPU dry run of bench/gpu_check.sh: every row's command at tiny sizes, in one process.

    python bench/gpu_check_dry.py STEPS     (bash bench/gpu_check.sh --dry-run writes STEPS and calls this)

STEPS has one row a line, tab-separated: name, the row's TRITON_INTERPRET (1 or 0), kind (check, run or
bench) and the command's arguments (the script's own, with the dry run's sizes).  Each row runs
``pgspec check|run ARGS`` (pgspec.conformance.cli.main) or ``bench/logprob_oracle_cost.py ARGS``:

- with its own adapter where it is installed and runs on the CPU here (liger, liger-triton under the
  interpreter, trl: in Liger's or TRL's environment), in a child process with the row's TRITON_INTERPRET,
  as on the GPU;
- else (or for every row with GPU_CHECK_STANDINS=1: the test's quick run) with a stand-in (``make_standin``: the built-in torch backend, plus fused heads for logprob.token
  and every loss from hidden states, built from its formulas), in this process: the row's formula,
  parameters, shape, vocabulary, dtypes and oracle run all the same; only the kernel differs.

The dry run sets PGSPEC_LOGPROB_ORACLE=fused and TRITON_INTERPRET=1 where triton is importable, so the
log-prob rows run the fused oracle (the one CUDA gets) under the interpreter; where it is not, the rows run
the torch oracle and the bench rows time it instead of the fused one (without --compare).  Exit status 1 when a row
exits non-zero, with the rows listed.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
STANDIN = "gpu_check_dry:make_standin"


def make_standin():
    """The built-in torch backend with heads (check_logprob.HEAD_PROTOCOL, check_head_loss.HEAD_PROTOCOL)
    computed from its own formulas in the run's dtype: a correct kernel that stands in for a framework
    that is not installed here."""
    import torch

    from pgspec.conformance.check import head_loss as check_head_loss
    from pgspec.conformance.run import runner

    backend = runner.load_adapter("torch")
    a = copy.copy(backend)
    a.name = f"stand-in for {os.environ.get('PGSPEC_STANDIN_FOR', '?')} (torch backend)"

    def logprob_head(hidden, weight, targets, mask, params):
        x = hidden.detach().requires_grad_(True)
        with torch.enable_grad():
            l = backend.call("logprob.token", {"logits": x @ weight.T, "targets": targets, "mask": mask},
                             params)["logprobs"]
            (g,) = torch.autograd.grad(torch.where(mask, l, torch.zeros_like(l)).sum(), [x])
        return {"logprobs": l.detach(), "grad": {"hidden": g}}

    def loss_head(fid):
        def head(hidden, weight, targets, mask, old_logprobs, advantages, params, ref_logprobs=None,
                 sampler_logprobs=None):
            x = hidden.detach().requires_grad_(True)
            inputs = {"old_logprobs": old_logprobs.to(hidden.dtype), "advantages": advantages.to(hidden.dtype),
                      "mask": mask}
            for k, v in (("ref_logprobs", ref_logprobs), ("sampler_logprobs", sampler_logprobs)):
                if v is not None:
                    inputs[k] = v.to(hidden.dtype)
            with torch.enable_grad():
                l = backend.call("logprob.token", {"logits": x @ weight.T, "targets": targets, "mask": mask},
                                 {})["logprobs"]
                loss = backend.call(fid, {"logprobs": l, **inputs}, params)["loss"]
                (g,) = torch.autograd.grad(loss, [x])
            return {"loss": loss.detach(), "grad": {"hidden": g}}
        return head

    a.heads = {"logprob.token": logprob_head, **{f: loss_head(f) for f in check_head_loss.FORMULAS}}
    return a


def _adapter(args: list[str]) -> str:
    return args[args.index("--adapter") + 1] if "--adapter" in args else "torch"


def _runs_here(spec: str) -> tuple[bool, str]:
    from pgspec.conformance.run import runner

    try:
        a = runner.load_adapter(spec)
        ok, why = a.available()
        if ok:
            ok, why = a.device_available("cpu")
        return ok, why
    except Exception as e:  # noqa: BLE001 - not loadable here: a stand-in runs the row
        return False, f"{type(e).__name__}: {e}"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python bench/gpu_check_dry.py STEPS", file=sys.stderr)
        return 2
    sys.path.insert(0, str(HERE))
    from pgspec.conformance import cli

    import logprob_oracle_cost

    import importlib.util

    triton = importlib.util.find_spec("triton") is not None
    all_standins = os.environ.get("GPU_CHECK_STANDINS") == "1"
    rows = [line.rstrip("\n").split("\t") for line in Path(argv[1]).read_text().splitlines() if line.strip()]
    here, failed = {}, []
    t_all = time.perf_counter()
    for row in rows:
        name, interp, kind, *args = [f for f in row if f != ""]
        spec = _adapter(args)
        if spec != "torch" and spec not in here:
            here[spec] = _runs_here(spec)
        own = spec == "torch" or (here[spec][0] and not all_standins)
        if not own:
            args = [STANDIN if a == spec else a for a in args]
            os.environ["PGSPEC_STANDIN_FOR"] = spec
        how = ("its own adapter" if own else
               f"a stand-in ({'GPU_CHECK_STANDINS=1' if all_standins and here[spec][0] else here[spec][1]})")
        print(f"== {name}: {kind} {' '.join(args)}  [{how}]", flush=True)
        t = time.perf_counter()
        if kind == "bench":
            if not triton and "fused" in args:       # the fused oracle needs triton: its row runs the torch oracle
                args = ["torch" if a == "fused" else a for a in args if a != "--compare"]
                print("   (triton is not importable here: the torch oracle instead, no --compare)", flush=True)
            sys.argv = [args[0], *args[1:]]
            rc = logprob_oracle_cost.main()
        elif own and spec != "torch":
            env = {**os.environ, "TRITON_INTERPRET": interp}
            if interp != "1":       # a row outside the interpreter (Liger's fused loss): the torch oracle there
                env.pop("TRITON_INTERPRET")
                env.pop("PGSPEC_LOGPROB_ORACLE", None)
            rc = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", kind, *args], env=env).returncode
        else:
            rc = cli.main([kind, *args])
        print(f"   rc={rc} wall={time.perf_counter() - t:.1f} s", flush=True)
        if rc != 0:
            failed.append(f"{name} (rc {rc})")
    print(f"dry run: {len(rows)} rows in {time.perf_counter() - t_all:.1f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ", all exited 0"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
