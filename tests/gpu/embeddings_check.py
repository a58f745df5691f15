#!/usr/bin/env python3
"""all-MiniLM-L6-v2 on the CUDA encoder (issue 14, acceptance 3's GPU half),
run by tests/gpu/run.sh's `embeddings` phase on the GPU machine.

1. Accuracy: a few hundred varied sentences (tests/reference/bert_reference.py's
   generator) embedded by `ingot serve --device cuda` through the official
   `openai` client (raw HTTP with the same JSON when the package is absent),
   compared by cosine with the float32 numpy reference, with
   `ingot serve --device cpu`, and with transformers' BertModel on the GPU
   (float32, TF32 off; mean pooling + L2 normalisation, sentence-transformers'
   pipeline for this model) and sentence-transformers itself when installed.
2. Throughput in sentences/s on the same sentences and batch sizes: ingot
   (requests of `batch` sentences, 1 and 8 at a time) beside
   sentence-transformers' `encode(batch_size=batch)` in float32 and float16.

Prints a short table and exits non-zero when a cosine is below the bound.

    python3 tests/gpu/embeddings_check.py --ingot BIN --model MINILM_DIR
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import Pool
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests" / "reference"))
from bert_reference import BertReference, varied_sentences  # noqa: E402

COSINE = 0.9999
BATCHES = (32, 128)
ROUNDS = 4  # the sentence set repeated per throughput run
REF: BertReference | None = None


def ref_embed(text: str) -> list[float]:
    assert REF is not None
    return REF.embed(text).tolist()


class Server:
    """`ingot serve --model DIR --device D` on an ephemeral loopback port."""

    def __init__(self, ingot: str, model: str, device: str):
        self.proc = subprocess.Popen(
            [ingot, "serve", "--model", model, "--served-model-name", "minilm", "--device", device,
             "--host", "127.0.0.1", "--port", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.url, self.log = None, []
        found = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line.rstrip())
                m = re.search(r"listening on (http://[0-9.:]+)", line)
                if m and self.url is None:
                    self.url = m.group(1)
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(120):
            self.stop()
            raise SystemExit(f"ingot serve --device {device} did not listen:\n" + "\n".join(self.log[-30:]))
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        self.device = next((l for l in self.log if "serving embeddings on" in l), "?")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def client_embed(url: str, texts: list[str], batch: int, concurrency: int) -> tuple[np.ndarray, float, str]:
    """Embeds `texts` in requests of `batch`, `concurrency` at a time; the
    vectors in order, the wall seconds and which client sent them."""
    chunks = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    try:
        import openai

        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120)
        how = f"openai {openai.__version__}"

        def send(chunk):
            r = client.embeddings.create(model="minilm", input=chunk)
            return [d.embedding for d in sorted(r.data, key=lambda d: d.index)]
    except ImportError:
        how = "raw HTTP"

        def send(chunk):
            body = json.dumps({"model": "minilm", "input": chunk}).encode()
            req = urllib.request.Request(url + "/v1/embeddings", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                data = json.loads(r.read())["data"]
            return [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]

    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        rows = [row for part in pool.map(send, chunks) for row in part]
    assert len(rows) == len(texts), f"{len(rows)} vectors for {len(texts)} inputs"
    return np.asarray(rows, dtype=np.float64), time.perf_counter() - start, how


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (unit(a) * unit(b)).sum(-1)


def torch_side(model: str, sentences: list[str]) -> dict:
    """BertModel (f32, TF32 off) + mean pooling + normalisation; and
    sentence-transformers' own encode, timed in f32 and f16."""
    import torch
    from transformers import AutoTokenizer, BertModel

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok = AutoTokenizer.from_pretrained(model)
    bert = BertModel.from_pretrained(model).float().cuda().eval()
    rows = []
    with torch.no_grad():
        for i in range(0, len(sentences), 32):
            enc = tok(sentences[i:i + 32], padding=True, truncation=True, max_length=512, return_tensors="pt").to("cuda")
            states = bert(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            rows.append(torch.nn.functional.normalize(pooled, dim=-1).double().cpu().numpy())
    out = {"transformers": np.concatenate(rows)}
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:
        print(f"sentence-transformers not importable ({e}); timing BertModel instead")
        return out
    st = SentenceTransformer(model, device="cuda")
    # The model's sentence_bert_config.json truncates at 256 tokens; ingot
    # and the references take up to 512, so compare the same work.
    st.max_seq_length = 512
    out["sentence-transformers"] = st.encode(sentences, batch_size=32, convert_to_numpy=True).astype(np.float64)
    texts = sentences * ROUNDS
    for dtype in ("f32", "f16"):
        if dtype == "f16":
            st = st.half()
        for batch in BATCHES:
            st.encode(texts[: batch * 4], batch_size=batch)  # warm-up
            torch.cuda.synchronize()
            start = time.perf_counter()
            st.encode(texts, batch_size=batch, convert_to_numpy=True)
            torch.cuda.synchronize()
            out[f"st {dtype} b{batch}"] = len(texts) / (time.perf_counter() - start)
    return out


def main() -> None:
    global REF
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--sentences", type=int, default=300)
    ap.add_argument("--out", help="append JSON lines of the results here")
    a = ap.parse_args()

    REF = BertReference(a.model)
    sentences = varied_sentences(REF, a.sentences)
    tokens = [len(REF.encode(s)) for s in sentences]
    print(f"{len(sentences)} sentences, {min(tokens)}-{max(tokens)} tokens (mean {np.mean(tokens):.1f})")
    t0 = time.perf_counter()
    with Pool(min(12, os.cpu_count() or 1)) as pool:
        reference = np.asarray(pool.map(ref_embed, sentences, chunksize=4))
    print(f"numpy f32 reference: {time.perf_counter() - t0:.1f} s")

    results, failed = {}, False
    cuda = Server(a.ingot, a.model, "cuda")
    try:
        print("cuda server:", cuda.device[-120:])
        got, _, how = client_embed(cuda.url, sentences, 16, 4)
        results["ingot cuda"] = got
        rates = {}
        texts = sentences * ROUNDS
        for batch in BATCHES:
            client_embed(cuda.url, texts[: batch * 8], batch, 8)  # warm-up: GEMM plans
            for conc in (1, 8):
                _, secs, _ = client_embed(cuda.url, texts, batch, conc)
                rates[f"ingot b{batch} c{conc}"] = len(texts) / secs
    finally:
        cuda.stop()
    cpu = Server(a.ingot, a.model, "cpu")
    try:
        results["ingot cpu"], _, _ = client_embed(cpu.url, sentences, 16, 4)
    finally:
        cpu.stop()
    try:
        results.update(torch_side(a.model, sentences))
    except Exception as e:  # still report ingot's side
        print(f"torch side failed: {type(e).__name__}: {e}")
        failed = True
    rates.update({k: v for k, v in results.items() if k.startswith("st ")})

    print(f"client: {how}")
    print(f"{'ingot cuda vs':<28}{'min cos':>12}{'mean cos':>12}{'< ' + str(COSINE):>10}")
    rows = [("numpy f32 reference", reference)] + [(k, v) for k, v in results.items()
                                                    if isinstance(v, np.ndarray) and k != "ingot cuda"]
    summary = {}
    for name, other in rows:
        c = cosines(results["ingot cuda"], other)
        below = int((c < COSINE).sum())
        summary[name] = {"min": float(c.min()), "mean": float(c.mean()), "below": below}
        print(f"{name:<28}{c.min():>12.7f}{c.mean():>12.7f}{below:>10}")
        failed |= below > 0 and name != "sentence-transformers f16"
    c = cosines(results.get("transformers", reference), reference)
    print(f"{'(transformers vs numpy)':<28}{c.min():>12.7f}{c.mean():>12.7f}")
    print(f"throughput, {len(sentences) * ROUNDS} sentences (sentences/s):")
    for k, v in rates.items():
        print(f"  {k:<24}{v:>10.0f}")
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps({"embeddings": summary, "throughput": rates, "client": how}) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
