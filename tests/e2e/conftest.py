"""Fixtures: the real `ingot serve` binary on an ephemeral port.

- `server`: one default server shared by the whole session.
- `server_factory`: starts servers with extra CLI flags for one test.
Every server is stopped with SIGTERM at teardown and must exit 0.
"""

from __future__ import annotations

import shutil

import pytest

from ingot_e2e import Server, default_model_name, model_path, require, running


def pytest_sessionfinish(session):
    # Under pytest-xdist each worker starts its own servers: it hands its
    # count to the controller, which sums them in pytest_testnodedown.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["ingot_starts"] = Server.starts


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    Server.starts += getattr(node, "workeroutput", {}).get("ingot_starts", 0)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"ingot processes started (serve, route): {Server.starts}")


def pytest_runtest_setup(item):
    """`@pytest.mark.needs("tool", ..., reason=...)`: the tools must be on
    PATH, under the one rule of `require` (fail under CI=true, skip elsewhere)."""
    for mark in item.iter_markers("needs"):
        missing = [t for t in mark.args if shutil.which(t) is None]
        require(not missing, f"{', '.join(missing)} not installed: {mark.kwargs.get('reason', '')}")


@pytest.fixture(scope="session")
def model_name() -> str:
    return default_model_name()


@pytest.fixture(scope="session")
def server():
    model_path()  # fetch outside the server's startup deadline
    with running() as srv:
        yield srv


@pytest.fixture(scope="session")
def client(server):
    c = server.openai()
    yield c
    c.close()


@pytest.fixture(scope="session")
def http(server):
    with server.http() as c:
        yield c


@pytest.fixture
def server_factory():
    started: list[Server] = []

    def start(*args: str, wait_ready: bool = True, env: dict[str, str] | None = None) -> Server:
        srv = Server(*args, wait_ready=wait_ready, env=env)
        started.append(srv)
        return srv

    yield start
    failures = []
    for srv in started:
        if srv.returncode is not None:
            continue  # the test stopped it (and checked its exit code)
        try:
            srv.stop_and_check()
        except AssertionError as e:
            failures.append(str(e))
    if failures:
        pytest.fail("\n\n".join(failures))
