"""The README is the front door (issue 37): at most 150 lines, its install and test commands the
ones `.ci/run` runs, its first run the output `pgspec run` prints today, and every docs page it
sends a reader to exists."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SCRIPT = str(Path(sys.executable).parent / "pgspec")


def _section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_the_readme_is_at_most_150_lines():
    assert len(README.splitlines()) <= 150


def test_the_install_and_test_commands_are_those_ci_runs():
    """`.ci/run` runs the README's commands: each of its install and test lines is a line of the
    README's "Install and test" blocks, and the blocks hold nothing else."""
    ci = [ln.strip() for ln in (ROOT / ".ci/run").read_text().splitlines()
          if ln.strip().startswith(("python3 -m venv", "pip install", "python -m pytest"))]
    assert len(ci) == 3, ci
    shown = [ln.strip() for block in _blocks(_section("Install and test"), "bash") for ln in block.splitlines()
             if ln.strip()]
    assert shown == ci


def test_the_first_run_shown_is_the_output_of_today(tmp_path):
    """The annotated first run is what the command prints now (trailing spaces aside): a change to
    the table, the last line or the corpus of kl.* makes this fail until the README is updated.  The
    text under it counts kl.k3's results as the run's JSON report has them."""
    (block,) = _blocks(_section("A first run"), "console")
    command, *shown = block.rstrip("\n").splitlines()
    assert command == "$ pgspec run --formulas 'kl.*'"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "FORCE_COLOR")}
    env.update(COLUMNS="100", NO_COLOR="1", TERM="dumb")
    r = subprocess.run([SCRIPT, "run", "--formulas", "kl.*", "--report", f"json:{tmp_path}/r.json"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [ln.rstrip() for ln in r.stdout.rstrip("\n").splitlines()] == [ln.rstrip() for ln in shown]

    rows = [x for x in json.loads((tmp_path / "r.json").read_text())["results"]
            if x["formula"] == "kl.k3" and x["category"] != "error"]
    dtypes = {x["dtype"] for x in rows}
    cases = {x["case_id"] for x in rows if x["category"] != "property"}
    props = {x["case_id"] for x in rows if x["category"] == "property"}
    assert len(rows) == (len(cases) + len(props)) * len(dtypes)
    claim = f"`kl.k3`'s {len(rows)} are {len(cases)} cases × {len(dtypes)} dtypes and {len(props)} property checks × {len(dtypes)} dtypes"
    assert claim in " ".join(README.split())


def test_the_pages_the_readme_names_exist_and_are_in_the_site():
    index = (ROOT / "docs/index.md").read_text()
    named = re.findall(r"`(docs/[\w/-]+\.md|spec/[\w-]+\.md)`", README)
    assert len(named) >= 8, named
    for path in named:
        assert (ROOT / path).is_file(), path
        if path.startswith("docs/") and path.count("/") == 1:
            assert f"\n{Path(path).stem}\n" in index, f"{path} is in no toctree of docs/index.md"
