"""POST /v1/messages (issue 36) through the official `anthropic` client
against the real binary: a plain message, the same one streamed (the SDK
assembles Anthropic's SSE events into the same message), and a tool round
trip (a forced `tool_use`, then its `tool_result` answered in text)."""

from __future__ import annotations

import anthropic
import pytest

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
# This client version has no sampling arguments; the server reads
# `temperature` (greedy here, so answers repeat) as Anthropic's API does.
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def claude(server):
    c = anthropic.Anthropic(base_url=server.url, api_key="EMPTY", max_retries=0, timeout=30)
    yield c
    c.close()


def test_plain_and_streamed_messages_agree(claude, model_name):
    args = dict(model=model_name, max_tokens=16, system="Answer briefly.", messages=ASK, **GREEDY)
    m = claude.messages.create(**args)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert [b.type for b in m.content] == ["text"] and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 16
    with claude.messages.stream(**args) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == m.content[0].text, "greedy: the stream says what the whole answer said"
    assert (final.stop_reason, final.usage.output_tokens) == (m.stop_reason, m.usage.output_tokens)


def test_tool_round_trip(claude, model_name):
    ask = [{"role": "user", "content": "What is the weather like in Paris?"}]
    m = claude.messages.create(
        model=model_name, max_tokens=32, messages=ask, tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"}, **GREEDY,
    )
    assert m.stop_reason == "tool_use"
    calls = [b for b in m.content if b.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].id.startswith("toolu_")
    assert isinstance(calls[0].input.get("city"), str)
    follow = ask + [
        {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": "Sunny, 24 C"}]},
    ]
    r = claude.messages.create(model=model_name, max_tokens=8, messages=follow, tools=[WEATHER], **GREEDY)
    assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert r.usage.input_tokens > m.usage.input_tokens, "the call and its result are in the prompt"


def test_errors_are_anthropic_errors(claude, model_name):
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=model_name, max_tokens=8, messages=ASK, extra_body={"thinking": {"type": "enabled"}})
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "thinking" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=8, messages=ASK)
