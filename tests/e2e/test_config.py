"""One validated config: the example validates against the generated JSON
schema; bad values fail at start with one line naming key, value, bound and
source; `ingot config show` names the source of every value; a reload
changes a flag live without dropping a request."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import tomllib

import httpx2 as httpx
import jsonschema

from ingot_e2e import BIN, REPO, iter_sse_data, model_path, wait_for

EXAMPLE = REPO / "ingot.example.toml"


def ingot(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1", **(env or {})})


def test_example_config_validates_against_the_schema():
    out = ingot("config", "schema")
    assert out.returncode == 0, out.stderr
    schema = json.loads(out.stdout)
    example = tomllib.loads(EXAMPLE.read_text())
    jsonschema.validate(example, schema)
    # The schema is strict: an unknown key or a wrong type is refused.
    bad = {**example, "server": {**example.get("server", {}), "bogus": 1}}
    try:
        jsonschema.validate(bad, schema)
        raise AssertionError("the schema accepted an unknown key")
    except jsonschema.ValidationError:
        pass
    assert ingot("config", "validate", str(EXAMPLE)).returncode == 0


def one_line_failure(out: subprocess.CompletedProcess, *needles: str) -> str:
    assert out.returncode != 0, f"expected a failure, got 0\n{out.stdout}\n{out.stderr}"
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, f"expected one error line, got:\n{out.stderr}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    return lines[0]


def test_bad_values_fail_at_start_naming_key_value_and_source(tmp_path):
    m = model_path()
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[server]\nport = 8000\nbogus_key = 1\n")
    one_line_failure(ingot("serve", "--model", m, "--config", str(unknown)), "server.bogus_key", "unknown.toml:3")

    wrong_type = tmp_path / "type.toml"
    wrong_type.write_text("# comment\n[scheduler]\nmax_num_seqs = \"lots\"\n")
    one_line_failure(ingot("serve", "--model", m, "--config", str(wrong_type)),
                     "scheduler.max_num_seqs", "lots", "type.toml:3")

    one_line_failure(ingot("serve", "--model", m, env={"INGOT_SCHEDULER_MAX_NUM_SEQS": "0"}),
                     "scheduler.max_num_seqs", "0", "INGOT_SCHEDULER_MAX_NUM_SEQS")
    one_line_failure(ingot("serve", "--model", m, "--gpu-memory-utilization", "1.5"),
                     "model.gpu_memory_utilization", "1.5", "--gpu-memory-utilization")
    rollout = tmp_path / "rollout.toml"
    rollout.write_text("[flags.coalescing]\nenabled = true\nrollout_percent = 140\n")
    one_line_failure(ingot("serve", "--model", m, "--config", str(rollout)),
                     "flags.coalescing.rollout_percent", "140", "100", "rollout.toml:3")
    assert "error" in ingot("config", "validate", str(unknown)).stderr


def test_show_names_every_source(tmp_path):
    cfg = tmp_path / "ingot.toml"
    cfg.write_text("[scheduler]\nmax_waiting = 99\n\n[cache]\nttl = \"90s\"\n")
    out = ingot("config", "show", "--config", str(cfg), "--max-num-seqs", "7",
                env={"INGOT_SERVER_PORT": "9123"})
    assert out.returncode == 0, out.stderr
    lines = {ln.split("=", 1)[0].strip(): ln for ln in out.stdout.splitlines() if "=" in ln}
    assert "ingot.toml:2" in lines["scheduler.max_waiting"]
    assert "ingot.toml:5" in lines["cache.ttl"]
    assert "INGOT_SERVER_PORT" in lines["server.port"] and "9123" in lines["server.port"]
    assert "--max-num-seqs" in lines["scheduler.max_num_seqs"]
    assert "default" in lines["scheduler.max_num_batched_tokens"]


def test_reload_changes_a_flag_live_without_dropping_a_request(server_factory, model_name, tmp_path):
    cfg = tmp_path / "ingot.toml"
    cfg.write_text("[flags.response_cache]\nenabled = false\n")
    srv = server_factory("--config", str(cfg))
    body = {"model": model_name, "prompt": "A list of rivers:", "max_tokens": 12, "temperature": 0}
    long_body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 200, "temperature": 0,
                 "ignore_eos": True, "stream": True}
    result = {}

    def long_stream():
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            with c.stream("POST", "/v1/completions", json=long_body) as r:
                finish = None
                for data in iter_sse_data(r):
                    if data == "[DONE]":
                        break
                    for ch in json.loads(data)["choices"]:
                        finish = ch.get("finish_reason") or finish
                result["finish"] = finish

    with srv.http() as http:
        assert http.post("/v1/completions", json=body).headers["x-ingot-cache"] == "miss"
        assert http.post("/v1/completions", json=body).headers["x-ingot-cache"] == "miss"
        t = threading.Thread(target=long_stream)
        t.start()
        wait_for(lambda: srv.metrics().get("ingot_num_requests_running") == 1, 10, what="the long stream running")
        cfg.write_text("[flags.response_cache]\nenabled = true\n\n[scheduler]\nmax_num_seqs = 3\n")
        srv.send_signal(signal.SIGHUP)

        def flag_on():
            flags = {f["name"]: f for f in http.get("/admin/flags").json()["data"]}
            return flags["response_cache"]["enabled"]

        wait_for(flag_on, 10, what="the response_cache flag on after SIGHUP")
        t.join(120)
        assert result.get("finish") == "length", "the stream in flight during the reload completed"
        assert http.post("/v1/completions", json=body).headers["x-ingot-cache"] == "miss"
        assert http.post("/v1/completions", json=body).headers["x-ingot-cache"] == "hit"
        # A key that cannot change live is reported, not applied.
        r = http.post("/admin/reload")
        assert r.status_code == 200, r.text
        assert "scheduler.max_num_seqs" in r.json()["needs_restart"]
        effective = http.get("/admin/config").json()
        assert effective["config"]["scheduler"]["max_num_seqs"] == 64
        # A broken file is refused and changes nothing.
        cfg.write_text("[flags.response_cache]\nenabled = 3\n")
        r = http.post("/admin/reload")
        assert r.status_code == 400 and "flags.response_cache.enabled" in r.json()["error"]["message"]
        assert flag_on()
