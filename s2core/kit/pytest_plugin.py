"""Opt-in pytest plugin: `--s2core-backend` and a `backend` fixture over every registered backend.

Enable it with `-p s2core.kit.pytest_plugin` or `pytest_plugins = ["s2core.kit.pytest_plugin"]`
in a conftest.py. Backends that are unavailable here are skipped with their probe's reason;
plugins that failed to load are reported as skips too, never hidden. A kit test's failure
starts with the id of the rule it checks (s2core/kit/catalog.py), whatever raised it.
"""

from __future__ import annotations

import pytest

import s2core


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("s2core")
    group.addoption("--s2core-backend", action="append", default=[], metavar="NAME",
                    help="run backend tests only on this backend (repeatable; default: all "
                         "registered backends)")


def _backend_params(config: pytest.Config) -> list:
    chosen = config.getoption("--s2core-backend")
    rows = s2core.list_backends()
    if chosen:
        names = {r.name for r in rows}
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise pytest.UsageError(f"--s2core-backend: unknown backend(s) {unknown}; "
                                    f"registered: {sorted(names)}")
        rows = [r for r in rows if r.name in chosen]
    params = []
    for r in rows:
        marks = [] if r.available else [pytest.mark.skip(reason=f"{r.name}: {r.reason}")]
        params.append(pytest.param(r.name, id=r.name, marks=marks))
    return params


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames and not _has_own_backend_fixture(metafunc):
        metafunc.parametrize("backend", _backend_params(metafunc.config), scope="session")


def _has_own_backend_fixture(metafunc: pytest.Metafunc) -> bool:
    """A test class or module that defines its own `backend` fixture keeps it."""
    defs = metafunc._arg2fixturedefs.get("backend")  # noqa: SLF001 - pytest offers no public way
    return bool(defs)


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    for r in s2core.list_backends():
        state = "available" if r.available else "unavailable"
        lines.append(f"s2core backend {r.name} (priority {r.priority}): {state} - {r.reason}")
    return lines


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Start a failing kit test's report with its rule's id and what the rule asks."""
    outcome = yield
    report = outcome.get_result()
    function = getattr(item, "function", None)
    if not (report.failed and call.excinfo is not None and function is not None
            and function.__module__.startswith("s2core.kit")):
        return
    from s2core.kit.catalog import prefixed
    seen = call.excinfo.exconly().removeprefix("Failed: ")
    message = prefixed(function.__name__, seen)
    if message != seen:
        report.longrepr = f"{message}\n\n{report.longrepr}"
