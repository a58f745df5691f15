"""POST /v1/responses (issue 36) through the official `openai` client
against the real binary: a plain response, the same one streamed (the SDK
assembles the Responses events into the same response), stored responses
retrieved and deleted, `text.format` json_schema, and a function-tool round
trip continued with `previous_response_id`. (Through `ingot route`:
test_router.py's proxy test.)"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
CITY = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
    "required": ["name", "country"],
    "additionalProperties": False,
}


def test_plain_and_streamed_responses_agree_and_are_stored(client, model_name):
    args = dict(model=model_name, instructions="Answer briefly.", input="What is the capital of France?",
                max_output_tokens=16, temperature=0)
    r = client.responses.create(**args)
    assert r.object == "response" and r.id.startswith("resp_") and r.status in ("completed", "incomplete")
    assert [o.type for o in r.output] == ["message"] and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 16
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # (The SDK's `responses.stream` helper only finishes on
    # `response.completed`; a cut answer ends `response.incomplete`.)
    streamed = list(client.responses.create(**args, stream=True))
    events = [e.type for e in streamed]
    final = streamed[-1].response
    assert [e.sequence_number for e in streamed] == list(range(len(streamed)))
    assert events[:2] == ["response.created", "response.in_progress"]
    assert events[-1] == ("response.completed" if r.status == "completed" else "response.incomplete")
    assert "response.output_text.delta" in events
    assert final.output_text == r.output_text, "greedy: the stream says what the whole answer said"
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == r.output_text
    assert final.usage.output_tokens == r.usage.output_tokens
    got = client.responses.retrieve(r.id)
    assert (got.id, got.output_text) == (r.id, r.output_text)
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_json_schema_format(client, model_name):
    r = client.responses.create(
        model=model_name, input="Name a city in Japan as JSON.", max_output_tokens=40, temperature=0, store=False,
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}},
    )
    jsonschema.validate(json.loads(r.output_text), CITY)


def test_function_tool_round_trip_with_previous_response_id(client, model_name):
    first = client.responses.create(
        model=model_name, input="What is the weather like in Paris?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=32, temperature=0,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments).get("city"), str)
    second = client.responses.create(
        model=model_name, previous_response_id=first.id, tools=[WEATHER], max_output_tokens=8, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 24 C"}],
    )
    assert second.previous_response_id == first.id and second.output
    assert second.usage.input_tokens > first.usage.input_tokens, "the call and its result are in the prompt"


def test_unsupported_fields_are_refused_by_name(client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_name, input="Hi", background=True)
    assert e.value.body["param"] == "background"
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=model_name, input="Hi", tools=[{"type": "web_search"}])
    assert e.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model_name, input="Hi", previous_response_id="resp_nope")
