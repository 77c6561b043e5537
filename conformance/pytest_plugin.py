"""pytest plugin: ``pytest --pgspec-adapter NAME`` runs the golden corpus as parametrized tests.

NAME is a built-in adapter (``torch``) or ``module:object`` for an adapter that lives in the
user's own repository.  Each (case, dtype) becomes one test whose ID is the case ID and dtype,
e.g. ``pgspec::kl.k3/two-tokens[float32]``.  pass -> passed; fail, error or stale-deviation ->
failed (with the first failing element and a repro snippet); a declared bug or convention -> xfailed
with its reason and link; an unsupported formula or dtype, or a case outside the adapter's declared
capabilities -> skipped.  Without the option the plugin
does nothing.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("pgspec", "pgspec conformance suite")
    group.addoption("--pgspec-adapter", default=None, metavar="NAME",
                    help="run the pgspec golden corpus against this adapter (built-in name or module:object)")
    group.addoption("--pgspec-device", default="cpu", choices=("cpu", "cuda"), help="device (default cpu)")
    group.addoption("--pgspec-dtype", default="float64,float32", metavar="DTYPES",
                    help="comma-separated dtypes (default float64,float32)")
    group.addoption("--pgspec-formulas", default="*", metavar="GLOB", help="formula or case ID globs")


class PgspecItem(pytest.Item):
    def __init__(self, *, case, dtype, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.dtype = dtype

    def runtest(self):
        from pgspec.conformance import runner

        adapter = self.config._pgspec_adapter
        device = self.config.getoption("--pgspec-device")
        result = runner.run_case(adapter, self.case, self.dtype, device)
        self.user_properties.append(("pgspec_outcome", result.outcome))
        if result.error_ratio is not None:
            self.user_properties.append(("pgspec_error_ratio", result.error_ratio))
        if result.outcome == "pass":
            return
        if result.outcome in ("unsupported", "not-applicable"):
            pytest.skip(result.message)
        if result.outcome in ("bug", "convention"):
            d = result.declaration
            pytest.xfail(f"declared {d['kind']}: {d['reason']} ({d['link']})")
        raise PgspecFailure(result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, PgspecFailure):
            r = excinfo.value.result
            return f"{r.outcome}: {r.case_id} [{r.dtype}]\n{r.message.strip()}\n\nReproduce:\n{r.repro}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, f"pgspec {self.case['id']} [{self.dtype}]"


class PgspecFailure(Exception):
    def __init__(self, result):
        super().__init__(result.message)
        self.result = result


class PgspecGoldenProblem(pytest.Item):
    """A corrupted golden family file: one failing test naming it (the other families still run)."""

    def __init__(self, *, problem, **kwargs):
        super().__init__(**kwargs)
        self.problem = problem

    def runtest(self):
        raise PgspecGoldenError(self.problem)

    def repr_failure(self, excinfo):
        return f"golden file problem (its family is not run): {self.problem}"

    def reportinfo(self):
        return self.path, None, "pgspec golden corpus"


class PgspecGoldenError(Exception):
    pass


class PgspecCollector(pytest.Collector):
    def collect(self):
        config = self.config
        for k, problem in enumerate(config._pgspec_problems):
            yield PgspecGoldenProblem.from_parent(self, name=f"golden-problem-{k + 1}", problem=problem)
        for case in config._pgspec_cases:
            for dtype in config._pgspec_dtypes:
                yield PgspecItem.from_parent(self, name=f"{case['id']}[{dtype}]", case=case, dtype=dtype)


def pytest_configure(config):
    name = config.getoption("--pgspec-adapter")
    if not name:
        return
    from pgspec.conformance import runner
    from pgspec.conformance.tolerance import DTYPES

    dtypes = list(dict.fromkeys(d.strip() for d in config.getoption("--pgspec-dtype").split(",") if d.strip()))
    if not dtypes:
        raise pytest.UsageError(f"--pgspec-dtype: no dtype given; choose from {', '.join(DTYPES)}")
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        raise pytest.UsageError(f"--pgspec-dtype: unknown dtype(s) {bad}; choose from {', '.join(DTYPES)}")
    try:
        adapter = runner.load_adapter(name)
    except runner.RunError as e:
        raise pytest.UsageError(f"--pgspec-adapter: {e}") from None
    try:
        ok, why = adapter.available()
        if not ok:
            raise pytest.UsageError(f"--pgspec-adapter: adapter {name!r} is not available: {why}")
        ok, why = adapter.device_available(config.getoption("--pgspec-device"))
    except pytest.UsageError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's adapter code
        raise pytest.UsageError(f"--pgspec-adapter: adapter {name!r}: {runner._one_line(e)}") from None
    if not ok:
        raise pytest.UsageError(f"--pgspec-device: {why}")
    problems: list = []
    try:
        cases = runner.select_cases(config.getoption("--pgspec-formulas"), problems=problems)
    except runner.RunError as e:
        raise pytest.UsageError(f"--pgspec-formulas: {e}") from None
    config._pgspec_cases = cases
    config._pgspec_problems = problems
    config._pgspec_dtypes = dtypes
    config._pgspec_adapter = adapter


def pytest_collection_modifyitems(session, config, items):
    if not getattr(config, "_pgspec_adapter", None):
        return
    collector = PgspecCollector.from_parent(session, name="pgspec")
    items.extend(collector.collect())
