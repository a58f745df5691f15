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


# The longest tests (30-80 s each on CI's 2 cores) start first, so that the
# two pytest-xdist workers do not end with one of them alone on a long test
# picked up last (collection order is alphabetical: test_structured and
# test_slo would start near the end). Whole modules move where their tests
# share a module-scoped server. A name that no longer matches only loses
# its place in the queue.
LONGEST_FIRST = (
    "test_structured.py::test_real_world_schemas",
    "test_deterministic.py::",
    "test_embeddings.py::",
    "test_slo.py::",
    "test_lm_eval.py::",
    "test_canary.py::",
    "test_models.py::",
    "test_router.py::",
    "test_web_ui.py::",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        return next((i for i, p in enumerate(LONGEST_FIRST) if p in item.nodeid), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the rest keep their order


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
