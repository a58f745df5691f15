#!/usr/bin/env python3
"""Checks the numpy BERT reference (bert_reference.py) against sentence-transformers itself, with the
same weights, on the e2e test's generated sentences; also checks the reference tokenizer's counts
against transformers' BertTokenizerFast. Needs torch, so it runs in a throwaway venv, never in CI:

    python3 -m venv /tmp/st && /tmp/st/bin/pip install sentence-transformers numpy tokenizers
    /tmp/st/bin/python tests/reference/check_bert_reference.py --model "$(scripts/fetch-minilm)"

Prints the worst cosine and the token-count agreement; exits 1 below --min-cosine. sentence-transformers
truncates at max_seq_length (256 for MiniLM); it is raised to 512 here so long inputs compare whole.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bert_reference import BertReference, varied_sentences  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--min-cosine", type=float, default=0.9999)
    a = ap.parse_args()
    from sentence_transformers import SentenceTransformer

    ref = BertReference(a.model)
    texts = varied_sentences(ref, a.count)
    st = SentenceTransformer(a.model, device="cpu")
    st.max_seq_length = 512
    start = time.perf_counter()
    theirs = st.encode(texts, batch_size=32, convert_to_numpy=True)
    elapsed = time.perf_counter() - start
    ours = np.stack([ref.embed(t) for t in texts])
    cos = (ours * theirs).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    counts_ref = [len(ref.encode(t)) for t in texts]
    counts_st = [len(ids) for ids in st.tokenizer(texts)["input_ids"]]
    same_counts = sum(x == y for x, y in zip(counts_ref, counts_st))
    print(f"{len(texts)} sentences ({min(counts_ref)}-{max(counts_ref)} tokens): worst cosine "
          f"{cos.min():.7f}, mean {cos.mean():.7f}; token counts equal for {same_counts}/{len(texts)}; "
          f"sentence-transformers encoded them in {elapsed:.2f} s")
    return 0 if cos.min() >= a.min_cosine and same_counts == len(texts) else 1


if __name__ == "__main__":
    sys.exit(main())
