"""The install recipes and the scripts around them, as a newcomer meets them: ci/conformance.sh
needs nothing but python3 (it installs pgspec for itself), the Fast-LLM worker's Python 3.12
environment gets the CPU build of torch, and harness_overhead_frameworks.py prints a figure with
--repeat 1.  (ci/conformance.sh itself installs every framework and is not run here.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands(script: str) -> list[str]:
    return [line.strip() for line in script.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_conformance_sh_installs_pgspec_and_never_needs_it_on_the_path():
    """It ran `pgspec run` and `python -m pgspec.conformance.matrix` from the caller's PATH, which a
    fresh clone does not have."""
    lines = _commands((ROOT / "ci/conformance.sh").read_text())
    assert any('python3 -m venv "$main"' in ln and 'pip" install -q -c constraints.txt -e ".[torch]"' in ln
               for ln in lines), lines
    for ln in lines:
        assert not re.match(r"(TRITON_INTERPRET=1 )?pgspec ", ln), ln           # a bare pgspec from the PATH
        assert not re.match(r"python3? -m pgspec", ln), ln
    assert any(ln.startswith('"$main/bin/python" -m pgspec.conformance.matrix') for ln in lines)
    assert sum('"$pgspec" run' in ln for ln in lines) == 2      # the torch run and the isolated ones


def test_the_fast_llm_recipe_takes_torch_from_the_cpu_index():
    """Python 3.12 has no CPU wheel of torch on these machines' disk, and PyPI's default Linux torch is the
    CUDA build: the recipe installed several GB of nvidia-* packages."""
    readme = (ROOT / "adapters/fast_llm/README.md").read_text()
    recipe = readme.split("## Recipe")[1].split("```")[1]
    assert "bash ci/install-fast_llm.sh fast-llm-venv" in recipe
    assert not re.search(r"pip install[^\n]*torch", recipe), recipe
    script = (ROOT / "ci/install-fast_llm.sh").read_text()
    torch_lines = [ln for ln in _commands(script) if re.search(r"\btorch==2\.13\.0\b", ln) and "PIP" in ln]
    assert torch_lines and all('--index-url "$TORCH_CPU_INDEX"' in ln for ln in torch_lines), torch_lines
    # the version pin alone (torch==2.13.0) is met by PyPI's CUDA build too, from any extra index a
    # pip.conf adds: the recipe names the CPU build's own version, which no CUDA wheel carries
    assert all('"torch==2.13.0+cpu"' in ln for ln in torch_lines), torch_lines
    assert "torch-2.13.0+cpu-cp312-*.whl)" in script        # a TORCH_WHEEL of another build is refused
    assert "https://download.pytorch.org/whl/cpu" in script and "torch.version.cuda is None" in script
    assert '"nvidia-"' in script and "CUDA packages in the Fast-LLM environment" in script
    assert subprocess.run(["bash", "-n", str(ROOT / "ci/install-fast_llm.sh")]).returncode == 0


def test_one_harness_run_prints_the_line_the_frameworks_table_reads(tmp_path):
    """`harness_overhead_frameworks.py --repeat 1` printed no figure: one run of harness_overhead.py
    printed no 'median of' line."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import harness_overhead_frameworks as frameworks
    finally:
        sys.path.remove(str(ROOT / "bench"))
    r = subprocess.run([sys.executable, str(ROOT / "bench/harness_overhead.py"), "--adapter", "torch", "--repeat", "1",
                        "--formulas", "kl.k1", "--dtype", "float64", "--no-properties"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    figures = frameworks.medians(r.stdout)
    assert figures is not None, r.stdout
    assert {"wall", "adapter", "ratio", "ratio with the import", "harness"} <= set(figures)
    assert figures["wall"] > 0 and figures["adapter"] >= 0     # printed to 2 decimals: kl.k1 takes ms
