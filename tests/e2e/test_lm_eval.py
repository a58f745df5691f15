"""lm-evaluation-harness (the real `lm-eval` package) against `ingot serve`.

A loglikelihood task over a local JSONL file (tests/fixtures/lm_eval) runs
through `local-completions`, which sends each context + continuation with
`echo`, `logprobs` and `max_tokens: 1`, tokenizing through the server's
`/tokenize` (its remote tokenizer, found through `/tokenizer_info`: no hub
access needed). Every example's loglikelihood must equal the sum of the
continuation's token logprobs that `ingot generate --score` computes one
decode step at a time on the model runner.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ingot_e2e import BIN, REPO, model_path, require_module

require_module("lm_eval", "lm-eval is not installed (scripts/python-env installs it)")

FIXTURES = REPO / "tests" / "fixtures" / "lm_eval"
TASK = "ingot_loglikelihood"
# Offline: the dataset is a local file and the tokenizer is the server's.
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_lm_eval(url: str, model: str, out: Path, concurrent: int) -> list[dict]:
    args = [
        sys.executable, "-m", "lm_eval", "run",
        "--model", "local-completions",
        "--model_args",
        f"base_url={url}/v1/completions,model={model},num_concurrent={concurrent},"
        "max_retries=1,tokenizer_backend=remote,tokenized_requests=True",
        "--tasks", TASK,
        "--include_path", str(FIXTURES),
        "--output_path", str(out),
        "--log_samples",
    ]
    env = {**os.environ, **OFFLINE, "HF_DATASETS_CACHE": str(out / "datasets")}
    # The task's data_files path is relative to the fixtures directory.
    done = subprocess.run(args, cwd=FIXTURES, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    samples = list(out.rglob(f"samples_{TASK}_*.jsonl"))
    assert len(samples) == 1, f"{samples}\n{done.stderr[-4000:]}"
    return [json.loads(line) for line in samples[0].read_text().splitlines() if line.strip()]


@functools.lru_cache(maxsize=None)
def reference_score(context: str, continuation: str) -> dict:
    done = subprocess.run(
        [str(BIN), "generate", "--model", model_path(), "--prompt", context, "--score", continuation],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_loglikelihoods_match_ingot_generate(server, model_name, tmp_path):
    # Four concurrent requests: the batched path, checked against the
    # unbatched reference (one lm-eval run is ~20 s of CI's CPU, most of it
    # lm-eval's imports, so the unbatched run is not repeated).
    docs = [json.loads(line) for line in (FIXTURES / "loglikelihood.jsonl").read_text().splitlines()]
    # The reference scores (a process each) run while lm-eval does.
    with ThreadPoolExecutor(2) as pool:
        refs = [pool.submit(reference_score, d["context"], d["continuation"]) for d in docs]
        samples = run_lm_eval(server.url, model_name, tmp_path, concurrent=4)
        for r in refs:
            r.result()
    assert len(samples) == len(docs)
    by_text = {}
    for sample in samples:
        doc = sample["doc"]
        # The samples log writes each response as [loglikelihood, is_greedy] strings.
        (loglikelihood, is_greedy), = sample["resps"][0]
        loglikelihood, is_greedy = float(loglikelihood), str(is_greedy) == "True"
        want = reference_score(doc["context"], doc["continuation"])
        assert abs(loglikelihood - want["sum"]) < 1e-4, (doc, loglikelihood, want)
        assert is_greedy == want["greedy"], (doc, is_greedy, want)
        by_text[(doc["context"], doc["continuation"])] = loglikelihood
    assert len(by_text) == len(docs)
    # Sanity: the model prefers the right answers.
    assert by_text[("The capital of France is", " Paris")] > by_text[("The capital of France is", " Berlin")]
