"""The Fast-LLM adapter, loaded from a checkout (PGSPEC_FAST_LLM_SOURCE) in a Python >= 3.12 worker
(PGSPEC_FAST_LLM_PYTHON), or in this Python 3.11 through pgspec's PEP 695 rewrite
(PGSPEC_FAST_LLM_COMPAT=pep695); skips cleanly without them (adapters/fast_llm/README.md)."""

from __future__ import annotations

import os
import sys

import pytest

from pgspec.conformance.run import runner

SOURCE = os.environ.get("PGSPEC_FAST_LLM_SOURCE")
COMPAT = os.environ.get("PGSPEC_FAST_LLM_COMPAT") == "pep695"
PYTHON = os.environ.get("PGSPEC_FAST_LLM_PYTHON") or (sys.executable if COMPAT else None)


def test_unavailable_without_a_checkout_names_the_clone_command(monkeypatch):
    monkeypatch.delenv("PGSPEC_FAST_LLM_SOURCE", raising=False)
    ok, why = runner.load_adapter("fast_llm").available()
    assert not ok
    assert "git clone https://github.com/ServiceNow/Fast-LLM" in why
    assert "7d61a1ba2047814955f8acc1cde7bc10a68fa198" in why


needs_source = pytest.mark.skipif(not (SOURCE and PYTHON),
                                  reason="no Fast-LLM checkout and Python 3.12 worker: set PGSPEC_FAST_LLM_SOURCE and "
                                         "PGSPEC_FAST_LLM_PYTHON, or PGSPEC_FAST_LLM_COMPAT=pep695 "
                                         "(adapters/fast_llm/README.md)")


@pytest.fixture(scope="module")
def adapter():
    from pgspec.conformance.run.isolated import IsolatedAdapter

    a = IsolatedAdapter(PYTHON, "fast_llm")
    ok, why = a.available()
    if not ok:
        pytest.skip(why)
    yield a
    a.close()


@needs_source
@pytest.mark.parametrize("case_id", ["loss.bnpo/worked-example", "loss.dapo/worked-example-token-mean", "loss.bnpo/random-1"])
def test_grpo_value_and_hand_written_gradient_pass_in_float32(adapter, case_id):
    r = adapter.run_case(runner.load_case(case_id), "float32", "cpu")
    assert r.outcome == "pass", r.message
    assert r.compared > 1  # the loss and Fast-LLM's gradient


@needs_source
def test_gspo_is_length_proportional(adapter):
    r = adapter.run_case(runner.load_case("loss.gspo/worked-example"), "float32", "cpu")
    assert r.outcome == "convention", r.message


@needs_source
@pytest.mark.parametrize("case_id", ["surrogate.gspo_document/three-documents",
                                     "surrogate.gspo_document/random-packed",
                                     "surrogate.gspo_document/masked-nan-inf"])
def test_packed_multi_document_gspo_passes_in_float32(adapter, case_id):
    """GSPO over packed rows with several documents (one spans two rows in random-packed): the
    per-document weighted losses and Fast-LLM's hand-written gradient."""
    r = adapter.run_case(runner.load_case(case_id), "float32", "cpu")
    assert r.outcome == "pass", r.message
    assert r.compared > 3


@needs_source
def test_packed_gspo_long_document_float32_accumulation_is_declared(adapter):
    r = adapter.run_case(runner.load_case("surrogate.gspo_document/scale-8192"), "float32", "cpu")
    assert r.outcome == "convention", r.message
    assert "index_add_" in r.declaration["reason"]


def test_recorded_reports_name_the_current_corpus_or_are_withdrawn():
    """A Fast-LLM page is a run recorded against the current corpus, or a page that withdraws the last
    recording and says why (no verdict, no digest, and no column in the matrix): never a stale run."""
    from pathlib import Path

    from pgspec.conformance.verdicts import matrix

    docs = Path(__file__).resolve().parent.parent / "docs" / "conformance"
    for name in ("fast_llm.md", "fast_llm-pr502.md"):
        committed = matrix.committed_digest(docs / name)
        if matrix.withdrawn(docs / name):
            text = (docs / name).read_text()
            assert committed is None and "## Verdict per formula" not in text and "Why it was not re-recorded" in text
            assert not (docs / "recorded" / "fast_llm.json").exists()
            continue
        assert committed is not None, f"docs/conformance/{name} is missing or names no corpus digest"
        assert committed == matrix.corpus_digest(), (
            f"docs/conformance/{name} was recorded against another golden corpus: rerun the recorded run "
            "(adapters/fast_llm/README.md) and commit the report")


@needs_source
def test_sdp_gspo_over_gloo_adds_up_to_one_rank():
    """Sequence-data-parallel GSPO: 2 ranks in a gloo group (adapters/fast_llm/sdp_gloo.py)."""
    import subprocess

    from pgspec.conformance.run.isolated import _pgspec_path_dir

    code = r'''
import sys, torch
from pgspec.adapters.fast_llm import sdp_gloo
if __name__ == "__main__":
    g = torch.Generator().manual_seed(1)
    T = 11
    docs = [[0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2]]
    mask = [[True, True, False, True, True, True, True, False, True, True, True]]
    lp = -torch.rand(1, T, generator=g, dtype=torch.float64) * 2 - 0.01
    old = lp + 0.2 * torch.randn(1, T, generator=g, dtype=torch.float64)
    adv = [[1.0] * 4 + [-0.5] * 5 + [2.0] * 2]
    data = dict(lp=lp.tolist(), old=old.tolist(), adv=adv, docs=docs, mask=mask, eps=(0.2, 0.28))
    ranks, (l1, g1) = sdp_gloo.run(sys.argv[1], data, sdp_size=2)
    assert len(ranks) == 2 and all(abs(v[0]) > 1e-6 for v in ranks.values()), ranks
    total = sum(v[0] for v in ranks.values())
    grad = [x for r in sorted(ranks) for x in ranks[r][1][0]]
    gd = max(abs(a[0] - b[0]) + abs(a[1] - b[1]) for a, b in zip(grad, g1[0]))
    assert abs(total - l1) <= 1e-12 * max(1.0, abs(l1)) and gd <= 1e-12, (ranks, l1, gd)
    print("ok")
'''
    env = dict(os.environ, PYTHONPATH=_pgspec_path_dir())
    out = subprocess.run([PYTHON, "-c", code, SOURCE], capture_output=True, text=True, timeout=900, env=env)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.skipif(not (SOURCE and COMPAT and sys.version_info < (3, 12)),
                    reason="the PEP 695 rewrite of a checkout: set PGSPEC_FAST_LLM_SOURCE and PGSPEC_FAST_LLM_COMPAT=pep695")
def test_the_rewrite_keeps_every_statement_of_the_checkout_on_its_line(adapter):
    """Every fast_llm file that the rewrite handles compiles on this Python with each def and class on
    its own line (tracebacks and links name the file's lines); the one it does not handle fails naming
    its line; and the version string says the run went through the rewrite."""
    import ast
    import re
    from pathlib import Path

    from pgspec.adapters.fast_llm import pep695

    done, refused = 0, []
    for path in sorted(Path(SOURCE, "fast_llm").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        try:
            new, _ = pep695.rewrite(source, str(path))
        except pep695.RewriteError as e:
            refused.append((path.relative_to(SOURCE).as_posix(), str(e)))
            continue
        got = sorted((n.lineno, n.name) for n in ast.walk(ast.parse(new))
                     if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)))
        want = sorted((i + 1, m.group(1)) for i, line in enumerate(source.splitlines())
                       if (m := re.match(r"\s*(?:async\s+)?(?:def|class)\s+(\w+)", line)))
        assert got == want, path
        done += 1
    assert done > 200
    # at 7d61a1ba and the PR #502 head: a backslash in an f-string expression (not on the loss path)
    assert [p for p, _ in refused] == ["fast_llm/data/dataset/sampled.py"], refused
    assert "line 193: backslash in an f-string expression" in refused[0][1]
    assert "through pgspec's line-preserving PEP 695 rewrite" in adapter.version
