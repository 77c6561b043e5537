"""bench/gpu_check.sh --dry-run: every row of the GPU script at tiny sizes on the CPU (bench/gpu_check_dry.py), so that
a GPU session does not spend its device time on a row whose command is wrong.  About 5 s of work."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _env(out):
    # stand-ins for every framework, installed or not: the rows' commands, quickly (ci/conformance.sh runs the dry
    # run with Liger's own kernels in its environment)
    return {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHON_TRL": sys.executable,
            "GPU_CHECK_STANDINS": "1"}


def _names(listing: str) -> list[str]:
    return [line.split(":", 1)[0] for line in listing.splitlines() if line.strip()]


def _rows(names):
    """The rows without their sizes (a name ends with its B x T where the size is the row's)."""
    return [re.sub(r"-\d+x\d+$", "", n) for n in names]


def test_the_dry_run_runs_every_row_of_the_full_script(tmp_path):
    full = subprocess.run(["bash", str(SCRIPT), "--list"], capture_output=True, text=True, env=_env(tmp_path),
                          timeout=60, check=True).stdout
    dry = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, env=_env(tmp_path),
                         timeout=600)
    assert dry.returncode == 0, dry.stdout[-4000:] + dry.stderr[-2000:]
    names = [line.split("\t")[0] for line in (tmp_path / "steps.tsv").read_text().splitlines()]
    assert _rows(names) == _rows(_names(full)) and len(names) >= 30
    assert "all exited 0" in dry.stdout
    for name in names:
        if name.startswith("run-"):
            doc = json.loads((tmp_path / "runs" / f"{name}.json").read_text())
            assert doc["device"] == "cpu" and doc["results"]
        elif name.startswith("fused-oracle"):
            assert f"== {name}: bench" in dry.stdout
        else:
            doc = json.loads((tmp_path / f"{name}.json").read_text())
            results = doc if isinstance(doc, list) else [doc]
            assert results and all(r["outcome"] == "pass" and r["device"] == "cpu" for r in results), name
    # the fused oracle's own rows: its agreement with the torch oracle and its time beside the kernel's
    assert re.search(r"oracle (fused|torch) / kernel", dry.stdout)
    if _has_triton():       # the fused oracle under Triton's interpreter, else the torch one (gpu_check_dry.py)
        assert ": agree" in dry.stdout and "oracle fused / kernel" in dry.stdout


def _has_triton():
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def test_the_dry_run_fails_when_a_row_fails(tmp_path):
    """A row whose command is wrong (--vocab 1) and one whose kernel is wrong (logprob.token through a head that
    drops part of the vocabulary would need a framework: a bad argument is the wrong command the dry run exists
    to catch) make the driver exit 1 and name them; a good row beside them still runs."""
    steps = tmp_path / "steps.tsv"
    rows = [["good", "0", "check", "--formula", "loss.grpo", "--param", "beta=0", "--shape", "2x16",
             "--adapter", "torch", "--json", str(tmp_path / "good.json")],
            ["bad-vocab", "0", "check", "--formula", "logprob.token", "--vocab", "1", "--shape", "2x16"],
            ["bad-option", "0", "check", "--formula", "loss.grpo", "--shapes", "2x16"]]
    steps.write_text("".join("\t".join(r) + "\t\n" for r in rows))
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check_dry.py"), str(steps)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1
    assert "failed: bad-vocab (rc 2), bad-option (rc 2)" in r.stdout
    doc = json.loads((tmp_path / "good.json").read_text())
    assert [r["outcome"] for r in (doc if isinstance(doc, list) else [doc])] == ["pass"]
