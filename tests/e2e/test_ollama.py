"""Ollama's API (issue 36) through the official `ollama` client against
the real binary: chat streamed as NDJSON, generate, list, and embed (on
all-MiniLM-L6-v2 served alone, from scripts/fetch-minilm as in
test_embeddings.py; that test skips when it is missing, failing under
CI=true)."""

from __future__ import annotations

import ollama
import pytest

from ingot_e2e import minilm_model, models_config, require, running

OPTIONS = {"temperature": 0, "num_predict": 12}


@pytest.fixture(scope="module")
def llama(server):
    return ollama.Client(host=server.url, timeout=30)


def test_chat_streams_and_closes_with_counts(llama, model_name):
    parts = list(llama.chat(model=model_name, messages=[{"role": "user", "content": "Say hello."}], stream=True, options=OPTIONS))
    *pieces, last = parts
    assert pieces and all(not p.done for p in pieces)
    text = "".join(p.message.content for p in pieces)
    assert text
    assert last.done and last.done_reason in ("stop", "length")
    assert 0 < last.eval_count <= 12 and last.prompt_eval_count > 0
    assert last.total_duration >= last.eval_duration > 0
    whole = llama.chat(model=model_name, messages=[{"role": "user", "content": "Say hello."}], stream=False, options=OPTIONS)
    assert whole.message.content == text, "greedy: the stream says what the whole answer said"


def test_generate_and_list(llama, model_name):
    r = llama.generate(model=model_name, prompt="The capital of France is", options=OPTIONS)
    assert r.done and r.response and r.eval_count <= 12
    names = [m.model for m in llama.list().models]
    assert model_name in names


def test_errors_are_ollama_errors(llama, model_name):
    with pytest.raises(ollama.ResponseError) as e:
        llama.chat(model=model_name, messages=[{"role": "user", "content": "Hi"}], options={"mirostat": 1})
    assert e.value.status_code == 400 and "options.mirostat" in e.value.error


def test_embed(tmp_path_factory):
    path, why = minilm_model()
    require(path, f"all-MiniLM-L6-v2 is not available: {why}")
    cfg = models_config(tmp_path_factory.mktemp("ollama") / "ingot.toml", {"minilm": path})
    with running("--config", str(cfg)) as srv:
        r = ollama.Client(host=srv.url, timeout=30).embed(model="minilm", input=["a cat", "a dog"])
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 384
    assert r.prompt_eval_count > 0
