"""The house's rules (docs/architecture.md): the rooms of pgspec.conformance, the adapters and the
reference import one way (the import-linter contracts in .importlinter), no module imports itself
through a circle, and no module outgrows a reader (800 lines; case tables excepted)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is in the [dev] extra")
import grimp  # noqa: E402
from importlinter.application import use_cases  # noqa: E402
from importlinter.application.app_config import settings  # noqa: E402
from importlinter.configuration import configure  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONFIG = str(ROOT / ".importlinter")
ROOTS = ("pgspec.reference", "pgspec.conformance", "pgspec.adapters")
MAX_LINES = 800
# generated data and case tables: plain lists of golden cases, one module per family
LONG_ALLOWED = ("conformance/corpus/cases/",)


def _report(extra_import=None):
    """import-linter's report on this checkout; ``extra_import``: (importer, imported) added to the
    graph, as if a module had that import."""
    configure()
    use_cases._register_built_in_contract_types()      # as lint-imports does before it reads the contracts
    builder = settings.GRAPH_BUILDER
    if extra_import is not None:
        class Adding:
            def build(self, **kw):
                graph = builder.build(**kw)
                graph.add_import(importer=extra_import[0], imported=extra_import[1], line_number=1,
                                 line_contents=f"import {extra_import[1]}")
                return graph

        settings.configure(GRAPH_BUILDER=Adding())
    try:
        return use_cases.create_report(use_cases.read_user_options(CONFIG), cache_dir=None)
    finally:
        settings.configure(GRAPH_BUILDER=builder)


def _broken(report, capsys) -> str:
    """The broken contracts as lint-imports prints them (each names the importer and the imported)."""
    capsys.readouterr()
    for contract, check in report.get_contracts_and_checks():
        if not check.kept:
            print(contract.name)
            contract.render_broken_contract(check)
    return capsys.readouterr().out


def test_the_import_contracts_hold(capsys):
    report = _report()
    assert not report.contains_failures, _broken(report, capsys)
    assert len(list(report.get_contracts_and_checks())) >= 3


@pytest.mark.parametrize("importer, imported", [
    ("pgspec.conformance.corpus.golden", "pgspec.conformance.run.runner"),        # the corpus reaching up
    ("pgspec.conformance.judge.tolerance", "pgspec.conformance.verdicts.declarations"),
    ("pgspec.adapters.trl", "pgspec.conformance.run.runner"),                     # an adapter into the run
    ("pgspec.adapters.trl", "pgspec.adapters.verl"),                              # adapters into each other
    ("pgspec.reference.kl", "pgspec.conformance.corpus.golden"),                  # the reference into anything
    ("pgspec.reference.kl", "torch"),
])
def test_a_new_upward_import_breaks_a_contract_naming_the_pair(importer, imported, capsys):
    report = _report((importer, imported))
    assert report.contains_failures
    text = " ".join(_broken(report, capsys).split())
    assert importer in text and imported.split(".")[-1] in text, text


def _graph():
    return grimp.build_graph(*ROOTS, cache_dir=None)


def _cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    modules = sorted(graph.modules)
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in graph.modules:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_circle():
    """Function-level imports count: a circle of lazy imports is still two modules that need each other."""
    graph = _graph()
    cycles = _cycles(graph)
    detail = []
    for comp in cycles:
        edges = [f"{a} -> {b}" for a in comp for b in sorted(graph.find_modules_directly_imported_by(a)) if b in comp]
        detail.append("\n  ".join(edges))
    assert not cycles, "import circles:\n  " + "\n\n  ".join(detail)


def test_the_cycle_finder_sees_a_circle():
    graph = _graph()
    graph.add_import(importer="pgspec.conformance.corpus.golden", imported="pgspec.conformance.run.runner")
    assert any("pgspec.conformance.corpus.golden" in c and "pgspec.conformance.run.runner" in c for c in _cycles(graph))


def _long_modules(root: Path) -> list[str]:
    out = []
    for folder in ("conformance", "adapters", "reference"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if any(rel.startswith(a) for a in LONG_ALLOWED):
                continue
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                out.append(f"{rel}: {n} lines")
    return out


def test_no_module_over_800_lines():
    assert not _long_modules(ROOT), _long_modules(ROOT)


def test_the_length_rule_sees_a_long_module(tmp_path):
    (tmp_path / "conformance" / "judge").mkdir(parents=True)
    (tmp_path / "conformance" / "judge" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "conformance" / "corpus" / "cases").mkdir(parents=True)
    (tmp_path / "conformance" / "corpus" / "cases" / "table.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert _long_modules(tmp_path) == [f"conformance/judge/long.py: {MAX_LINES + 1} lines"]


def test_every_room_says_what_it_is():
    """Each subpackage's docstring says what it owns, what it may import and where new things go."""
    import importlib

    rooms = ["pgspec.conformance", "pgspec.conformance.base", "pgspec.conformance.corpus",
             "pgspec.conformance.corpus.cases", "pgspec.conformance.judge", "pgspec.conformance.verdicts",
             "pgspec.conformance.run", "pgspec.conformance.run.properties", "pgspec.conformance.check"]
    for name in rooms:
        doc = importlib.import_module(name).__doc__ or ""
        assert "Owns" in doc and "May import" in doc and "Add " in doc, f"{name}: {doc[:200]!r}"
    assert sys.modules["pgspec.conformance"].__doc__
