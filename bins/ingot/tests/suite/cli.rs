//! End-to-end tests of the `ingot` binary on the real test model.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::bench_serve::http_status;

fn ingot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(args)
        .env("INGOT_THREADS", "2")
        .env_remove("RUST_BACKTRACE")
        .output()
        .expect("the ingot binary runs")
}

fn model() -> String {
    ingot_testkit::smollm2_gguf().display().to_string()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A user error: non-zero exit, one `error:` line naming the problem, no panic.
fn assert_clean_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert!(
        !o.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "want one error line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(
        lines[0].contains(needle),
        "error should mention {needle:?}: {err}"
    );
}

#[test]
fn chat_answers_capital_of_france() {
    let o = ingot(&[
        "generate",
        "--model",
        &model(),
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "32",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Paris"), "answer: {}", stdout(&o));
}

#[test]
fn stop_string_is_not_printed_and_max_tokens_bounds_output() {
    let o = ingot(&[
        "generate",
        "--model",
        &model(),
        "--prompt",
        "The capital of France is",
        "--stop",
        ".",
        "--max-tokens",
        "20",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.trim_end(), " Paris", "{out:?}");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let run = |seed: &str| {
        stdout(&ingot(&[
            "generate",
            "--model",
            &model(),
            "--prompt",
            "Once upon a time",
            "--temperature",
            "0.9",
            "--top-p",
            "0.95",
            "--seed",
            seed,
            "--max-tokens",
            "24",
        ]))
    };
    let a = run("42");
    assert!(!a.trim().is_empty());
    assert_eq!(a, run("42"));
}

#[test]
fn inspect_into_a_closed_pipe_ends_quietly() {
    // `ingot inspect M | head -1`: the reader is gone before the report is
    // written (the model is opened first); no panic, success.
    let mut child = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["inspect", &model()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .env_remove("RUST_BACKTRACE")
        .spawn()
        .expect("the ingot binary runs");
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

#[test]
fn inspect_reports_the_model() {
    let o = ingot(&["inspect", &model()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "architecture:    llama",
        "Q4_1 x",
        "Q8_0 x",
        " MB)",
        "context length:  8192",
        "vocab size:      49152",
        "<|im_start|>",
        "<|im_end|>",
        "chat template:",
        "gpt2",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    assert!(
        out.contains("134.5 M") || out.contains("134.") || out.contains("135."),
        "{out}"
    );
}

#[test]
fn bench_latency_reports_rates() {
    let o = ingot(&[
        "bench",
        "latency",
        "--model",
        &model(),
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--num-iters",
        "1",
        "--num-iters-warmup",
        "0",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0);
    assert!(v["prefill_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn bench_throughput_samples_when_asked_and_rejects_bad_knobs() {
    let base = [
        "bench",
        "throughput",
        "--model",
        &model(),
        "--num-prompts",
        "3",
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--max-num-seqs",
        "3",
        "--json",
    ];
    let sampled: Vec<&str> = base
        .iter()
        .copied()
        .chain(["--temperature", "0.8", "--top-p", "0.9", "--top-k", "40"])
        .chain(["--logprobs", "3"])
        .collect();
    let o = ingot(&sampled);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    assert!(v["output_tok_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["sampling"]["top_k"], 40);
    assert!((v["sampling"]["temperature"].as_f64().unwrap() - 0.8).abs() < 1e-6);
    assert_eq!(v["sampling"]["logprobs"], 3);
    let bad: Vec<&str> = base.iter().copied().chain(["--top-p", "1.5"]).collect();
    assert_clean_error(&ingot(&bad), "top_p must be in (0, 1]");
    let bad: Vec<&str> = base.iter().copied().chain(["--logprobs", "21"]).collect();
    assert_clean_error(&ingot(&bad), "top_logprobs");
}

#[test]
fn missing_model_file_is_one_clear_line() {
    let o = ingot(&[
        "generate",
        "--model",
        "/nonexistent/model.gguf",
        "--prompt",
        "hi",
    ]);
    assert_clean_error(&o, "/nonexistent/model.gguf");
}

#[test]
fn truncated_gguf_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.gguf");
    let bytes = std::fs::read(model()).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let o = ingot(&[
        "generate",
        "--model",
        cut.to_str().unwrap(),
        "--prompt",
        "hi",
    ]);
    assert_clean_error(&o, "truncated");
    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"definitely not a gguf file").unwrap();
    let o = ingot(&["inspect", garbage.to_str().unwrap()]);
    assert_clean_error(&o, "GGUF");
}

fn hf_dir(dir: &Path, architecture: &str) -> PathBuf {
    std::fs::write(
        dir.join("config.json"),
        format!(
            r#"{{"architectures":["{architecture}"],"hidden_size":64,"intermediate_size":128,
            "num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"vocab_size":32}}"#
        ),
    )
    .unwrap();
    dir.to_path_buf()
}

#[test]
fn unknown_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = hf_dir(dir.path(), "GPTBigCodeForCausalLM");
    let o = ingot(&["inspect", d.to_str().unwrap()]);
    assert_clean_error(&o, "GPTBigCodeForCausalLM");
}

#[test]
fn corrupt_safetensors_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = hf_dir(dir.path(), "LlamaForCausalLM");
    std::fs::write(
        d.join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
    )
    .unwrap();
    let o = ingot(&["inspect", d.to_str().unwrap()]);
    assert_clean_error(&o, "safetensors");
}

#[test]
fn prompt_longer_than_context_is_rejected() {
    let long = "word ".repeat(100);
    let o = ingot(&[
        "generate",
        "--model",
        &model(),
        "--max-model-len",
        "64",
        "--prompt",
        &long,
        "--max-tokens",
        "8",
    ]);
    assert_clean_error(&o, "maximum context length is 64 tokens");
}

#[test]
fn invalid_sampling_value_names_the_field() {
    let o = ingot(&[
        "generate",
        "--model",
        &model(),
        "--prompt",
        "hi",
        "--top-p",
        "1.5",
    ]);
    assert_clean_error(&o, "top_p");
}

#[test]
fn bf16_weights_still_answer_paris() {
    let o = ingot(&[
        "generate",
        "--model",
        &model(),
        "--dtype",
        "bf16",
        "--chat",
        "--prompt",
        "What is the capital of France?",
        "--max-tokens",
        "16",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Paris"), "answer: {}", stdout(&o));
}

#[test]
fn logits_writes_one_vocab_row_and_auto_device_falls_back_to_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("logits.f32");
    let o = ingot(&[
        "logits",
        "--model",
        &model(),
        "--prompt-ids",
        "1,504,3575,282",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let json: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    // No GPU on the test machine: auto picks the CPU and says so.
    let device = json["device"].as_str().unwrap();
    if ingot_runner_cuda_unavailable() {
        assert!(device.starts_with("cpu"), "{device}");
    }
    assert_eq!(json["prompt_ids"], serde_json::json!([1, 504, 3575, 282]));
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len(), 49152 * 4);
    let logits: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let top = json["top"][0][0].as_u64().unwrap() as usize;
    let argmax = (0..logits.len())
        .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
        .unwrap();
    assert_eq!(top, argmax);
}

/// True on machines without a CUDA driver (CI).
fn ingot_runner_cuda_unavailable() -> bool {
    !Path::new("/proc/driver/nvidia").exists()
}

#[test]
fn device_cuda_without_a_gpu_is_a_clear_error() {
    if !ingot_runner_cuda_unavailable() {
        return; // a GPU machine runs the CUDA checks in tests/gpu instead
    }
    let o = ingot(&[
        "logits",
        "--model",
        &model(),
        "--device",
        "cuda",
        "--prompt-ids",
        "1",
        "--out",
        "/dev/null",
    ]);
    assert_clean_error(&o, "--device cuda: CUDA unavailable");
}

#[test]
fn tensor_parallel_off_the_gpu_is_a_clear_error() {
    let run = |device: &str, size: &str| {
        ingot(&[
            "logits",
            "--model",
            &model(),
            "--device",
            device,
            "--tensor-parallel-size",
            size,
            "--prompt-ids",
            "1",
            "--out",
            "/dev/null",
        ])
    };
    let o = run("cpu", "2");
    assert_clean_error(&o, "model.tensor_parallel_size");
    assert_clean_error(&o, "needs the CUDA backend");
    if ingot_runner_cuda_unavailable() {
        // `auto` falls back to the CPU, which cannot split the model.
        let o = run("auto", "2");
        assert_clean_error(
            &o,
            "model.tensor_parallel_size = 2 splits the model over GPUs",
        );
    }
    assert_clean_error(&run("cpu", "0"), "model.tensor_parallel_size");
}

#[test]
fn an_fp8_kv_cache_on_the_cpu_is_a_clear_error() {
    for device in ["cpu", "auto"] {
        if device == "auto" && !ingot_runner_cuda_unavailable() {
            continue; // auto lands on the GPU there
        }
        let o = ingot(&[
            "logits",
            "--model",
            &model(),
            "--device",
            device,
            "--kv-cache-dtype",
            "fp8",
            "--prompt-ids",
            "1",
            "--out",
            "/dev/null",
        ]);
        assert_clean_error(&o, "model.kv_cache_dtype = \"fp8\" needs the CUDA backend");
    }
    // `auto` is the default and runs anywhere.
    let o = ingot(&[
        "logits",
        "--model",
        &model(),
        "--device",
        "cpu",
        "--kv-cache-dtype",
        "auto",
        "--prompt-ids",
        "1",
        "--out",
        "/dev/null",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

fn example_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ingot.example.toml")
}

#[test]
fn config_validate_accepts_the_example_and_names_a_bad_key() {
    let example = example_config();
    let o = ingot(&["config", "validate", example.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("ok: "), "{}", stdout(&o));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[scheduler]\nmax_num_seqs = 8\nmax_num_seq = 9\n").unwrap();
    let o = ingot(&["config", "validate", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert_clean_error(&o, "scheduler.max_num_seq (");
    assert_clean_error(&o, "bad.toml:3): unknown key; expected one of ");
}

#[test]
fn config_schema_is_json_with_every_section() {
    let o = ingot(&["config", "schema"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let schema: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for section in [
        "model",
        "engine",
        "scheduler",
        "server",
        "cache",
        "cuda",
        "log",
        "flags",
    ] {
        assert!(schema["properties"].get(section).is_some(), "{section}");
    }
}

#[test]
fn config_show_names_the_source_of_each_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ingot.toml");
    std::fs::write(&file, "[scheduler]\nmax_waiting = 99\n").unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["config", "show", "--config", file.to_str().unwrap()])
        .args(["--max-num-seqs", "7", "--priority-deadlines", "1,2,3,4,5m"])
        .env("INGOT_SERVER_PORT", "9123")
        .env("INGOT_THREADS", "3")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line = |key: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in\n{out}"))
            .to_string()
    };
    assert!(line("scheduler.max_waiting").ends_with("ingot.toml:2"));
    assert!(line("scheduler.max_num_seqs").ends_with("# flag --max-num-seqs"));
    assert!(line("server.port").contains("9123"));
    assert!(line("server.port").ends_with("# env INGOT_SERVER_PORT"));
    assert!(line("model.threads").ends_with("# env INGOT_THREADS"));
    assert!(line("scheduler.priority_deadlines.background").contains("\"5m\""));
    assert!(line("scheduler.max_num_batched_tokens").contains("= 512 "));
    assert!(line("scheduler.max_num_batched_tokens").ends_with("# default"));
}

#[test]
fn serve_refuses_a_bad_config_before_binding() {
    let o = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["serve", "--model", &model(), "--port", "0"])
        .env("INGOT_SCHEDULER_MAX_NUM_SEQS", "0")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert_clean_error(
        &o,
        "scheduler.max_num_seqs = 0 (env INGOT_SCHEDULER_MAX_NUM_SEQS): must be at least 1",
    );
    let o = ingot(&[
        "serve",
        "--model",
        &model(),
        "--max-num-batched-tokens",
        "8",
    ]);
    assert_clean_error(&o, "must be at least engine.block_size (16)");
    let o = ingot(&["serve", "--model", &model(), "--priority-deadlines", "1,2"]);
    assert_clean_error(&o, "--priority-deadlines needs 5 values");
    let o = ingot(&["serve", "--port", "0"]);
    assert_clean_error(
        &o,
        "model.path is required (--model, model.path in the config, or INGOT_MODEL)",
    );
}

#[test]
fn generate_takes_its_settings_from_the_same_loader() {
    // An INGOT_* typo fails every model command, not only serve.
    let o = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["generate", "--model", &model(), "--prompt", "hi"])
        .env("INGOT_MODEL_DTYPES", "bf16")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert_clean_error(
        &o,
        "model.dtypes = \"bf16\" (env INGOT_MODEL_DTYPES): unknown key",
    );
    // INGOT_MODEL still names the model.
    let o = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["generate", "--prompt", "The capital of France is"])
        .args(["--max-tokens", "3"])
        .env("INGOT_MODEL", model())
        .env("INGOT_THREADS", "2")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("Paris"), "{}", stdout(&o));
}

/// The stderr of `ingot serve` of the test model on a free port with
/// `args` added, read until `/ready` answers 200 and (if given) a line
/// contains `until`; the server is killed then.
fn serve_stderr(args: &[&str], until: Option<&str>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ingot"));
    cmd.args(["serve", "--model", &model(), "--port", "0"])
        .args(["--served-model-name", "tiny", "--max-num-seqs", "2"])
        .args(args)
        .env("INGOT_THREADS", "2")
        .env_remove("RUST_BACKTRACE")
        .env_remove("NO_COLOR")
        .env_remove("INGOT_LOG")
        .env_remove("INGOT_LOG_LEVEL");
    let mut ready = false;
    let ((), err) = serve_until(cmd, 120, |url, lines| {
        ready = ready || http_status(url, "/ready") == Some(200);
        let seen = until.is_none_or(|u| lines.iter().any(|l| l.contains(u)));
        (ready && seen).then_some(())
    });
    err
}

/// Runs `ingot serve` (`cmd`, on `--port 0`), reading its stderr, until
/// `done(url, lines so far)` gives a value (polled every 50 ms once the
/// address is known) or `deadline_s` passes (a panic with the stderr);
/// kills it then. Returns the value and the whole stderr.
pub fn serve_until<T>(
    mut cmd: Command,
    deadline_s: u64,
    mut done: impl FnMut(&str, &[String]) -> Option<T>,
) -> (T, String) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ingot serve starts");
    let pipe = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines: Vec<String> = Vec::new();
    let mut url: Option<String> = None;
    let deadline = Instant::now() + Duration::from_secs(deadline_s);
    let value = loop {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            if let Some(u) = line.strip_prefix("listening on ") {
                url = Some(u.trim().to_string());
            }
            lines.push(line);
        }
        if let Some(value) = url.as_deref().and_then(|u| done(u, &lines)) {
            break value;
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let _ = child.wait();
            lines.extend(rx.try_iter());
            panic!("ingot serve never got ready:\n{}", lines.join("\n"));
        }
    };
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    (value, lines.join("\n"))
}

#[test]
fn serve_prints_a_startup_summary_without_colours_unless_warn() {
    // The default level shows the summary: the model, where it runs, its
    // size, KV capacity and context, then the address once ready.
    let err = serve_stderr(
        &["--kv-cache-tokens", "4096", "--max-model-len", "1024"],
        Some("ready on http://"),
    );
    assert!(!err.contains("\x1b["), "ANSI codes in a pipe:\n{err}");
    let line = err
        .lines()
        .find(|l| l.contains("tiny serving on cpu"))
        .unwrap_or_else(|| panic!("no summary line for the model:\n{err}"));
    for needle in [
        "INFO ingot::startup:",
        "architecture=llama",
        "parameters=13",
        "weights_mib=",
        "kv_tokens=4096",
        "kv_sequences=4",
        "max_context=1024",
        "reasoning_parser=none",
    ] {
        assert!(line.contains(needle), "missing {needle:?} in {line}");
    }
    assert!(
        err.lines()
            .any(|l| l.contains("features") && l.contains("prefix_caching=true")),
        "{err}"
    );
    // `--log-level warn` hides it; the address line stays (tools read it).
    let err = serve_stderr(&["--log-level", "warn"], None);
    assert!(!err.contains("ingot::startup"), "{err}");
    assert!(!err.contains("serving on"), "{err}");
    assert!(err.contains("listening on http://"), "{err}");
    assert!(!err.contains("\x1b["), "ANSI codes in a pipe:\n{err}");
}

#[test]
fn a_config_error_is_one_line_whatever_rust_backtrace_says() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[scheduler]\nmax_num_seq = 9\n").unwrap();
    let serve = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ingot"))
            .args(["serve", "--model", &model(), "--port", "0"])
            .args(["--config", bad.to_str().unwrap()])
            .args(extra)
            .env("RUST_BACKTRACE", "1")
            .env_remove("RUST_LIB_BACKTRACE")
            .env_remove("INGOT_LOG")
            .env_remove("INGOT_LOG_LEVEL")
            .output()
            .unwrap()
    };
    let o = serve(&[]);
    assert_clean_error(&o, "scheduler.max_num_seq (");
    assert!(!stderr(&o).contains("\x1b["), "{}", stderr(&o));
    // A backtrace is for debugging: only at the debug level.
    let o = serve(&["--log-level", "debug"]);
    let err = stderr(&o);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.lines().count() > 1, "no backtrace at debug:\n{err}");
}

#[test]
fn log_level_flag_sets_log_level_on_each_command() {
    let m = model();
    for mut args in [
        vec!["serve", "--model", &m, "--port", "0"],
        vec!["generate", "--model", &m, "--prompt", "hi"],
        vec!["inspect", &m],
        vec!["route", "--check"],
    ] {
        args.extend(["--log-level", "ingot=loud"]);
        assert_clean_error(
            &ingot(&args),
            "log.level = \"ingot=loud\" (flag --log-level): not a tracing filter directive",
        );
    }
}

#[test]
fn chat_template_replaces_the_models_own_and_is_checked_at_start_up() {
    let chat = |template: &str| {
        ingot(&[
            "generate",
            "--model",
            &model(),
            "--chat",
            "--prompt",
            "hi",
            "--max-tokens",
            "1",
            "--chat-template",
            template,
        ])
    };
    // Inline: the operator's template renders the prompt (its raise shows).
    let o = chat("{{ raise_exception('the operator template ran') }}");
    assert!(!o.status.success(), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("the operator template ran"),
        "{}",
        stderr(&o)
    );
    // From a file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chat.jinja");
    std::fs::write(&file, "{{ raise_exception('the file template ran') }}").unwrap();
    let o = chat(file.to_str().unwrap());
    assert!(
        stderr(&o).contains("the file template ran"),
        "{}",
        stderr(&o)
    );
    // Broken, or neither a file nor Jinja: one line naming the setting,
    // before any model loads.
    for (template, says) in [
        ("{% if %}", "model.chat_template"),
        ("/no/such/chat.jinja", "neither a file nor a Jinja template"),
    ] {
        let o = ingot(&[
            "serve",
            "--model",
            &model(),
            "--port",
            "0",
            "--chat-template",
            template,
        ]);
        assert_clean_error(&o, says);
    }
}

/// A draft model (here the model itself) leaves the answer as it was, and
/// as its own draft every proposal holds (`bench latency` reports it).
#[test]
fn a_draft_model_keeps_the_answer() {
    let m = model();
    let draft = format!(r#"{{"method": "draft", "model": {m:?}, "adaptive": false}}"#);
    let args = [
        "generate",
        "--model",
        &m,
        "--prompt",
        "Name three colours.",
        "--max-tokens",
        "16",
    ];
    let plain = ingot(&args);
    let drafted = ingot(&[&args[..], &["--speculative-config", &draft]].concat());
    assert!(drafted.status.success(), "{}", stderr(&drafted));
    assert_eq!(stdout(&plain), stdout(&drafted));
    let o = ingot(&[
        "bench",
        "latency",
        "--model",
        &m,
        "--input-len",
        "16",
        "--output-len",
        "12",
        "--num-iters",
        "1",
        "--num-iters-warmup",
        "0",
        "--json",
        "--speculative-config",
        &draft,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("json");
    let spec = &v["speculation"];
    assert!(spec["proposed_tokens"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(spec["acceptance"].as_f64(), Some(1.0), "{v}");
}

/// `--cpu-weights amx` answers where the CPU has AMX (the tile kernels on
/// the default model's Q4_1 rows, one token at a time and the prompt on
/// the tiles), and is refused in one line naming what is missing elsewhere.
#[test]
fn amx_weights_answer_or_are_refused_by_name() {
    let m = model();
    let o = ingot(&[
        "generate",
        "--model",
        &m,
        "--prompt",
        "Here is a long story about a journey across the mountains. The capital of France is",
        "--max-tokens",
        "12",
        "--cpu-weights",
        "amx",
    ]);
    if o.status.success() {
        assert!(stdout(&o).contains("Paris"), "{}", stdout(&o));
    } else {
        let err = stderr(&o);
        assert!(
            err.contains("needs AMX-INT8") && err.contains("\"native\""),
            "{err}"
        );
    }
}

/// A draft of another tokenizer is refused at start, naming the first
/// token the two disagree on.
#[test]
fn a_draft_of_another_tokenizer_is_one_clear_line() {
    let gemma = ingot_testkit::fetched("fetch-gemma3-gguf");
    let draft = format!(
        r#"{{"method": "draft_model", "model": {:?}}}"#,
        gemma.display().to_string()
    );
    let o = ingot(&[
        "generate",
        "--model",
        &model(),
        "--prompt",
        "hi",
        "--speculative-config",
        &draft,
    ]);
    assert_clean_error(&o, "must share the model's tokenizer");
}
