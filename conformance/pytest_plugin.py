"""pytest plugin: ``pytest --pgspec-adapter NAME`` runs the golden corpus as parametrized tests.

NAME is a built-in adapter (``torch``) or ``module:object`` for an adapter that lives in the
user's own repository (imported from the current folder).  Each (case, dtype) becomes one test
whose node ID is ``pgspec::<case ID>[<dtype>]``, e.g. ``pgspec::kl.k3/two-tokens[float32]``; that
ID, or a prefix of it (``pgspec::kl.k3``, ``pgspec``), passed back on the command line reruns just
those tests.  pass -> passed; fail, error or stale-deviation -> failed (with the first failing
element, a repro snippet and the command that reruns the test); a declared bug or convention ->
xfailed with its reason and link.  ``--pgspec-case-timeout SECONDS`` (or the ini setting
``pgspec_case_timeout``) makes a case that does not return within that time fail as an error, as
``pgspec run --case-timeout`` does in-process.  Cases of formulas the adapter does not implement, dtypes it does
not support, and cases outside its declared capabilities are deselected (one summary line says how
many; under pytest-xdist, in the controller's closing summary), not skipped one by one.  Without the
option the plugin does nothing.
"""

from __future__ import annotations

import sys

import pytest


# the same as `pgspec run`'s --dtype (tested): a user expects the plugin to run what the command runs
DEFAULT_DTYPES = "float64,float32,bfloat16"


def pytest_addoption(parser):
    from pgspec.conformance.judge.tolerance import DTYPES_HELP

    group = parser.getgroup("pgspec", "pgspec conformance suite")
    group.addoption("--pgspec-adapter", default=None, metavar="NAME",
                    help="run the pgspec golden corpus against this adapter: a built-in name or module:object "
                         "(the current folder is importable); the golden cases only, in the dtypes of "
                         "--pgspec-dtype, as `pgspec run --no-properties` (the property checks of "
                         "spec/properties.md run with `pgspec run --adapter NAME`) (default: none, the plugin is off)")
    group.addoption("--pgspec-device", default="cpu", choices=("cpu", "cuda"), help="device (default: cpu)")
    group.addoption("--pgspec-dtype", default=DEFAULT_DTYPES, metavar="DTYPES",
                    help=f"comma-separated dtypes among {DTYPES_HELP}, as `pgspec run --dtype` "
                         f"(default: {DEFAULT_DTYPES}, as pgspec run)")
    group.addoption("--pgspec-formulas", default="*", metavar="GLOBS",
                    help="formula or case ID globs, comma-separated, e.g. 'kl.*,loss.grpo' (default: *)")
    group.addoption("--pgspec-case-timeout", default=None, metavar="SECONDS",
                    help="a case whose adapter call takes longer fails as an error (its Python code is interrupted, "
                         "as `pgspec run --case-timeout` does in-process; POSIX, the main thread); more than 0, at "
                         "most 604800 (default: the ini setting pgspec_case_timeout, else no limit)")
    parser.addini("pgspec_case_timeout", default="",
                  help="pgspec plugin: the time limit of each case in seconds, as --pgspec-case-timeout "
                       "(default: none, no limit)")


class PgspecItem(pytest.Item):
    def __init__(self, *, case, dtype, **kwargs):
        super().__init__(**kwargs)
        self.case = case
        self.dtype = dtype

    def runtest(self):
        from pgspec.conformance.run import runner, untrusted

        adapter = self.config._pgspec_adapter
        device = self.config.getoption("--pgspec-device")
        seconds, option = self.config._pgspec_case_timeout
        if seconds and not untrusted.can_time_limit() and not getattr(self.config, "_pgspec_timeout_warned", False):
            self.config._pgspec_timeout_warned = True
            import warnings

            warnings.warn(pytest.PytestWarning(
                f"{option} {seconds:g}: the pgspec tests run outside the main thread here, where no time limit "
                "can interrupt a case: they run without one"))
        with untrusted.case_timeout(seconds, option):
            result = runner.run_case(adapter, self.case, self.dtype, device)
        self.user_properties.append(("pgspec_outcome", result.outcome))
        if result.error_ratio is not None:
            self.user_properties.append(("pgspec_error_ratio", result.error_ratio))
        if result.outcome in ("pass", "rejected"):
            return
        if result.outcome == "not-rejected":
            # validation is its own axis, never a failure (spec/verdicts.md, "Validation"): an xfail
            # that says so, not a pass
            pytest.xfail(f"validation: not rejected: {result.message}")
        if result.outcome in ("unsupported", "not-applicable"):  # deselected at collection; kept for safety
            pytest.skip(result.message)
        if result.outcome in ("bug", "convention"):
            d = result.declaration
            pytest.xfail(f"declared {d['kind']}: {d['reason']} ({d['link']})")
        raise PgspecFailure(result)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, PgspecFailure):
            r = excinfo.value.result
            return (f"{r.outcome}: {r.case_id} [{r.dtype}]\n{r.message.strip()}\n\n"
                    f"Rerun this test:\n  {rerun_command(self.config, self.nodeid)}\n\nReproduce in Python:\n{r.repro}")
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, None, self.nodeid


class PgspecFailure(Exception):
    def __init__(self, result):
        super().__init__(result.message)
        self.result = result


def rerun_command(config, nodeid: str) -> str:
    import shlex

    parts = ["pytest", "--pgspec-adapter", config.getoption("--pgspec-adapter")]
    if config.getoption("--pgspec-device") != "cpu":
        parts += ["--pgspec-device", config.getoption("--pgspec-device")]
    if config.getoption("--pgspec-case-timeout") is not None:     # (the ini setting applies to the rerun too)
        parts += ["--pgspec-case-timeout", config.getoption("--pgspec-case-timeout")]
    return " ".join(shlex.quote(p) for p in parts + [nodeid])


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


def _untensorable(case: dict, dtype: str) -> bool:
    """An expected-error case whose inputs no tensor can hold (a ragged row) is not applicable to
    a tensor adapter (spec/golden-format.md); the runner says so when it runs it, we deselect it."""
    if not case.get("expect_error"):
        return False
    from pgspec.conformance.run import runner

    try:
        runner.to_tensors(case["formula"], runner.case_inputs(case), dtype, "cpu")
    except Exception:  # noqa: BLE001 - exactly the runner's test in _expect_rejection
        return True
    return False


def _selected_by_args(nodeid: str, selectors: list[str]) -> bool:
    """A node ID given back on the command line selects itself and, as a prefix ending at a
    ``/``, ``[`` or ``::`` boundary, every test under it (``pgspec::kl.k3`` selects all kl.k3 cases)."""
    for sel in selectors:
        if nodeid == sel or (nodeid.startswith(sel) and nodeid[len(sel)] in "/[:"):
            return True
    return False


def pytest_configure(config):
    name = config.getoption("--pgspec-adapter")
    if not name:
        return
    from pgspec.conformance.run import runner
    from pgspec.conformance.base.settings import SettingError, check_environment
    from pgspec.conformance.judge.tolerance import parse_dtypes

    try:    # the PGSPEC_* variables, as `pgspec` checks them (docs/bad-input.md)
        for warning in check_environment():
            print(warning, file=sys.stderr)
    except SettingError as e:
        raise pytest.UsageError(str(e)) from None

    try:    # as `pgspec run --dtype`: the aliases (fp32, bf16...) too
        dtypes = parse_dtypes(config.getoption("--pgspec-dtype"), option="--pgspec-dtype")
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    config._pgspec_case_timeout = _case_timeout(config)
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
    config._pgspec_deselected = {}


def _case_timeout(config) -> tuple:
    """(seconds or None, the option that set them): --pgspec-case-timeout, else the ini setting
    pgspec_case_timeout, in the range of `pgspec run --case-timeout` (docs/bad-input.md)."""
    import signal

    from pgspec.conformance.run.untrusted import parse_seconds

    text, option = config.getoption("--pgspec-case-timeout"), "--pgspec-case-timeout"
    if text is None:
        text, option = config.getini("pgspec_case_timeout"), "pgspec_case_timeout (ini)"
        if not str(text).strip():
            return None, option
    try:
        seconds = parse_seconds(text)
    except ValueError as e:
        raise pytest.UsageError(f"{option}: {e}") from None
    if not hasattr(signal, "setitimer"):
        raise pytest.UsageError(f"{option}: a case's time limit needs POSIX interval timers (signal.setitimer), "
                                "which this platform lacks; run without it (or use pytest-timeout's thread method)")
    return seconds, option


def _take_node_id_args(config):
    """Command-line arguments naming pgspec tests (``pgspec::kl.k3/two-tokens[float32]``) are no
    files: take them out of pytest's path arguments and select those tests instead."""
    ours = [a for a in config.args if a == "pgspec" or a.startswith("pgspec::")]
    if ours:
        if not config.getoption("--pgspec-adapter"):
            raise pytest.UsageError(f"{ours[0]}: pgspec test IDs need --pgspec-adapter NAME")
        config.args[:] = [a for a in config.args if a not in ours]
    return ours


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    session.config._pgspec_selectors = _take_node_id_args(session.config)


def pytest_collection_modifyitems(session, config, items):
    adapter = getattr(config, "_pgspec_adapter", None)
    if adapter is None:
        return
    selectors = getattr(config, "_pgspec_selectors", [])
    from pgspec.conformance.run import runner
    from pgspec.conformance.run.runner import RunError

    collector = PgspecCollector.from_parent(session, name="pgspec", nodeid="pgspec")
    try:
        collected = list(collector.collect())
    except RunError as e:
        raise pytest.UsageError(f"--pgspec-formulas: {e}") from None
    # reported like any collected node, so that "collected N items / M deselected" adds up
    config.hook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, collected))
    implemented = adapter.capabilities()
    declarations = runner.declarations_of(adapter)
    kept, unimplemented, no_dtype, outside, unselected = [], [], [], [], []
    for item in collected:
        if not isinstance(item, PgspecItem):   # a corrupted golden family's one failing test
            kept.append(item)
        elif selectors and not _selected_by_args(item.nodeid, selectors):
            unselected.append(item)
        elif item.case["formula"] not in implemented:
            unimplemented.append(item)
        elif item.dtype not in adapter.dtypes:
            no_dtype.append(item)
        elif declarations.unsupported_case(item.case) is not None:
            unimplemented.append(item)
        elif declarations.not_applicable(item.case) is not None or _untensorable(item.case, item.dtype):
            outside.append(item)
        else:
            kept.append(item)
    items.extend(kept)
    deselected = unimplemented + no_dtype + outside + unselected
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    config._pgspec_deselected = {
        "formulas": len({i.case["formula"] for i in unimplemented}), "unimplemented": len(unimplemented),
        "dtypes": sorted({i.dtype for i in no_dtype}), "no_dtype": len(no_dtype), "kept": len(kept),
        "outside": len(outside),
    }


def pytest_report_header(config):
    """What the plugin runs, and what it leaves to ``pgspec run`` (the property checks)."""
    adapter = getattr(config, "_pgspec_adapter", None)
    if adapter is None:
        return None
    name = config.getoption("--pgspec-adapter")
    seconds, option = config._pgspec_case_timeout
    limit = f"at most {seconds:g} s a case ({option})" if seconds else "no time limit (--pgspec-case-timeout)"
    return (f"pgspec plugin: the golden cases against {adapter.name} ({adapter.version}) on "
            f"{config.getoption('--pgspec-device')} in {', '.join(config._pgspec_dtypes)}, formulas "
            f"{config.getoption('--pgspec-formulas')}, {limit}; not the property checks (spec/properties.md): "
            f"`pgspec run --adapter {name}` runs both")


def pytest_report_collectionfinish(config, start_path, items):
    info = getattr(config, "_pgspec_deselected", None)
    if not info:
        return None
    return _summary_line(config._pgspec_adapter, info)


# With pytest-xdist (``pytest -n N``) the workers collect and deselect, and the controller, which
# prints, collects nothing: each worker hands its counts back when it is done (``workeroutput``),
# and the controller prints the same line in its closing summary.

def pytest_sessionfinish(session):
    workeroutput = getattr(session.config, "workeroutput", None)     # set on an xdist worker only
    info = getattr(session.config, "_pgspec_deselected", None)
    if workeroutput is not None and info:
        workeroutput["pgspec_deselected"] = info


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist: a worker is done (every worker deselects the same tests: the first one's counts)."""
    info = getattr(node, "workeroutput", {}).get("pgspec_deselected")
    if info and not getattr(node.config, "_pgspec_deselected", None):
        node.config._pgspec_deselected = info


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    info = getattr(config, "_pgspec_deselected", None)
    if info and config.pluginmanager.getplugin("dsession") is not None:    # the xdist controller
        terminalreporter.write_line(_summary_line(config._pgspec_adapter, info))


def _summary_line(adapter, info) -> str:
    parts = []
    if info["unimplemented"]:
        parts.append(f"{info['unimplemented']} tests of {info['formulas']} formulas that {adapter.name} "
                     "does not implement")
    if info["no_dtype"]:
        parts.append(f"{info['no_dtype']} tests in dtypes it does not support ({', '.join(info['dtypes'])})")
    if info["outside"]:
        parts.append(f"{info['outside']} tests not applicable to it (outside its declared capabilities, or "
                     "expected-error inputs no tensor can hold)")
    line = f"pgspec: {info['kept']} tests against {adapter.name} ({adapter.version})"
    return line + ("; deselected " + " and ".join(parts) if parts else "")
