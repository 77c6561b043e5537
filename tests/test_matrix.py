"""The committed conformance matrix and per-adapter reports are current with the golden corpus."""

from __future__ import annotations

from pathlib import Path

from pgspec.conformance.verdicts import matrix

DOCS = Path(__file__).resolve().parent.parent / "docs" / "conformance"
ADAPTERS = ("torch", "trl", "liger", "liger-triton", "verl", "openrlhf", "skyrl", "areal")


def test_committed_matrix_names_the_current_corpus():
    committed = matrix.committed_digest(DOCS / "matrix.md")
    assert committed is not None, f"{DOCS / 'matrix.md'} is missing or has no corpus digest line"
    assert committed == matrix.corpus_digest(), (
        "docs/conformance/matrix.md was made from another golden corpus; rerun `bash ci/conformance.sh` "
        "and commit docs/conformance/"
    )


def test_every_adapter_has_its_report_and_a_matrix_row():
    text = (DOCS / "matrix.md").read_text()
    for name in ADAPTERS:
        assert (DOCS / f"{name}.md").exists(), f"docs/conformance/{name}.md is missing"
        assert f"| {name} |" in text, f"no row for {name} in docs/conformance/matrix.md"


def test_every_committed_report_names_the_current_corpus():
    """Every report under docs/conformance (CI runs, recorded runs, variants) was made from this corpus."""
    digest = matrix.corpus_digest()
    reports = sorted(p for p in DOCS.glob("*.md") if p.name != "matrix.md")
    assert len(reports) >= len(ADAPTERS)
    # a page that withdraws a recording it could not remake carries no verdict to be stale
    withdrawn = [p for p in reports if matrix.withdrawn(p)]
    assert all(matrix.committed_digest(p) is None for p in withdrawn)
    # (only Fast-LLM's could be; it is recorded on Python 3.11 through the PEP 695 rewrite instead)
    assert {p.name for p in withdrawn} <= {"fast_llm.md", "fast_llm-pr502.md"}, [p.name for p in withdrawn]
    stale = [p.name for p in reports if p not in withdrawn and matrix.committed_digest(p) != digest]
    assert not stale, f"made from another golden corpus (rerun them and commit docs/conformance/): {stale}"
