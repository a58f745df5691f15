"""OpenAI API semantics on the default server (greedy unless stated)."""

from __future__ import annotations

import time

import pytest


QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "user", "content": QUESTION}]
GREEDY = {"temperature": 0}


def chat(client, model_name, **kw):
    args = {"model": model_name, "messages": MESSAGES, "max_tokens": 24, **GREEDY}
    args.update(kw)
    # None means "leave the field out" (the client would send null)
    return client.chat.completions.create(**{k: v for k, v in args.items() if v is not None})


def complete(client, model_name, prompt, **kw):
    args = {"model": model_name, "prompt": prompt, "max_tokens": 8, **GREEDY}
    args.update(kw)
    return client.completions.create(**args)


def tokenize(http, **body) -> dict:
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()


# -- health, models ---------------------------------------------------------


def test_health_ready_models(server, http, client, model_name):
    assert http.get("/health").status_code == 200
    assert http.get("/ready").status_code == 200
    r = http.get("/v1/models")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list"
    ids = [m["id"] for m in body["data"]]
    assert ids == [model_name], ids
    assert body["data"][0]["object"] == "model"
    # and through the client
    assert [m.id for m in client.models.list().data] == [model_name]


def test_served_model_name(server_factory):
    srv = server_factory("--served-model-name", "smol")
    c = srv.openai()
    assert [m.id for m in c.models.list().data] == ["smol"]
    r = c.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=16, temperature=0)
    assert r.model == "smol"
    assert "Paris" in r.choices[0].message.content


# -- chat -------------------------------------------------------------------


@pytest.fixture(scope="module")
def greedy_chat(client, model_name):
    return chat(client, model_name)


def test_chat_non_stream(greedy_chat, model_name, http):
    r = greedy_chat
    assert r.object == "chat.completion"
    assert r.id and isinstance(r.id, str)
    assert isinstance(r.created, int) and abs(r.created - time.time()) < 600
    assert r.model == model_name
    assert len(r.choices) == 1
    ch = r.choices[0]
    assert ch.index == 0
    assert ch.message.role == "assistant"
    assert "Paris" in ch.message.content, ch.message.content
    assert ch.finish_reason == "stop", ch.finish_reason  # EOS well before 24 tokens
    assert ch.logprobs is None
    u = r.usage
    assert u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    # The prompt is the chat template applied to the messages, as /tokenize says.
    tok = tokenize(http, messages=MESSAGES)
    assert u.prompt_tokens == tok["count"], (u.prompt_tokens, tok["count"])
    assert u.prompt_tokens_details is not None
    assert u.prompt_tokens_details.cached_tokens is not None
    assert 0 <= u.prompt_tokens_details.cached_tokens <= u.prompt_tokens


def test_chat_stream_matches_non_stream(greedy_chat, client, model_name):
    stream = chat(client, model_name, stream=True)
    parts, finish, roles, ids = [], [], [], set()
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        assert chunk.model == model_name
        ids.add(chunk.id)
        assert chunk.usage is None  # no include_usage
        for c in chunk.choices:
            assert c.index == 0
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                finish.append(c.finish_reason)
    assert len(ids) == 1, ids
    assert roles == ["assistant"], roles
    assert finish == [greedy_chat.choices[0].finish_reason], finish
    assert "".join(parts) == greedy_chat.choices[0].message.content


def test_chat_content_parts_and_max_completion_tokens(greedy_chat, client, model_name):
    r = chat(
        client,
        model_name,
        messages=[{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        max_tokens=None,
        max_completion_tokens=24,
    )
    assert r.choices[0].message.content == greedy_chat.choices[0].message.content
    assert r.usage.prompt_tokens == greedy_chat.usage.prompt_tokens


def test_chat_stream_include_usage(greedy_chat, client, model_name):
    stream = chat(client, model_name, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    last = chunks[-1]
    assert last.choices == [], last
    assert last.usage is not None
    assert last.usage.prompt_tokens == greedy_chat.usage.prompt_tokens
    assert last.usage.completion_tokens == greedy_chat.usage.completion_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    # only the last chunk carries usage
    assert all(c.usage is None for c in chunks[:-1]), [c.usage for c in chunks[:-1] if c.usage]


def test_chat_default_max_tokens_and_multi_turn(greedy_chat, client, model_name, http):
    # No max_tokens: generation runs to EOS.
    r = chat(client, model_name, max_tokens=None)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == greedy_chat.choices[0].message.content
    # A system message replaces the template's default one; assistant turns are rendered.
    msgs = [
        {"role": "system", "content": "You are a geography teacher."},
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": greedy_chat.choices[0].message.content},
        {"role": "user", "content": "And of Italy?"},
    ]
    r = chat(client, model_name, messages=msgs, max_tokens=16)
    assert r.usage.prompt_tokens == tokenize(http, messages=msgs)["count"]
    assert "Rome" in r.choices[0].message.content, r.choices[0].message.content


def test_non_ascii_stream_matches_non_stream(client, model_name):
    for prompt in ("Le café à Paris est", "日本の首都は", "Emoji story: 🐉🔥"):
        r = complete(client, model_name, prompt, max_tokens=16)
        text = r.choices[0].text
        parts = [c.choices[0].text for c in complete(client, model_name, prompt, max_tokens=16, stream=True) if c.choices]
        assert "".join(parts) == text, (prompt, parts, text)
        # no replacement characters, except for a character cut by max_tokens
        body = text[:-1] if r.choices[0].finish_reason == "length" else text
        assert "\ufffd" not in body, (prompt, text)


def test_chat_max_tokens_length(client, model_name):
    r = chat(client, model_name, max_tokens=5)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    r = chat(client, model_name, max_tokens=None, max_completion_tokens=3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


def test_ignore_eos(greedy_chat, client, model_name):
    assert greedy_chat.choices[0].finish_reason == "stop"
    r = chat(client, model_name, max_tokens=20, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 20
    assert r.choices[0].message.content.startswith(greedy_chat.choices[0].message.content.rstrip())


def test_stop_string(greedy_chat, client, model_name):
    full = greedy_chat.choices[0].message.content
    assert "Paris" in full
    # A stop string spanning several tokens, and one at a word.
    for stop in (["Paris"], ["of Fr", "zzzz"]):
        cut = min(full.index(s) for s in stop if s in full)
        want = full[:cut]
        r = chat(client, model_name, stop=stop if len(stop) > 1 else stop[0])
        got = r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"
        assert all(s not in got for s in stop), got
        assert got == want, (got, want)
        # streaming holds back text that may begin a stop string
        parts = []
        for chunk in chat(client, model_name, stop=stop, stream=True):
            for c in chunk.choices:
                parts.append(c.delta.content or "")
        assert "".join(parts) == want, ("".join(parts), want)


def test_stop_string_completions(client, model_name):
    base = complete(client, model_name, "1, 2, 3, 4, 5,", max_tokens=12)
    text = base.choices[0].text
    assert "7" in text, text  # greedy counting
    r = complete(client, model_name, "1, 2, 3, 4, 5,", max_tokens=12, stop=["7"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index("7")]


def test_chat_logprobs(client, model_name):
    r = chat(client, model_name, max_tokens=6, logprobs=True, top_logprobs=3)
    ch = r.choices[0]
    assert ch.logprobs is not None and ch.logprobs.content is not None
    content = ch.logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert "".join(t.token for t in content) == ch.message.content
    for t in content:
        assert isinstance(t.token, str)
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == 3, t
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True), lps
        assert all(lp <= 0.0 for lp in lps)
        # greedy: the chosen token is the most likely one
        assert t.top_logprobs[0].token == t.token
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4
        if t.bytes is not None:
            assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    # logprobs without top_logprobs: no alternatives
    r = chat(client, model_name, max_tokens=3, logprobs=True)
    assert len(r.choices[0].logprobs.content) == 3
    assert all(len(t.top_logprobs) == 0 for t in r.choices[0].logprobs.content)


def test_chat_logprobs_stream(client, model_name):
    stream = chat(client, model_name, max_tokens=5, logprobs=True, top_logprobs=2, stream=True)
    toks = []
    for chunk in stream:
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                for t in c.logprobs.content:
                    assert len(t.top_logprobs) == 2
                    toks.append(t.token)
    assert len(toks) == 5, toks


def test_n2(client, model_name):
    r = chat(client, model_name, n=2, max_tokens=8, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1]
    # greedy: both choices are the same text
    assert r.choices[0].message.content == r.choices[1].message.content
    assert r.usage.completion_tokens == 16
    assert r.usage.prompt_tokens > 0


def test_n2_sampled_stream_matches_non_stream(client, model_name):
    kw = dict(n=2, max_tokens=12, temperature=0.8, seed=11)
    r = chat(client, model_name, **kw)
    assert sorted(c.index for c in r.choices) == [0, 1]
    want = {c.index: c.message.content for c in r.choices}
    got = {0: "", 1: ""}
    roles = {0: 0, 1: 0}
    finish = {}
    for chunk in chat(client, model_name, stream=True, **kw):
        for c in chunk.choices:
            assert c.index in (0, 1)
            got[c.index] += c.delta.content or ""
            if c.delta.role:
                roles[c.index] += 1
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert roles == {0: 1, 1: 1}, roles
    assert sorted(finish) == [0, 1], finish
    assert got == want


# -- completions --------------------------------------------------------------


def test_completions_string_prompt(client, model_name, http):
    prompt = "The capital of France is"
    r = complete(client, model_name, prompt, max_tokens=6)
    assert r.object == "text_completion"
    assert r.model == model_name
    assert len(r.choices) == 1 and r.choices[0].index == 0
    assert "Paris" in r.choices[0].text, r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens == tokenize(http, prompt=prompt)["count"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completions_default_max_tokens(server_factory, model_name):
    """OpenAI's /v1/completions defaults max_tokens to 16 (chat defaults to the
    rest of the context). A small context bounds the cost if it does not."""
    srv = server_factory("--max-model-len", "64")
    c = srv.openai()
    r = c.completions.create(model=model_name, prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 16, f"completions without max_tokens generated {r.usage.completion_tokens} tokens"
    r = c.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}], temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == 64  # chat: up to the context


def test_completions_length(client, model_name):
    r = complete(client, model_name, "Once upon a time", max_tokens=7)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7


def test_completions_list_of_prompts(client, model_name):
    prompts = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]
    singles = [complete(client, model_name, p, max_tokens=6).choices[0].text for p in prompts]
    r = complete(client, model_name, prompts, max_tokens=6)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    by_index = {c.index: c.text for c in r.choices}
    assert [by_index[i] for i in range(3)] == singles


def test_completions_token_ids(client, model_name, http):
    prompt = "The capital of France is"
    ids = tokenize(http, prompt=prompt)["tokens"]
    assert all(isinstance(i, int) for i in ids) and ids
    text = complete(client, model_name, prompt, max_tokens=6).choices[0].text
    r = complete(client, model_name, ids, max_tokens=6)
    assert r.choices[0].text == text
    assert r.usage.prompt_tokens == len(ids)
    # list of lists of ids
    ids2 = tokenize(http, prompt="1, 2, 3, 4,")["tokens"]
    r = complete(client, model_name, [ids, ids2], max_tokens=6)
    by_index = {c.index: c.text for c in r.choices}
    assert sorted(by_index) == [0, 1]
    assert by_index[0] == text
    assert by_index[1] == complete(client, model_name, "1, 2, 3, 4,", max_tokens=6).choices[0].text


def test_completions_echo(client, model_name):
    prompt = "The capital of France is"
    plain = complete(client, model_name, prompt, max_tokens=5).choices[0].text
    r = complete(client, model_name, prompt, max_tokens=5, echo=True)
    assert r.choices[0].text == prompt + plain, r.choices[0].text


def test_completions_stream(client, model_name):
    prompt = "Once upon a time"
    want = complete(client, model_name, prompt, max_tokens=10)
    parts, finish, usage = [], [], None
    for chunk in complete(client, model_name, prompt, max_tokens=10, stream=True, stream_options={"include_usage": True}):
        assert chunk.object == "text_completion"
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []
        for c in chunk.choices:
            parts.append(c.text)
            if c.finish_reason:
                finish.append(c.finish_reason)
    assert "".join(parts) == want.choices[0].text
    assert finish == ["length"]
    assert usage is not None and usage.completion_tokens == 10
    assert usage.prompt_tokens == want.usage.prompt_tokens


def test_completions_logprobs(client, model_name):
    r = complete(client, model_name, "The capital of France is", max_tokens=5, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, tlp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tlp <= 0.0
        assert isinstance(top, dict) and len(top) == 2, top
        best = max(top, key=top.get)
        assert best == tok  # greedy
        assert abs(top[best] - tlp) < 1e-4
    if lp.text_offset is not None:
        assert len(lp.text_offset) == n
        assert lp.text_offset == sorted(lp.text_offset)


# -- sampling -----------------------------------------------------------------


def test_seed_reproducibility(client, model_name):
    prompt = "Once upon a time"
    texts = {}
    for seed in (1, 2, 3):
        a = complete(client, model_name, prompt, max_tokens=16, temperature=0.9, seed=seed).choices[0].text
        b = complete(client, model_name, prompt, max_tokens=16, temperature=0.9, seed=seed).choices[0].text
        assert a == b, (seed, a, b)
        texts[seed] = a
    assert len(set(texts.values())) >= 2, texts


def test_extra_sampling_params(client, model_name):
    greedy = complete(client, model_name, "Once upon a time", max_tokens=10).choices[0].text
    # top_k=1 is greedy whatever the temperature
    r = complete(client, model_name, "Once upon a time", max_tokens=10, temperature=1.0, seed=5, extra_body={"top_k": 1})
    assert r.choices[0].text == greedy
    # the other knobs are accepted and produce text
    r = complete(
        client,
        model_name,
        "Once upon a time",
        max_tokens=10,
        temperature=0.7,
        top_p=0.9,
        seed=3,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        user="e2e",
        extra_body={"min_p": 0.05, "repetition_penalty": 1.1, "top_k": 40, "priority": "high"},
    )
    assert r.usage.completion_tokens == 10 or r.choices[0].finish_reason == "stop"
    assert r.choices[0].text


# -- tokenize / detokenize ------------------------------------------------------


# -- raw SSE ------------------------------------------------------------------------


# -- metrics --------------------------------------------------------------------------


def test_metrics_count_a_request(server, client, model_name):
    before = server.metrics()
    r = complete(client, model_name, "Once upon a time", max_tokens=5)
    assert r.choices[0].finish_reason == "length"
    u = r.usage

    def delta(after, name, **labels):
        return after.get(name, **labels) - before.get(name, default=0.0, **labels)

    # Metrics may be recorded just after the response is sent: poll briefly.
    deadline = time.monotonic() + 2.0
    while True:
        after = server.metrics()
        try:
            assert delta(after, "ingot_prompt_tokens_total") == u.prompt_tokens
            assert delta(after, "ingot_generation_tokens_total") == u.completion_tokens
            assert delta(after, "ingot_request_success_total", finish_reason="length") == 1
            assert delta(after, "ingot_request_success_total") == 1
            for h in ("ingot_time_to_first_token_seconds", "ingot_e2e_request_latency_seconds",
                      "ingot_request_queue_time_seconds"):
                assert delta(after, h + "_count") == 1, h
            # idle: nothing running, no KV block referenced (cached blocks count as free)
            assert after.get("ingot_num_requests_running") == 0
            assert after.get("ingot_kv_cache_usage_perc") == 0
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert delta(after, "ingot_inter_token_latency_seconds_count") == u.completion_tokens - 1
    assert after.get("ingot_num_requests_running") == 0
    assert after.get("ingot_num_requests_waiting") == 0
    assert 0.0 <= after.get("ingot_kv_cache_usage_perc") <= 1.0
    for h in ("ingot_time_to_first_token_seconds", "ingot_inter_token_latency_seconds",
              "ingot_e2e_request_latency_seconds", "ingot_request_queue_time_seconds",
              "ingot_iteration_tokens"):
        assert after.types.get(h) == "histogram", (h, after.types.get(h))
        assert after.has(h + "_bucket"), h
    for c in ("ingot_prompt_tokens_total", "ingot_generation_tokens_total", "ingot_request_success_total"):
        assert after.types.get(c) == "counter", (c, after.types.get(c))
    for g in ("ingot_num_requests_running", "ingot_num_requests_waiting", "ingot_kv_cache_usage_perc"):
        assert after.types.get(g) == "gauge", (g, after.types.get(g))


def test_metrics_fresh_server(server_factory):
    """Every gauge and counter is exported (at 0) before the first request,
    so scrapers and autoscalers see a complete picture from the start."""
    srv = server_factory()
    m = srv.metrics()
    missing = [n for n in ("ingot_num_requests_running", "ingot_num_requests_waiting", "ingot_kv_cache_usage_perc",
                           "ingot_prefix_cache_queries_total", "ingot_prefix_cache_hits_total", "ingot_num_preemptions_total",
                           "ingot_prompt_tokens_total", "ingot_generation_tokens_total") if not m.has(n)]
    assert not missing, f"fresh server's /metrics lacks {missing}; it has {m.names()}"
    assert m.get("ingot_num_requests_running") == 0
    assert m.get("ingot_num_requests_waiting") == 0
    assert m.get("ingot_kv_cache_usage_perc") == 0
