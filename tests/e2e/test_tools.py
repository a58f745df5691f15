"""Tool calling end to end with the real SmolLM2, through the official
`openai` client and LangChain's `ChatOpenAI.bind_tools`: `auto` answers
parse when they call, `required` and named choices always give calls whose
arguments validate against the function's schema, streamed deltas
reassemble to the same calls, and a follow-up turn with the `role: tool`
result renders and answers."""

from __future__ import annotations

import json

import jsonschema
import pytest

from ingot_e2e import assert_error

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 40}, "hours24": {"type": "boolean"}},
            "required": ["zone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
MAX_TOKENS = 120


def check_call(name: str, arguments: str) -> dict:
    assert name in SCHEMAS, name
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_auto_parses_calls_when_the_model_makes_them(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=MAX_TOKENS, temperature=0)
    choice = r.choices[0]
    if choice.message.tool_calls:
        assert choice.finish_reason == "tool_calls"
        for call in choice.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            json.loads(call.function.arguments)
            assert call.function.name in SCHEMAS
    else:
        assert isinstance(choice.message.content, str)
        assert "<tool_call>" not in choice.message.content or "{" not in choice.message.content.split("<tool_call>", 1)[1]


@pytest.mark.parametrize("parallel", [True, False])
def test_required_always_calls_with_valid_arguments(client, model_name, parallel):
    for seed in range(3):
        r = client.chat.completions.create(
            model=model_name,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=parallel,
            max_tokens=MAX_TOKENS,
            temperature=0.9,
            seed=seed,
        )
        choice = r.choices[0]
        # A small model may keep adding parallel calls until max_tokens;
        # the complete ones are returned and a cut-off one is not content.
        assert choice.finish_reason == "tool_calls" or (parallel and choice.finish_reason == "length"), choice
        assert choice.message.tool_calls, choice
        assert choice.message.content is None, choice
        if not parallel:
            assert len(choice.message.tool_calls) == 1
        for call in choice.message.tool_calls:
            check_call(call.function.name, call.function.arguments)


def test_a_named_function_is_the_one_called(client, model_name):
    for seed in range(3):
        r = client.chat.completions.create(
            model=model_name,
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            max_tokens=MAX_TOKENS,
            temperature=0.9,
            seed=seed,
        )
        calls = r.choices[0].message.tool_calls
        assert calls and len(calls) == 1
        assert calls[0].function.name == "get_time"
        check_call("get_time", calls[0].function.arguments)


@pytest.mark.parametrize("parallel", [True, False])
def test_streamed_deltas_reassemble_to_the_same_calls(client, model_name, parallel):
    kw = dict(
        model=model_name, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel, max_tokens=MAX_TOKENS, temperature=0
    )
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    assert entry["id"] is None, "a call's id comes once"
                    entry["id"] = d.id
                if d.function and d.function.name:
                    entry["name"] += d.function.name
                if d.function and d.function.arguments:
                    entry["arguments"] += d.function.arguments
            finish = c.finish_reason or finish
    assert finish == "tool_calls" or (parallel and finish == "length")
    got = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
    want = [(c.function.name, json.loads(c.function.arguments)) for c in whole]
    assert got == want
    assert all(calls[i]["id"] for i in calls)


def test_a_follow_up_with_the_tool_result_answers(client, model_name):
    first = client.chat.completions.create(
        model=model_name, messages=ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}}, max_tokens=MAX_TOKENS, temperature=0
    )
    call = first.choices[0].message.tool_calls[0]
    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    r = client.chat.completions.create(model=model_name, messages=messages, tools=TOOLS, max_tokens=40, temperature=0)
    choice = r.choices[0]
    assert choice.message.content or choice.message.tool_calls
    if choice.message.tool_calls:
        for c in choice.message.tool_calls:
            json.loads(c.function.arguments)


def test_tool_errors_name_the_field(http, model_name):
    body = {"model": model_name, "messages": ASK, "max_tokens": 4}
    r = http.post("/v1/chat/completions", json={**body, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert_error(r, 400, "invalid_request_error", param="tool_choice.function.name")
    r = http.post("/v1/chat/completions", json={**body, "tool_choice": "required"})
    assert_error(r, 400, "invalid_request_error", param="tool_choice")
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "format": "credit-card"}}}}}
    r = http.post("/v1/chat/completions", json={**body, "tools": [bad], "tool_choice": "required"})
    assert_error(r, 400, "invalid_request_error", param="tools[0].function.parameters", code="unsupported_feature",
                 message_contains=("credit-card",))


# LangChain: the real ChatOpenAI against ingot.


@pytest.fixture(scope="module")
def chat_model(server, model_name):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=model_name,
        base_url=f"http://127.0.0.1:{server.port}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
    )


@pytest.mark.parametrize("choice", ["any", "get_weather"])
def test_langchain_bind_tools_gives_valid_calls(chat_model, choice):
    bound = chat_model.bind_tools(TOOLS, tool_choice=choice)
    msg = bound.invoke("What is the weather like in Paris right now?")
    assert msg.tool_calls, msg
    for call in msg.tool_calls:
        assert call["name"] in SCHEMAS
        jsonschema.validate(call["args"], SCHEMAS[call["name"]])
        if choice != "any":
            assert call["name"] == choice
    assert not msg.invalid_tool_calls


def test_langchain_streaming_and_follow_up(chat_model):
    from langchain_core.messages import HumanMessage, ToolMessage

    bound = chat_model.bind_tools(TOOLS, tool_choice="get_weather")
    question = HumanMessage("What is the weather like in Paris right now?")
    whole = bound.invoke([question])
    total = None
    for chunk in bound.stream([question]):
        total = chunk if total is None else total + chunk
    assert [(c["name"], c["args"]) for c in total.tool_calls] == [(c["name"], c["args"]) for c in whole.tool_calls]
    call = whole.tool_calls[0]
    answer = chat_model.bind_tools(TOOLS).invoke(
        [question, whole, ToolMessage(content='{"temperature": 18, "sky": "clear"}', tool_call_id=call["id"])]
    )
    assert answer.content or answer.tool_calls
