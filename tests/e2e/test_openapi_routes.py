"""Schemathesis over every route `ingot serve` serves, from the server's own
description (`GET /openapi.json`, crates/server/src/openapi.rs).

In CI (cheap, a few seconds): the served document validates as OpenAPI 3.1
(schemathesis's own validator) and one generated request per operation that
does not generate text gets no 5xx and a conforming answer.

The full run (`load`: scripts/test-load, not in CI) generates requests for
every operation: no server error (5xx), and every answer conforms to the
description (status, content type, body schema; errors in the dialect of
their path; each streamed event's JSON). `model` is the served name and
output sizes are capped (max_tokens 4, `--max-model-len 512`) so a run
stays within a few minutes on two cores; `INGOT_OPENAPI_EXAMPLES` sets the
generated requests per operation (default 100; a fifth of that for the
operations that generate text). Then the same with invalid requests
(schemathesis's negative mode): refused, never with a 5xx.
"""

from __future__ import annotations

import copy
import json
import os
import time

import pytest

from ingot_e2e import minilm_model, model_path, models_config, require_module, running

schemathesis = require_module("schemathesis", "schemathesis is not installed (scripts/python-env installs it)")
from hypothesis import HealthCheck, Phase, example, given, settings  # noqa: E402  (after the skip)

MAX_TOKENS = 4
EXAMPLES = int(os.environ.get("INGOT_OPENAPI_EXAMPLES", "100"))
# Operations that run the model: fewer examples (each costs a generation).
GENERATING = {
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/responses"),
    ("POST", "/api/chat"),
    ("POST", "/api/generate"),
}
# Operations that change the server's state for the tests that follow
# (the CI part runs on the session's shared server).
MUTATING = {("POST", "/admin/reload"), ("POST", "/admin/models/{id}/{action}"), ("POST", "/admin/cache/purge")}
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
]


EMBEDDING_MODEL = "minilm"
EMBEDDING_PATHS = ("/v1/embeddings", "/api/embed")


@pytest.fixture(scope="module")
def full_server(model_name, tmp_path_factory):
    # MiniLM beside the default model serves the embedding routes (skipped
    # where scripts/fetch-minilm cannot fetch it: those routes then refuse).
    args = []
    minilm = minilm_model()[0]
    if minilm:
        cfg = tmp_path_factory.mktemp("openapi") / "ingot.toml"
        args = ["--config", str(models_config(cfg, {model_name: model_path(), EMBEDDING_MODEL: minilm}))]
    # Requests that leave max_tokens out would otherwise run to the context.
    with running(*args, "--max-model-len", "512", env={"INGOT_LIMITS_MAX_TOKENS": str(MAX_TOKENS)}) as srv:
        yield srv


@pytest.fixture(scope="module")
def served(server):
    # The session's server (conftest.py): the CI part generates no text.
    with server.http() as c:
        r = c.get("/openapi.json")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    return r.json()


def narrowed(doc: dict, chat_model: str, embedding_model: str | None = None) -> dict:
    """The description with `model` the served name and output sizes capped."""
    doc = copy.deepcopy(doc)
    embedding_model = embedding_model or chat_model
    model = chat_model

    def visit(schema):
        nonlocal model
        if isinstance(schema, list):
            for s in schema:
                visit(s)
            return
        if not isinstance(schema, dict):
            return
        props = schema.get("properties")
        if isinstance(props, dict):
            if "model" in props:
                props["model"] = {"enum": [model]}
            for field in ("max_tokens", "max_completion_tokens", "max_output_tokens", "num_predict"):
                if field in props:
                    props[field] = {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS}
            if "n" in props:
                props["n"] = {"type": "integer", "minimum": 1, "maximum": 2}
            for field in ("messages", "input", "prompt"):
                if isinstance(props.get(field), dict) and props[field].get("type") == "array":
                    props[field]["maxItems"] = 4
        for value in schema.values():
            visit(value)

    for path, item in doc["paths"].items():
        for op in item.values():
            if "requestBody" in op:
                model = embedding_model if path in EMBEDDING_PATHS else chat_model
                visit(op["requestBody"])
    model = chat_model
    visit(doc["components"]["schemas"])
    return doc


def operations(doc: dict) -> list[tuple[str, str]]:
    return [(m.upper(), p) for p, item in doc["paths"].items() for m in item]


MESSAGES = [{"role": "user", "content": "Say hi"}]


def explicit_cases(method: str, path: str, model: str, stored: str, embedding: str) -> list[dict]:
    """Requests that always run whatever the generator draws: every stream
    (its events' JSON checked against the description by schemathesis), and
    ids that exist."""
    bodies = {
        "/v1/chat/completions": [
            {"messages": MESSAGES, "stream": True, "logprobs": True, "top_logprobs": 2,
             "stream_options": {"include_usage": True}},
            {"messages": MESSAGES, "n": 2, "logprobs": True, "top_logprobs": 1},
        ],
        "/v1/completions": [
            {"prompt": "Once upon a time", "stream": True, "echo": True, "logprobs": 2,
             "stream_options": {"include_usage": True}},
            {"prompt": ["a", "b"], "echo": True, "logprobs": 1},
        ],
        "/v1/messages": [
            {"max_tokens": MAX_TOKENS, "messages": MESSAGES, "stream": True},
            {"max_tokens": MAX_TOKENS, "messages": MESSAGES, "system": "Be brief."},
        ],
        "/v1/responses": [{"input": "Say hi", "stream": True}, {"input": "Say hi", "instructions": "Be brief."}],
        "/api/chat": [{"messages": MESSAGES}, {"messages": MESSAGES, "stream": False}],
        "/api/generate": [{"prompt": "Hi"}, {"prompt": "Hi", "stream": False}],
        "/api/show": [{"model": model}],
        "/tokenize": [{"prompt": "Hi"}, {"messages": MESSAGES}],
        "/detokenize": [{"tokens": [1, 2, 3]}],
        "/v1/embeddings": [{"input": ["a", "b"]}, {"input": "a", "encoding_format": "base64"}],
        "/api/embed": [{"input": "a"}],
    }
    cases = []
    for body in bodies.get(path, []) if method == "POST" else []:
        named = embedding if path in EMBEDDING_PATHS else model
        cases.append({"body": {**body, "model": named} if path not in ("/tokenize", "/detokenize") else body})
    params = {
        "/v1/models/{id}": {"id": model},
        "/v1/responses/{id}": {"id": stored},
        "/admin/models/{id}/{action}": {"id": model, "action": "pin"},
    }
    if path in params:
        cases.append({"path_parameters": params[path]})
    return cases


def ndjson_validator(schema, method: str, path: str):
    """The schema of each line of an NDJSON answer (Ollama's streams), which
    schemathesis does not read."""
    import jsonschema

    raw = schema.raw_schema
    content = raw["paths"][path][method.lower()]["responses"].get("200", {}).get("content", {})
    if "application/x-ndjson" not in content:
        return None
    root = {"components": raw["components"], **content["application/x-ndjson"]["schema"]}
    return jsonschema.Draft202012Validator(root)


def check_ndjson(body: bytes, validator) -> None:
    lines = [line for line in body.decode().splitlines() if line.strip()]
    assert lines, "an empty stream"
    for line in lines:
        errors = sorted(validator.iter_errors(json.loads(line)), key=lambda e: list(e.path))
        assert not errors, f"{line}\n" + "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
    assert json.loads(lines[-1]).get("done") is True, lines[-1]


def run_operation(schema, server, method: str, path: str, examples: int, mode=None, explicit=(), seen=None) -> dict:
    """Runs one operation; `seen` (the answers' statuses) is filled as it
    goes, so a failure's counts are kept."""
    operation = schema[path][method]
    lines = ndjson_validator(schema, method, path)
    negative = mode is not None and mode == schemathesis.GenerationMode.NEGATIVE
    # Negative cases are refused in any shape the server likes, but never with a 5xx.
    names = ["not_a_server_error", "response_schema_conformance"] if negative else CHECKS
    checks = [getattr(schemathesis.checks, name) for name in names]
    seen = {"statuses": {}} if seen is None else seen
    seen.setdefault("statuses", {})

    def with_explicit(run):
        for case in explicit:
            run = example(case=operation.Case(**case))(run)
        return run

    @with_explicit
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(**({"generation_mode": mode} if mode else {})))
    def run(case):
        response = case.call(base_url=server.url, timeout=120)
        seen["statuses"][response.status_code] = seen["statuses"].get(response.status_code, 0) + 1
        if os.environ.get("INGOT_OPENAPI_DEBUG") and response.status_code >= 400:
            print(method, path, repr(case.body)[:300], "->", response.status_code, response.text[:200])
        case.validate_response(response, checks=checks)
        if lines and response.status_code == 200 and "application/x-ndjson" in response.headers.get("content-type", [""])[0]:
            check_ndjson(response.content, lines)
            seen["ndjson"] = seen.get("ndjson", 0) + 1

    run()
    return seen


@pytest.fixture(scope="module")
def schema(served, model_name):
    return schemathesis.openapi.from_dict(narrowed(served, model_name))


def test_served_document_is_openapi_3_1_and_describes_every_route(served, schema):
    from schemathesis.specs.openapi.definitions import OPENAPI_31_VALIDATOR

    OPENAPI_31_VALIDATOR.validate(served)
    # Every operation loads (its schemas resolve).
    ops = operations(served)
    assert len(ops) >= 30, ops
    for method, path in ops:
        schema[path][method]
    assert ("POST", "/v1/messages") in ops and ("GET", "/api/tags") in ops and ("GET", "/") in ops


def test_tiny_pass_over_the_operations_that_do_not_generate(served, schema, server):
    """One generated request per operation that runs no model: no 5xx,
    conforming answers (the full run is test_every_route below)."""
    started = time.monotonic()
    ran = 0
    for method, path in operations(served):
        if (method, path) in GENERATING or (method, path) in MUTATING:
            continue
        run_operation(schema, server, method, path, examples=1)
        ran += 1
    print(f"{ran} operations in {time.monotonic() - started:.2f} s")


@pytest.mark.load
def test_every_route(served, full_server, model_name):
    server = full_server
    embedding = EMBEDDING_MODEL if minilm_model()[0] else model_name
    schema = schemathesis.openapi.from_dict(narrowed(served, model_name, embedding))
    with server.http() as c:
        made = c.post("/v1/responses", json={"model": model_name, "input": "Hi", "max_output_tokens": 2})
    stored = made.json()["id"]
    started = time.monotonic()
    total = {}
    failures = {}
    for mode in (None, schemathesis.GenerationMode.NEGATIVE):
        for method, path in operations(served):
            op = schema[path][method]
            raw = op.definition.raw
            negatable = "requestBody" in raw or any("enum" in p["schema"] for p in raw.get("parameters", []))
            if mode is not None and not negatable:
                continue  # nothing to make invalid (any string is a path parameter)
            examples = max(1, EXAMPLES // 5) if (method, path) in GENERATING else EXAMPLES
            explicit = explicit_cases(method, path, model_name, stored, embedding) if mode is None else []
            key = f"{method} {path}" + (" (negative)" if mode else "")
            seen = {"statuses": {}}
            try:
                run_operation(schema, server, method, path, examples, mode, explicit, seen)
            except (Exception, BaseExceptionGroup) as e:  # every operation runs; failures are listed at the end
                failures[key] = str(e)[:3000]
            total[key] = seen["statuses"]
    cases = sum(sum(s.values()) for s in total.values())
    server_errors = sum(n for s in total.values() for code, n in s.items() if code >= 500)
    print(json.dumps(total))
    print(f"{len(total)} operation runs, {cases} cases, {server_errors} 5xx, {time.monotonic() - started:.1f} s")
    assert not failures, "\n\n".join(f"{k}: {v}" for k, v in failures.items())
    assert server_errors == 0


@pytest.mark.load
def test_stateful_links(served, full_server, model_name):
    """Schemathesis's stateful run over the description's links: a stored
    response is retrieved and deleted through the id its creation returned
    (then gone: `use_after_free`), a listed model is fetched by its id."""
    server = full_server
    schema = schemathesis.openapi.from_dict(narrowed(served, model_name)).include(
        path_regex="^/v1/(responses|models)"
    )
    names = [*CHECKS, "use_after_free", "ensure_resource_availability"]
    checks = [getattr(schemathesis.checks, name) for name in names]
    steps = []

    class Machine(schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"base_url": server.url, "timeout": 120}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            steps.append((case.operation.label, response.status_code))
            case.validate_response(response, checks=checks)

    started = time.monotonic()
    Machine.run(
        settings=settings(
            max_examples=int(os.environ.get("INGOT_OPENAPI_STATEFUL", "25")),
            stateful_step_count=6,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
    )
    linked = [s for s in steps if "{id}" in s[0] and s[1] == 200]
    print(f"stateful: {len(steps)} calls, {len(linked)} by a linked id answered 200, "
          f"{time.monotonic() - started:.1f} s")
    assert linked, steps[:20]
    assert not [s for s in steps if s[1] >= 500], steps
