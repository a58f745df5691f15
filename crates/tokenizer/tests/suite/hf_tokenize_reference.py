"""Encodes texts with the Python `tokenizers` package as a reference.

Reads JSON from stdin: {"dir": path, "texts": [...]}; writes JSON
{"with": [[ids]...], "without": [[ids]...], "decoded": [text...]} where
`with`/`without` are encode(text, add_special_tokens=True/False) of
<dir>/tokenizer.json and `decoded` is decode(without, skip_special_tokens=True).
"""
import json
import sys

from tokenizers import Tokenizer

req = json.load(sys.stdin)
tok = Tokenizer.from_file(req["dir"] + "/tokenizer.json")
out = {"with": [], "without": [], "decoded": []}
for text in req["texts"]:
    out["with"].append(tok.encode(text, add_special_tokens=True).ids)
    ids = tok.encode(text, add_special_tokens=False).ids
    out["without"].append(ids)
    out["decoded"].append(tok.decode(ids, skip_special_tokens=True))
json.dump(out, sys.stdout)
