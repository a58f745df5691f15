"""Mixture-of-Experts models served on the CPU beside a dense one.

One server (`--device cpu`, three preloaded `[[models]]`) holds the default
SmolLM2 GGUF (dense) and two tiny random-weight MoE models that
tests/reference/moe_serve_models.py writes in this module's setup (~5 s):

- `qwen3moe`: a Hugging Face directory (Qwen3MoeForCausalLM, bf16, 2 layers
  of 8 experts top-2, vocab 151,936) with Qwen3's real tokenizer and chat
  template;
- `mixtral`: a GGUF as llama.cpp converts Mixtral (`llama` with
  `expert_count` 4, top-2, Q8_0, vocab 49,152) carrying SmolLM2's tokenizer.

Their output is gibberish (random weights) but deterministic, and greedy
decoding never picks a special token (the script scales those output rows
down), so every answer runs to max_tokens. Checked here: `/v1/models`
lists the three; `ingot inspect` prints the expert counts and the active
parameters; chat and completions through the official `openai` client
count prompt tokens as independent tokenizers do (Python `tokenizers` +
Jinja2 for Qwen3, the SmolLM2 fixture's ids for the GGUF) and stop with
"length"; streaming gives the same text as the plain answer; greedy answers
are the same sent one at a time and all at once (batched steps, each token
choosing its own experts), the dense model's included; and the dense model
still gives its reference answer.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from ingot_e2e import BIN, REPO, Server, get, model_path, require, wait_for

GENERATOR = REPO / "tests" / "reference" / "moe_serve_models.py"
SMOLLM2_FIXTURES = REPO / "tests" / "fixtures" / "smollm2" / "expected.json"
SMOLLM2_CASES = {c["name"]: c for c in json.loads(SMOLLM2_FIXTURES.read_text())}
KV_TOKENS = 1024
DENSE, QWEN, MIXTRAL = "smollm2", "qwen3moe", "mixtral"
MOE = (QWEN, MIXTRAL)
CHAT = SMOLLM2_CASES["chat_capital"]  # one user message, SmolLM2's ids of its rendering
TEXT = SMOLLM2_CASES["capital_text"]  # "The capital of France is"


def fetched(script: str) -> str:
    r = subprocess.run([str(REPO / "scripts" / script)], capture_output=True, text=True, timeout=300)
    require(r.returncode == 0, f"scripts/{script} failed: {r.stderr.strip()[-300:]}")
    return r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{id: path} of the three models, the two MoE ones generated here."""
    out = tmp_path_factory.mktemp("moe")
    tokenizers = fetched("fetch-hf-tokenizers")
    r = subprocess.run([sys.executable, str(GENERATOR), "--out", str(out), "--qwen3-tokenizer", f"{tokenizers}/qwen3",
                        "--smollm2-gguf", model_path()], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{GENERATOR.name} failed:\n{r.stderr[-3000:]}"
    return {DENSE: model_path(), QWEN: str(out / "qwen3moe_chat"), MIXTRAL: str(out / "mixtral_chat" / "model.gguf")}


@pytest.fixture(scope="module")
def srv(models, tmp_path_factory):
    cfg = tmp_path_factory.mktemp("moe-config") / "ingot.toml"
    cfg.write_text("".join(f'\n[[models]]\nid = "{i}"\npath = "{p}"\nkv_cache_tokens = {KV_TOKENS}\npreload = true\n'
                           for i, p in models.items()))
    s = Server("--config", str(cfg), "--device", "cpu")
    try:
        yield s
    finally:
        s.stop_and_check()


@pytest.fixture(scope="module")
def client(srv):
    c = srv.openai(timeout=60)
    yield c
    c.close()


def listed(srv: Server) -> dict[str, dict]:
    status, body = get(srv.url + "/v1/models")
    assert status == 200, body
    return {m["id"]: m for m in json.loads(body)["data"]}


# -- independent prompt token counts -----------------------------------------


@functools.lru_cache(maxsize=None)
def qwen3_tokenizer(model_dir: str):
    import tokenizers

    return tokenizers.Tokenizer.from_file(f"{model_dir}/tokenizer.json")


def qwen3_ids(model_dir: str, messages=None, prompt: str | None = None, **kwargs) -> list[int]:
    """Qwen3's tokenizer.json (the `tokenizers` library) on the prompt, or on the
    chat template rendered as transformers does (sandboxed Jinja2, trim_blocks,
    lstrip_blocks, add_generation_prompt)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if messages is not None:
        template = json.loads(open(f"{model_dir}/tokenizer_config.json").read())["chat_template"]
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        prompt = env.from_string(template).render(messages=messages, add_generation_prompt=True, **kwargs)
    return qwen3_tokenizer(model_dir).encode(prompt, add_special_tokens=False).ids  # Qwen3 adds no BOS


def expected_prompt_tokens(models, model: str, kind: str) -> int:
    if model == QWEN and kind == "chat":
        return len(qwen3_ids(models[QWEN], messages=CHAT["prompt"]))
    if model == QWEN:
        return len(qwen3_ids(models[QWEN], prompt=TEXT["prompt"]))
    return len((CHAT if kind == "chat" else TEXT)["prompt_ids"])  # SmolLM2's tokenizer, in the GGUF too


# -- tests -------------------------------------------------------------------


def test_models_lists_the_dense_and_both_moe_models_loaded(srv):
    def all_loaded():
        ms = listed(srv)
        return ms if all(m["state"] == "loaded" for m in ms.values()) else None

    ms = wait_for(all_loaded, timeout=30, interval=0.1, what="every model loaded")
    assert set(ms) == {DENSE, QWEN, MIXTRAL}
    for m in ms.values():
        assert m["object"] == "model" and m["max_model_len"] > 0, m
        assert "/v1/chat/completions" in m["endpoints"] and "/v1/completions" in m["endpoints"], m


def moe_params(vocab, tied, layers, hidden, heads, kv_heads, head_dim, qk_norm, experts, top_k, width):
    """(parameters, active parameters per token) of the generator's shapes: embeddings (+ an untied
    output), per layer q/k/v/o, two norms (+ Qwen3's q/k norms of head_dim), the router (experts x hidden)
    and experts x 3 x width x hidden; the final norm. Active: all but the unchosen experts' weights."""
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 2 * hidden + 2 * head_dim * qk_norm
    expert = 3 * width * hidden
    total = vocab * hidden * (1 if tied else 2) + layers * (attn + experts * hidden + experts * expert) + hidden
    return total, total - layers * (experts - top_k) * expert


# id -> (experts, top k, expert width, (parameters, active parameters)): tests/reference/moe_serve_models.py
INSPECT = {
    QWEN: (8, 2, 32, moe_params(151936, False, 2, 32, 4, 2, 32, True, 8, 2, 32)),
    MIXTRAL: (4, 2, 64, moe_params(49152, False, 2, 64, 4, 2, 16, False, 4, 2, 64)),
}


@pytest.mark.parametrize("model", MOE)
def test_inspect_prints_the_experts_and_active_parameters(models, model):
    r = subprocess.run([str(BIN), "inspect", models[model]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    experts, top_k, width, (params, active) = INSPECT[model]
    head = r.stdout.split("\nchat template:")[0]  # the summary, not the template's lines
    lines = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in head.splitlines())}
    assert lines["architecture"] == {QWEN: "qwen3moe", MIXTRAL: "mixtral"}[model], head
    assert lines["experts"].startswith(f"{experts} per layer, top {top_k} per token, width {width}"), head
    assert re.match(rf"{params} \(", lines["parameters"]), head
    assert re.match(rf"{active} \(.* M\) per token", lines["active params"]), head


@pytest.mark.parametrize("model", MOE)
def test_chat_and_completions_count_tokens_and_stop_at_max_tokens(client, models, model):
    chat = client.chat.completions.create(model=model, messages=CHAT["prompt"], max_tokens=7, temperature=0)
    assert chat.model == model
    assert chat.choices[0].finish_reason == "length"
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    u = chat.usage
    assert (u.prompt_tokens, u.completion_tokens) == (expected_prompt_tokens(models, model, "chat"), 7)
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens

    text = client.completions.create(model=model, prompt=TEXT["prompt"], max_tokens=5, temperature=0)
    assert text.choices[0].finish_reason == "length" and text.choices[0].text
    u = text.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (expected_prompt_tokens(models, model, "text"), 5,
                                                                      u.prompt_tokens + 5)


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_moe_thinking_switch_reaches_its_chat_template(client, models, thinking):
    """`chat_template_kwargs.enable_thinking` renders Qwen3's template with or without the empty
    think block (prompt token counts as Jinja2 renders it with the same kwargs)."""
    chat = client.chat.completions.create(model=QWEN, messages=CHAT["prompt"], max_tokens=2, temperature=0,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
    want = qwen3_ids(models[QWEN], messages=CHAT["prompt"], enable_thinking=thinking)
    assert chat.usage.prompt_tokens == len(want)
    on = qwen3_ids(models[QWEN], messages=CHAT["prompt"], enable_thinking=True)
    assert (len(want) == len(on)) == thinking, "the switch must change Qwen3's rendering"


@pytest.mark.parametrize("model", MOE)
def test_streaming_gives_the_plain_answer(client, model):
    body = dict(model=model, messages=[{"role": "user", "content": "Tell me a story about a dragon."}], max_tokens=12,
                temperature=0)
    plain = client.chat.completions.create(**body)
    deltas, finish, usage = [], [], None
    for chunk in client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            deltas.append(c.delta.content or "")
            finish.append(c.finish_reason)
        usage = chunk.usage or usage
    assert sum(1 for d in deltas if d) > 1, f"one chunk is not a stream: {deltas}"
    assert "".join(deltas) == plain.choices[0].message.content
    assert [f for f in finish if f] == ["length"]
    assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens == plain.usage.prompt_tokens


# (model, kind, prompt): mixed lengths and endpoints over both MoE models, and the dense model beside them.
PROMPTS = [("text", "The capital of France is"), ("text", "def fibonacci(n):"),
           ("chat", "Once upon a time, in a small village,"),
           ("chat", "List three primary colors, then explain why the sky is blue.")]
JOBS = [(m, k, p) for m in MOE for k, p in PROMPTS] + [
    (DENSE, "text", "Water boils at a temperature of"), (DENSE, "chat", "What is the capital of France?")]


def steps(srv: Server, model: str) -> float:
    return srv.metrics().get("ingot_iteration_tokens_count", model=model)


def test_greedy_answers_are_the_same_alone_and_batched(srv, client):
    """Each prompt alone, then all at once (released together by a barrier):
    the same greedy tokens, while the MoE engines took fewer steps than
    alone, i.e. sequences shared steps with different experts per token."""
    start = threading.Barrier(len(JOBS))

    def answer(job, together=False):
        model, kind, prompt = job
        common = dict(model=model, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
        if together:
            start.wait(timeout=30)
        if kind == "chat":
            r = client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
            out = r.choices[0].message.content
        else:
            r = client.completions.create(prompt=prompt, **common)
            out = r.choices[0].text
        assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length", (job, r)
        return out

    before = {m: steps(srv, m) for m in MOE}
    alone = [answer(j) for j in JOBS]
    mid = {m: steps(srv, m) for m in MOE}
    with ThreadPoolExecutor(len(JOBS)) as pool:
        together = list(pool.map(lambda j: answer(j, True), JOBS, timeout=60))
    after = {m: steps(srv, m) for m in MOE}
    for job, a, b in zip(JOBS, alone, together):
        assert a == b, f"{job}: alone {a!r}, batched {b!r}"
    for m in MOE:
        assert after[m] - mid[m] < mid[m] - before[m], (
            f"{m}: {after[m] - mid[m]} steps batched vs {mid[m] - before[m]} alone: the requests never shared a step")


def test_dense_model_gives_its_reference_answer_beside_them(client, srv):
    """SmolLM2's first greedy tokens (top-2 margins above 1.2 logits in the f32
    reference, so the native int8 path keeps them) and prompt count."""
    r = client.completions.create(model=DENSE, prompt=TEXT["prompt"], max_tokens=4, temperature=0)
    assert r.choices[0].text == " Paris.\n\n" and TEXT["greedy_text"].startswith(r.choices[0].text)
    assert min(TEXT["margins"][:4]) > 1.0
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(TEXT["prompt_ids"]), 4)
    assert all(m["state"] == "loaded" for m in listed(srv).values())
