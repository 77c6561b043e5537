"""The upstream findings (findings/README.md): one standalone script per declared bug, and their runner.

Every ``kind = "bug"`` rule written in an ``adapters/<dir>/deviations*.toml`` carries a ``name`` and has the
script ``findings/<adapter>/<name>.py`` (``<adapter>`` is ``<dir>`` for ``deviations.toml`` and
``<dir>-<suffix>`` for ``deviations-<suffix>.toml``), and every script there belongs to such a rule. The
scripts import neither pgspec nor anything outside the standard library, torch, numpy and the framework.
The checks are per adapter, so a framework whose scripts are missing fails on its own line.

The scripts themselves run in the frameworks' environments (ci/conformance.sh); here the runner's exit-code
logic is tested on small fake scripts.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FINDINGS = ROOT / "findings"
SLUG = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# the top-level modules a finding script may import besides the standard library and torch: its framework's
# (numpy only where the framework already needs it)
FRAMEWORK_MODULES = {
    "trl": {"trl"}, "verl": {"verl"}, "openrlhf": {"openrlhf"}, "skyrl": {"skyrl", "skyrl_train"},
    "areal": {"areal"}, "nemo_rl": {"nemo_rl"}, "slime": {"slime", "megatron"}, "liger": {"liger_kernel"},
    "fast_llm": {"fast_llm"}, "megatron": {"megatron"},
}
ALWAYS = {"torch", "numpy"}


def adapter_of(path: Path) -> str:
    """adapters/<dir>/deviations.toml -> <dir>; adapters/<dir>/deviations-<suffix>.toml -> <dir>-<suffix>."""
    stem = path.stem
    return path.parent.name if stem == "deviations" else f"{path.parent.name}-{stem[len('deviations-'):]}"


def bug_rules() -> dict[str, list[dict]]:
    """The bug rules written in each adapter's own deviations file (not those it inherits through extends)."""
    out: dict[str, list[dict]] = {}
    for path in sorted((ROOT / "adapters").glob("*/deviations*.toml")):
        rules = [r for r in tomllib.loads(path.read_text()).get("rule", []) if r.get("kind") == "bug"]
        if rules:
            out[adapter_of(path)] = rules
    return out


RULES = bug_rules()
FOLDERS = sorted(p.name for p in FINDINGS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
ADAPTERS = sorted(set(RULES) | set(FOLDERS))


def scripts_of(adapter: str) -> list[Path]:
    return sorted(p for p in (FINDINGS / adapter).glob("*.py") if not p.name.startswith("_"))


def test_the_conventions_see_the_bug_rules():
    """The scan above finds the declared bugs (a wrong glob would make every per-adapter test vacuous)."""
    assert {"trl", "verl", "liger", "liger-triton", "liger-compiled"} <= set(RULES)
    assert sum(len(r) for r in RULES.values()) >= 26


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_bug_rule_has_its_script_and_every_script_a_rule(adapter):
    rules = RULES.get(adapter, [])
    unnamed = [r["ids"] for r in rules if not r.get("name")]
    assert not unnamed, f"{adapter}: bug rules without a name (the script's slug): {unnamed}"
    names = [r["name"] for r in rules]
    bad = [n for n in names if not SLUG.match(n)]
    assert not bad, f"{adapter}: rule names must be slugs (lower case, digits, '-'): {bad}"
    assert len(set(names)) == len(names), f"{adapter}: two bug rules share a name: {names}"
    have = {p.stem for p in scripts_of(adapter)}
    missing = sorted(set(names) - have)
    assert not missing, f"{adapter}: no script findings/{adapter}/<name>.py for the bug rule(s) {missing}"
    orphans = sorted(have - set(names))
    assert not orphans, (f"{adapter}: findings/{adapter}/{{{','.join(orphans)}}}.py match no kind = \"bug\" rule "
                         "of its deviations file (drop the script when its bug is gone)")


def _imports(tree: ast.AST) -> set[str]:
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            mods.add(node.module.split(".")[0])
    return mods


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_scripts_are_standalone_and_documented(adapter):
    framework = FRAMEWORK_MODULES.get(adapter.split("-")[0], set())
    for script in scripts_of(adapter):
        tree = ast.parse(script.read_text(), filename=str(script))
        mods = _imports(tree)
        assert not any(m == "pgspec" for m in mods), f"{script.name}: imports pgspec"
        foreign = sorted(m for m in mods - ALWAYS - framework if m not in sys.stdlib_module_names)
        assert not foreign, f"{script.relative_to(ROOT)}: imports {foreign} (only the framework, torch and stdlib)"
        doc = ast.get_docstring(tree) or ""
        for key in ("Framework:", "Spec:", "Expected:", "Got:", "Source:", "Run:"):
            assert key in doc, f"{script.relative_to(ROOT)}: the docstring lacks {key!r} (findings/README.md)"
        assert re.search(r"spec/[a-z]+\.md#[a-z_]+\.[a-z0-9_.]+", doc), \
            f"{script.relative_to(ROOT)}: the docstring names no spec formula link spec/<family>.md#<id>"
        assert f"findings/{adapter}/{script.name}" in doc, f"{script.relative_to(ROOT)}: 'Run:' names another path"
        text = script.read_text()
        for needle in ("REPRODUCED", "FIXED", "sys.exit(2)"):
            assert needle in text, f"{script.relative_to(ROOT)}: no {needle!r} (the exit protocol)"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_every_script_has_its_report_in_docs_findings(adapter):
    """docs/findings.md holds, under each finding, a block "Report to file upstream" naming the script."""
    text = (ROOT / "docs" / "findings.md").read_text()
    blocks = text.split("Report to file upstream")[1:]
    missing = [p.name for p in scripts_of(adapter)
               if not any(f"findings/{adapter}/{p.name}" in b.split("\n#### ")[0] for b in blocks)]
    assert not missing, f"{adapter}: no 'Report to file upstream' block in docs/findings.md for {missing}"


# ------------------------------------------------------------------------------------------ the runner


@pytest.fixture
def runner(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("findings_run", FINDINGS / "run.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "ROOT", tmp_path)
    return mod


FAKE = {
    "reproduced": 'print("noise")\nprint("REPRODUCED: the bug (expected 1, got 2)")\nraise SystemExit(0)\n',
    "fixed": 'print("FIXED: the bug (expected 1, got 1)")\nraise SystemExit(1)\n',
    "cannot-run": 'print("ERROR: cannot import fw")\nraise SystemExit(2)\n',
    "crash": 'raise RuntimeError("boom")\n',                         # exit 1 but no FIXED line
    "silent-zero": 'print("all good")\n',                             # exit 0 but no REPRODUCED line
    "needs-source": ('import os, sys\nok = sys.argv[1:] == [os.environ.get("FINDINGS_SOURCE")] and sys.argv[1:]\n'
                     'print("REPRODUCED: source seen" if ok else "FIXED: no source")\nraise SystemExit(0 if ok else 1)\n'),
}


def _fake(root: Path, adapter: str, *kinds: str):
    folder = root / adapter
    folder.mkdir(parents=True, exist_ok=True)
    for k in kinds:
        (folder / f"{k}.py").write_text(FAKE[k])
    (folder / "_helper.py").write_text("raise SystemExit(3)\n")   # skipped: starts with "_"


def test_runner_exit_codes(runner, tmp_path, capsys):
    _fake(tmp_path, "ok", "reproduced")
    assert runner.main(["ok"]) == 0
    out = capsys.readouterr().out
    assert "reproduced" in out and "the bug (expected 1, got 2)" in out and "1 reproduced, 0 FIXED, 0 error" in out
    _fake(tmp_path, "one-fixed", "reproduced", "fixed")
    assert runner.main(["one-fixed"]) == 1
    assert "FIXED" in capsys.readouterr().out
    for kind in ("cannot-run", "crash", "silent-zero"):
        _fake(tmp_path, f"bad-{kind}", "reproduced", "fixed", kind)
        assert runner.main([f"bad-{kind}"]) == 2, kind           # an error outranks a fixed finding
        assert "error" in capsys.readouterr().out
    assert runner.main(["no-such-adapter"]) == 2


def test_runner_passes_the_source(runner, tmp_path):
    _fake(tmp_path, "git", "needs-source")
    assert runner.main(["git"]) == 1                              # without it the fake says FIXED
    assert runner.main(["git", "--source", str(tmp_path)]) == 0


def test_runner_writes_one_section_into_a_page(runner, tmp_path):
    _fake(tmp_path, "page", "reproduced", "fixed")
    page = tmp_path / "page.md"
    page.write_text("# report\n\nbody\n")
    assert runner.main(["page", "--markdown", str(page)]) == 1
    assert runner.main(["page", "--markdown", str(page)]) == 1    # rerun: the section is replaced, not repeated
    text = page.read_text()
    assert text.startswith("# report\n\nbody\n\n## Upstream findings")
    assert text.count("## Upstream findings") == 1
    assert "| `findings/page/fixed.py` | FIXED |" in text and "| `findings/page/reproduced.py` | reproduced |" in text


def test_conformance_script_runs_the_findings():
    text = (ROOT / "ci" / "conformance.sh").read_text()
    assert "findings/run.py" in text
