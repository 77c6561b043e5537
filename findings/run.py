#!/usr/bin/env python3
"""Run every finding script of one adapter and say which bugs still reproduce.

    python3 findings/run.py ADAPTER [--python PY] [--source PATH] [--markdown PAGE] [--timeout S]

Runs each ``findings/<ADAPTER>/*.py`` (sorted; names starting with ``_`` are skipped) in the interpreter
``PY`` (default: this one), one process per script, from the repository root. ``--source PATH`` (the
framework's checkout, for git-only frameworks) is passed as the script's first argument and as the
environment variable ``FINDINGS_SOURCE``. Prints one line per script and a summary.

A script's contract (findings/README.md): exit 0 after printing ``REPRODUCED: ...`` (the bug is still
there), exit 1 after printing ``FIXED: ...`` (the framework now agrees with the spec), exit 2 (or anything
else) when it could not run. This runner trusts the pair (exit status, line) only when both agree; any
other combination is an error.

Exit status: 0 when every script reproduces its bug; 1 when at least one says FIXED (and none failed to
run); 2 when a script could not run, timed out or broke the contract, or the adapter has no scripts.

``--markdown PAGE`` also writes the results as a section "Upstream findings" at the end of the Markdown
page PAGE (the framework's docs/conformance page), replacing that section if the page has one already.

Standard library only: it runs in any framework's environment, or outside all of them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
SECTION = "## Upstream findings"
STATUS = {0: ("reproduced", "REPRODUCED:"), 1: ("FIXED", "FIXED:")}


def scripts(adapter: str) -> list[Path]:
    folder = ROOT / adapter
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))


def run_one(script: Path, python: str, source: str | None, timeout: float) -> tuple[str, str]:
    """(status, line): status is 'reproduced', 'FIXED' or 'error'."""
    env = dict(os.environ)
    argv = [python, str(script)]
    if source:
        env["FINDINGS_SOURCE"] = source
        argv.append(source)
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "error", f"timed out after {timeout:g} s"
    except OSError as e:
        return "error", f"could not start {python}: {e}"
    lines = [ln.strip() for ln in (proc.stdout or "").splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    if proc.returncode in STATUS:
        status, prefix = STATUS[proc.returncode]
        if last.startswith(prefix):
            return status, last[len(prefix):].strip()
        return "error", (f"exit {proc.returncode} without a '{prefix}' line; last output: "
                         f"{last or _tail(proc.stderr)!r}")
    return "error", f"exit {proc.returncode}: {last or _tail(proc.stderr)}"


def _tail(text: str | None) -> str:
    rows = [ln for ln in (text or "").splitlines() if ln.strip()]
    return rows[-1].strip() if rows else "(no output)"


def markdown(adapter: str, results: list[tuple[Path, str, str]], python: str) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out = [SECTION, "",
           f"The standalone scripts of `findings/{adapter}/` (the framework and torch only; one per declared bug,",
           "docs/findings.md has each as a report to file upstream; `ci/conformance.sh` runs them after the",
           f"framework's suite), last run on {when} with `{_short(python)}`. `reproduced`: the bug is still there;",
           "`FIXED`: the framework now agrees with the spec (drop the rule and the script).", "",
           "| script | status | result |", "|---|---|---|"]
    for script, status, line in results:
        cell = line.replace("`", "'").replace("|", "\\|")
        out.append(f"| `findings/{adapter}/{script.name}` | {status} | `{cell}` |")
    return "\n".join(out) + "\n"


def _short(python: str) -> str:
    """The interpreter as the page shows it: relative to the repository, else its last four parts (no
    machine-specific prefix)."""
    path = Path(python)
    try:
        return str(path.absolute().relative_to(REPO))
    except ValueError:
        return str(Path(*path.parts[-4:])) if len(path.parts) > 4 else python


def write_section(page: Path, section: str) -> None:
    text = page.read_text() if page.exists() else ""
    at = text.find("\n" + SECTION + "\n")
    if text.startswith(SECTION + "\n"):
        at = 0
    if at >= 0:
        text = text[:at]
    text = text.rstrip("\n") + ("\n\n" if text.strip() else "") + section
    page.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("adapter", help="the adapter name: the folder findings/<adapter>/")
    ap.add_argument("--python", default=sys.executable, help="the framework environment's interpreter")
    ap.add_argument("--source", help="the framework's checkout (git-only frameworks)")
    ap.add_argument("--markdown", type=Path, help="write the results as a section of this Markdown page")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per script (default 600)")
    args = ap.parse_args(argv)
    found = scripts(args.adapter)
    if not found:
        print(f"findings/run.py: no finding scripts under findings/{args.adapter}/", file=sys.stderr)
        return 2
    results = []
    for script in found:
        status, line = run_one(script, args.python, args.source, args.timeout)
        results.append((script, status, line))
        print(f"{status:10s} findings/{args.adapter}/{script.name}: {line}", flush=True)
    counts = {s: sum(1 for _, st, _ in results if st == s) for s in ("reproduced", "FIXED", "error")}
    print(f"findings/{args.adapter}: {counts['reproduced']} reproduced, {counts['FIXED']} FIXED, "
          f"{counts['error']} error(s) of {len(results)}")
    if counts["FIXED"]:
        print(f"findings/{args.adapter}: a bug no longer reproduces (FIXED above): the framework now agrees with "
              "the spec there; drop its rule from the adapter's deviations file, its script and its report in "
              "docs/findings.md")
    if args.markdown:
        write_section(args.markdown, markdown(args.adapter, results, args.python))
    if counts["error"]:
        return 2
    return 1 if counts["FIXED"] else 0


if __name__ == "__main__":
    sys.exit(main())
