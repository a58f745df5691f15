"""Structured output end to end with the real SmolLM2: JSON schemas from
real-world collections (tests/fixtures/json-schemas, see SOURCE.md) give
answers that validate, or a 400 naming the unsupported feature; the other
constraint forms (json_object, regex, choice, Lark grammar) hold on both
endpoints and in streams; constrained and free answers never share the
response cache."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from ingot_e2e import REPO, assert_error, iter_sse_data

FIXTURES = REPO / "tests" / "fixtures" / "json-schemas"
INVALID = "invalid_request_error"
# Long enough for the schemas' answers, short enough for a 2-core CI run.
MAX_TOKENS = 128
# Requests in flight at once (the engine batches them).
CONCURRENCY = 64


def schema_files():
    return sorted(FIXTURES.glob("*/*.json"))


def ask(http, model_name, schema, max_tokens=MAX_TOKENS):
    return http.post(
        "/v1/chat/completions",
        json={
            "model": model_name,
            "messages": [
                {"role": "system", "content": "You answer with JSON only."},
                {"role": "user", "content": "Give an example JSON document for this schema."},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
            # Not strict: these schemas were not written for OpenAI's strict
            # mode, which closes every object and requires every property
            # (some become unsatisfiable, others much longer to answer).
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": False}},
        },
        timeout=600,
    )


def named_feature(message: str, schema_text: str) -> bool:
    """The 400's message names something the schema really uses: its
    quoted keys, a format, `oneOf`, or (for a regex the engine cannot
    handle, e.g. with look-around) the pattern itself."""
    detail = message.split("support:", 1)[-1]
    keys = re.findall(r'"([^"]+)"', detail)
    words = re.findall(r"\b(oneOf|Unknown format: \S+)", detail)
    named = keys + [w.split(": ")[-1] for w in words]
    if named:
        return all(n in schema_text for n in named)
    return any(len(line.strip()) > 5 and line.strip() in schema_text for line in detail.splitlines())


@pytest.mark.load
def test_real_world_schemas_validate_or_are_refused_by_name(server, model_name):
    """Answers for every third schema of the collection (a fixed sample
    across all its sources: generating all 327 took 160 s of CI's 2 cores;
    this third takes ~200 s there, so it runs with scripts/test-load);
    that every one of them compiles or is refused by name is checked
    without generating, in crates/structured/tests/grammar.rs."""
    files = schema_files()[::3]
    assert len(files) >= 100, "the fixture collection is incomplete"
    answer_real_world_schemas(server, model_name, files)


def test_real_world_schemas_sample(server, model_name):
    """CI's share of the above: every twelfth schema (greedy answers on the
    CPU are deterministic, so the sample's outcome is fixed)."""
    files = schema_files()[::12]
    assert len(files) >= 25, "the fixture collection is incomplete"
    answer_real_world_schemas(server, model_name, files)


def answer_real_world_schemas(server, model_name, files) -> None:
    """Each schema of `files` answered: it validates, or is refused naming
    a feature it uses, or (at most 5 %) is cut at max_tokens."""
    schemas = [json.loads(f.read_text()) for f in files]
    with server.http() as http, ThreadPoolExecutor(CONCURRENCY) as pool:
        responses = list(pool.map(lambda s: ask(http, model_name, s), schemas))
    valid, refused, cut, failures = 0, 0, [], []
    for path, schema, r in zip(files, schemas, responses):
        name = path.relative_to(FIXTURES)
        if r.status_code == 400:
            err = r.json()["error"]
            if err.get("code") == "unsupported_feature" and named_feature(err["message"], json.dumps(schema)):
                refused += 1
            else:
                failures.append(f"{name}: 400 without naming a feature the schema uses: {err}")
            continue
        if r.status_code != 200:
            failures.append(f"{name}: HTTP {r.status_code} {r.text[:300]}")
            continue
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        if choice["finish_reason"] == "length":
            # The model did not finish within max_tokens, even heading for
            # the end (a pattern or required key left it no way to close).
            cut.append(f"{name}: {text[:160]!r}")
            continue
        if choice["finish_reason"] != "stop":
            failures.append(f"{name}: finished by {choice['finish_reason']}")
            continue
        try:
            doc = json.loads(text)
            cls = jsonschema.validators.validator_for(schema)
            errors = list(cls(schema, format_checker=cls.FORMAT_CHECKER).iter_errors(doc))
        except Exception as e:  # noqa: BLE001 (reported below)
            failures.append(f"{name}: {type(e).__name__}: {e} in {text[:200]!r}")
            continue
        if errors:
            failures.append(f"{name}: {errors[0].message} in {text[:200]!r}")
        else:
            valid += 1
    print(f"\n{valid} valid, {refused} refused by feature, {len(cut)} cut at max_tokens, {len(failures)} failed of {len(files)}")
    # Every finished answer validates and every refusal names its feature.
    assert not failures, "\n".join(failures)
    # SmolLM2-135M loops inside some strings whose pattern or format it
    # never meets; everything else finishes within the budget (11 of 310
    # cut with structured.close_near_limit on, the default; 210 without:
    # scripts/structured-cut-rate).
    assert len(cut) <= 0.05 * len(files), "\n".join(cut)
    assert valid >= 0.88 * len(files), f"only {valid} of {len(files)} schemas are supported"


def chat(http, model_name, **kw):
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "Name a colour and a number."}],
        "max_tokens": 60,
        "temperature": 0,
        **kw,
    }
    return http.post("/v1/chat/completions", json=body)


def test_json_object_mode_gives_an_object(http, model_name):
    r = chat(http, model_name, response_format={"type": "json_object"})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:
        assert choice["message"]["content"].startswith("{")


def test_regex_choice_and_grammar_on_both_endpoints(http, model_name):
    r = chat(http, model_name, guided_regex=r"(red|blue) [0-9]{1,3}")
    assert r.status_code == 200, r.text
    assert re.fullmatch(r"(red|blue) [0-9]{1,3}", r.json()["choices"][0]["message"]["content"])
    r = chat(http, model_name, guided_choice=["sunny", "rainy \"wet\""])
    assert r.json()["choices"][0]["message"]["content"] in ("sunny", 'rainy "wet"')
    r = chat(http, model_name, structured_outputs={"grammar": 'start: "x=" NUM\nNUM: /[0-9]{2}/'})
    assert re.fullmatch(r"x=[0-9]{2}", r.json()["choices"][0]["message"]["content"]), r.text
    r = http.post(
        "/v1/completions",
        json={"model": model_name, "prompt": "The answer is", "max_tokens": 8, "temperature": 0, "guided_choice": ["yes", "no"]},
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in ("yes", "no")


def test_streamed_constrained_answer_is_the_same(http, model_name):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema}}
    whole = chat(http, model_name, response_format=rf, max_tokens=80).json()["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(whole), schema)
    body = {
        "model": model_name,
        "messages": [{"role": "user", "content": "Name a colour and a number."}],
        "max_tokens": 80,
        "temperature": 0,
        "stream": True,
        "response_format": rf,
    }
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        chunks = [json.loads(d) for d in iter_sse_data(r) if d != "[DONE]"]
        parts = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices")]
    assert "".join(parts) == whole


def test_constrained_and_free_answers_are_cached_apart(http, model_name):
    free = chat(http, model_name)
    constrained = chat(http, model_name, guided_regex="[a-z]+")
    again = chat(http, model_name, guided_regex="[a-z]+")
    assert free.status_code == constrained.status_code == 200
    assert re.fullmatch("[a-z]+", constrained.json()["choices"][0]["message"]["content"])
    assert constrained.json()["choices"][0]["message"]["content"] == again.json()["choices"][0]["message"]["content"]
    assert free.json()["choices"][0]["message"]["content"] != constrained.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "fields,param,feature",
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}}}}, "response_format.json_schema.schema", "if"),
        ({"guided_json": {"type": "string", "format": "credit-card"}}, "guided_json", "credit-card"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}}}, "response_format.json_schema.schema", "oneOf"),
    ],
)
def test_unsupported_schema_features_are_a_400_naming_them(http, model_name, fields, param, feature):
    r = chat(http, model_name, **fields)
    assert_error(r, 400, INVALID, param=param, code="unsupported_feature", message_contains=(feature,))


@pytest.mark.parametrize(
    "fields,param",
    [
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_regex": "("}, "guided_regex"),
        ({"guided_grammar": "root ::= \"a\""}, "guided_grammar"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ],
)
def test_bad_constraints_are_a_400_naming_the_field(http, model_name, fields, param):
    assert_error(chat(http, model_name, **fields), 400, INVALID, param=param)
