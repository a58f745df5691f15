//! `ingot generate --chat` as a person uses it: at a terminal (a tmux pane,
//! a real pseudo-terminal), typing, reading, Ctrl-C in the middle of an
//! answer, going on, and `/bye`. Skipped where tmux is missing; failed
//! instead under `CI=true` (scripts/system-packages installs it there).

use std::process::Command;
use std::time::{Duration, Instant};

/// The longest any one step may take (a model load or an answer, on a
/// loaded 2-core machine); a step that passes returns as soon as it does.
const STEP: Duration = Duration::from_secs(60);

/// A tmux server of its own (its own socket, no user config), killed on
/// drop: it runs one session whose pane is the chat's terminal.
struct Pane {
    dir: tempfile::TempDir,
}

impl Pane {
    /// Starts `argv` in a 200x50 pane, under a bash that writes its exit
    /// status to a file (tmux 3.3 at times leaves a dead pane's status
    /// unread). The bash traps SIGINT, so Ctrl-C reaches the chat alone; the
    /// chat, started by exec, gets SIGINT's default disposition back.
    fn start(argv: &[&str]) -> Pane {
        let pane = Pane {
            dir: tempfile::tempdir().unwrap(),
        };
        let status = pane.dir.path().join("status");
        let o = pane
            .tmux()
            .args(["new-session", "-d", "-s", "chat", "-x", "200", "-y", "50"])
            .args([
                "bash",
                "-c",
                r#"trap : INT; "${@:2}"; echo $? > "$1""#,
                "bash",
            ])
            .arg(&status)
            .args(argv)
            .env("INGOT_THREADS", "2")
            .env_remove("RUST_BACKTRACE")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        pane
    }

    fn tmux(&self) -> Command {
        let mut c = Command::new("tmux");
        c.arg("-S")
            .arg(self.dir.path().join("socket"))
            .args(["-f", "/dev/null"]);
        c
    }

    /// Types `text` literally.
    fn type_text(&self, text: &str) {
        self.keys(&["-l", text]);
    }

    /// Sends tmux key names (`Enter`, `C-c`).
    fn keys(&self, keys: &[&str]) {
        let o = self
            .tmux()
            .args(["send-keys", "-t", "chat"])
            .args(keys)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }

    fn line(&self, text: &str) {
        self.type_text(text);
        self.keys(&["Enter"]);
    }

    /// Everything the pane shows and has scrolled off, without colours,
    /// wrapped lines joined.
    fn text(&self) -> String {
        let o = self
            .tmux()
            .args(["capture-pane", "-p", "-J", "-S", "-", "-t", "chat"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Polls the pane until `done` holds; panics with the pane's text after
    /// [`STEP`].
    fn wait(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let text = self.text();
            if done(&text) {
                return text;
            }
            assert!(
                start.elapsed() < STEP,
                "timed out waiting for {what}; the pane:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The command's exit status, once it has ended.
    fn exit_status(&self) -> String {
        let file = self.dir.path().join("status");
        let start = Instant::now();
        loop {
            if let Ok(s) = std::fs::read_to_string(&file) {
                if s.ends_with('\n') {
                    return s.trim().to_string();
                }
            }
            assert!(
                start.elapsed() < STEP,
                "the chat did not exit; the pane:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        // Ends the server this test started (and the chat, if a failed
        // assertion left it running).
        let _ = self.tmux().arg("kill-server").output();
    }
}

fn has_tmux() -> bool {
    Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Lines that report an answer's rate (one per answer).
fn stats(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.contains(" tokens/s")).collect()
}

#[test]
fn chat_repl_two_turns_ctrl_c_mid_answer_a_third_turn_and_bye() {
    if !ingot_testkit::require(has_tmux(), "tmux is not installed") {
        return;
    }
    let model = ingot_testkit::smollm2_gguf().display().to_string();
    let pane = Pane::start(&[
        env!("CARGO_BIN_EXE_ingot"),
        "generate",
        "--model",
        &model,
        "--chat",
        "--seed",
        "7",
        "--max-tokens",
        "48",
    ]);
    // The banner names the model and where the sampling defaults came from
    // (this GGUF file has no general.sampling.* keys).
    let text = pane.wait("the prompt", |t| t.contains(">>> "));
    assert!(text.contains("ingot chat: SmolLM2-135M-Instruct"), "{text}");
    assert!(text.contains("temperature 0.8"), "{text}");
    assert!(text.contains("flags: max_tokens, seed"), "{text}");
    assert!(text.contains("ingot's defaults for the rest"), "{text}");
    assert!(text.contains("/help"), "{text}");

    // Two turns, each followed by its rate.
    pane.line("What is the capital of France?");
    pane.wait("the first answer", |t| stats(t).len() == 1);
    pane.line("/set temperature 9");
    pane.wait("the /set error", |t| {
        t.contains("error: temperature must be in [0, 2], got 9")
    });
    pane.line("And the capital of Italy?");
    pane.wait("the second answer", |t| stats(t).len() == 2);

    // A long answer, stopped by Ctrl-C once it is being written.
    pane.line("/set max_tokens 400");
    pane.wait("max_tokens set", |t| t.contains("(max_tokens = 400)"));
    let ask = "Write a very long story about a dragon and a knight.";
    pane.line(ask);
    pane.wait("the long answer to start", |t| {
        let Some(at) = t.rfind(ask) else {
            return false;
        };
        t[at + ask.len()..].lines().any(|l| !l.trim().is_empty())
    });
    pane.keys(&["C-c"]);
    let text = pane.wait("the stopped answer's rate", |t| stats(t).len() == 3);
    let stopped = stats(&text)[2];
    assert!(stopped.ends_with(", stopped"), "{text}");
    let tokens: usize = stopped
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {stopped:?}"));
    assert!(tokens < 400, "Ctrl-C did not stop the answer: {text}");

    // Ctrl-C at the prompt clears what was typed and keeps the session.
    pane.type_text("never sent");
    pane.keys(&["C-c"]);
    pane.wait("the quit hint", |t| t.contains("(Ctrl-C again"));

    // A third turn answers.
    pane.line("/set max_tokens 40");
    pane.wait("max_tokens set", |t| t.contains("(max_tokens = 40)"));
    pane.line("Thank you. Name one colour.");
    let text = pane.wait("the third answer", |t| stats(t).len() == 4);
    assert!(!stats(&text)[3].contains("stopped"), "{text}");

    pane.line("/bye");
    assert_eq!(pane.exit_status(), "0", "{}", pane.text());
}

/// Without a terminal (input piped), the chat reads one line per turn and
/// writes plain text; the sampling defaults come from the model directory's
/// generation_config.json where it sets them (an out-of-range one is named
/// and skipped), from flags over that, and from ingot for the rest.
#[test]
fn chat_takes_sampling_defaults_from_generation_config() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = ingot_testkit::fetched("fetch-hf-tokenizers").join("qwen3");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tokenizer.join(file), dir.path().join(file)).unwrap();
    }
    // A one-layer Qwen3 with random weights (--load-format dummy): only the
    // settings and the turn's bookkeeping are under test, not its words.
    let config = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "vocab_size": 151936, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6, "rope_theta": 1_000_000, "tie_word_embeddings": true,
    });
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let generation = serde_json::json!({
        "temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 12,
        "repetition_penalty": 5.0, "do_sample": true,
    });
    std::fs::write(
        dir.path().join("generation_config.json"),
        generation.to_string(),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ingot"))
        .args(["generate", "--model", dir.path().to_str().unwrap()])
        .args(["--load-format", "dummy", "--chat", "--top-p", "0.9"])
        .env("INGOT_THREADS", "2")
        .env_remove("RUST_BACKTRACE")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"/show\n/set top_k many\nHello there\n/show\n/bye\n")
            .unwrap();
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains('\x1b'), "colour codes into a pipe: {err:?}");
    assert!(
        err.contains(
            "warning: ignoring generation_config.json's repetition_penalty: \
             repetition_penalty must be in (0, 2], got 5"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "sampling: temperature 0.6, top_p 0.9, top_k 20, min_p 0.05, max_tokens 12 \
             (generation_config.json: temperature, top_k, max_tokens; flags: top_p; \
             ingot's defaults for the rest)"
        ),
        "{err}"
    );
    let row = |name: &str| {
        err.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in {err}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        row("temperature"),
        "temperature 0.6 the model's generation_config.json"
    );
    assert_eq!(row("top_p"), "top_p 0.9 command line");
    assert_eq!(row("min_p"), "min_p 0.05 ingot's default");
    assert_eq!(row("repetition_penalty"), "repetition_penalty 1 built-in");
    assert!(
        err.contains("error: top_k must be a whole number >= 0, got \"many\""),
        "{err}"
    );
    // One answer, bounded by the model's max_new_tokens, with its rate.
    let rate = stats(&err);
    assert_eq!(rate.len(), 1, "{err}");
    let tokens: usize = rate[0].split_whitespace().next().unwrap().parse().unwrap();
    assert!((1..=12).contains(&tokens), "{err}");
    assert!(
        err.contains("turns: 0") && err.contains("turns: 1"),
        "{err}"
    );
}
