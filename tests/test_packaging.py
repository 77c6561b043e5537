"""The distribution: wheel contents, namespace layout, console script, no torch in the reference."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (path,) = out.glob("pgspec-*.whl")
    return path


def test_wheel_file_list(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    # every module of the three subpackages, under pgspec/, and nothing at generic top level
    for folder, package in (("reference", "pgspec/reference"), ("conformance", "pgspec/conformance"),
                            ("adapters", "pgspec/adapters")):
        for src in (ROOT / folder).rglob("*.py"):       # the rooms' subpackages too (pyproject.toml lists each)
            rel = src.relative_to(ROOT / folder).as_posix()
            assert f"{package}/{rel}" in names, f"{package}/{rel} missing from the wheel"
    # the published data, where pgspec.conformance.corpus finds it
    for pattern in ("golden/*.json", "golden/MANIFEST", "presets/*.toml"):
        found = sorted((ROOT / "conformance").glob(pattern))
        assert found, pattern
        for src in found:
            rel = src.relative_to(ROOT / "conformance").as_posix()
            assert f"pgspec/conformance/{rel}" in names, f"pgspec/conformance/{rel} missing from the wheel"
    for src in (ROOT / "spec").glob("*.md"):
        assert f"pgspec/spec/{src.name}" in names, f"spec text {src.name} missing from the wheel"
    top = {n.split("/")[0] for n in names}
    assert top <= {"pgspec"} | {n for n in top if n.endswith(".dist-info")}, f"unexpected top-level entries: {top}"
    assert "pgspec/__init__.py" not in names  # a namespace package
    assert not any(n.startswith("pgspec/tests") or n.startswith("tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "pgspec = pgspec.conformance.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_reference_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import pgspec.reference as r\n"
        "assert len(r.REGISTRY) > 0\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_console_script_lists_formulas_as_json():
    out = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "formulas", "--json"],
                         check=True, capture_output=True, text=True).stdout
    data = json.loads(out)
    from pgspec.reference import REGISTRY

    assert [d["id"] for d in data] == sorted(REGISTRY)
    for d in data:
        for key in ("id", "family", "title", "inputs", "params", "outputs", "differentiable", "spec", "references"):
            assert key in d, f"{d['id']}: {key} missing"
        for p in d["params"]:
            assert {"name", "default", "range"} <= set(p)
        assert d["spec"].startswith(f"spec/{d['family']}.md#")
        assert d["references"], f"{d['id']}: no references"


def test_console_script_table_and_bad_glob():
    ok = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "formulas"], capture_output=True, text=True)
    assert ok.returncode == 0 and "ratio.token" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "formulas", "--formulas", "nope.*"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no formula matches" in bad.stderr
