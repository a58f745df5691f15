"""KV held by one 4,096-position Gemma 3 270M sequence (a 4,000-token prompt
and 96 greedy tokens, 512-token prefill chunks, 8,192 KV tokens): the
`ingot_kv_cache_usage_perc` gauge polled while it runs, as pages and MiB
(f32 CPU K/V). From the repository root, with INGOT_BIN the binary:

    python tests/e2e/gemma3_kv_measure.py PAGES LAYERS_PER_PAGE

PAGES and LAYERS_PER_PAGE: 512 18 for a binary with one shared table per
sequence, 3072 3 for one with layer groups (docs/kv-cache.md)."""
import json, sys, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from ingot_e2e import REPO
import test_gemma3 as tg

KV_TOKENS, BLOCK = 8192, 16
pages, page_layers = int(sys.argv[1]), int(sys.argv[2])
ids = json.loads((REPO / "tests/fixtures/gemma3/long.json").read_text())[0]["prompt_ids"]
prompt = (ids * 3)[:4000]
srv = tg.GemmaServer("--kv-cache-tokens", str(KV_TOKENS), "--max-num-batched-tokens", "512")
try:
    import threading
    samples, done = [], threading.Event()
    def poll():
        while not done.is_set():
            samples.append(srv.metrics().get("ingot_kv_cache_usage_perc"))
            time.sleep(0.25)
    t = threading.Thread(target=poll)
    t.start()
    t0 = time.time()
    with srv.http(timeout=900) as http:
        r = http.post("/v1/completions", json={"model": tg.NAME, "prompt": prompt, "max_tokens": 96,
                                                "temperature": 0, "ignore_eos": True})
    done.set()
    t.join()
    assert r.status_code == 200, r.text
    last = [u for u in samples if u > 0][-3:]
    for label, u in [("peak (prefill, 512-token chunks)", max(samples)), ("decode, near position 4096", min(last))]:
        held = round(u * pages)
        mib = held * page_layers * BLOCK * 256 * 2 * 4 / 2**20
        print(json.dumps({"when": label, "usage": round(u, 4), "pages_held": held,
                          "layers_per_page": page_layers, "kv_MiB_f32": round(mib, 1)}))
    print(f"elapsed {time.time() - t0:.0f}s, {len(samples)} samples", file=sys.stderr)
except Exception:
    print(srv.log_tail(), file=sys.stderr)
    raise
finally:
    srv.stop_and_check()
