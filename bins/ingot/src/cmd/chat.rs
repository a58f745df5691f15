//! `ingot generate --chat` without `--prompt`: an interactive chat at the
//! terminal, in the manner of `ollama run` and `llama-cli -cnv`
//! (docs/chat.md).
//!
//! - Line editing and in-memory history come from rustyline; a line that
//!   starts with `/` is a command (`/help` lists them).
//! - Ctrl-C while an answer streams stops that answer: its stream is
//!   dropped, which aborts the request in the engine, and the session goes
//!   on. What was written stays in the conversation (so "go on" continues
//!   it); an answer stopped before its first word is dropped together with
//!   its question. Ctrl-C at the prompt clears the line; a second one in a
//!   row, Ctrl-D or `/bye` ends the session with exit status 0.
//! - Sampling defaults come from the model as vLLM takes them: a
//!   directory's `generation_config.json`, a GGUF file's `general.sampling.*`
//!   keys (llama.cpp writes them in newer files); else ingot's chat
//!   defaults, llama.cpp's. Flags on the command line win over both. The
//!   banner says which applies, `/show` says it per setting.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ingot_core::{SamplingParams, StopCriteria};
use ingot_engine::EngineHandle;
use ingot_tokenizer::{ChatMessage, ChatTemplate};
use rustyline::error::ReadlineError;

use crate::cmd::generate::{render, stream, Show, Streamed};

/// Everything the chat starts from.
pub struct Chat<'a> {
    /// The engine serving the model.
    pub gen: &'a EngineHandle,
    /// The model's chat template.
    pub template: &'a ChatTemplate,
    /// The model's file or directory (its sampling defaults live there).
    pub model: &'a Path,
    /// `--system`.
    pub system: Option<String>,
    /// Sampling flags given on the command line, by their `/set` names.
    pub flags: Vec<(&'static str, String)>,
    /// The request built from the flags (stop strings, logprobs, EOS).
    pub base: (SamplingParams, StopCriteria),
    /// What to print besides the text.
    pub show: Show,
}

/// The settings `/set` changes, in the order `/show` lists them.
const KNOBS: [&str; 9] = [
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "max_tokens",
    "seed",
];

/// ingot's chat defaults where neither the model nor a flag sets a value:
/// llama.cpp's (`llama-cli`, `llama-server`), which keep small models from
/// looping as greedy decoding does while staying close to the top choice.
/// `max_tokens` is bounded by the context left in any case.
const INGOT_DEFAULTS: [(&str, &str); 5] = [
    ("temperature", "0.8"),
    ("top_p", "0.95"),
    ("top_k", "40"),
    ("min_p", "0.05"),
    ("max_tokens", "1024"),
];

/// The prompt, as in `ollama run`.
const PROMPT: &str = ">>> ";

const HELP: &str = "\
/help              this list
/bye               quit (also /exit, Ctrl-D, or Ctrl-C twice at the prompt)
/clear             forget the conversation (the system message stays)
/system TEXT       set the system message (/system alone removes it)
/set NAME VALUE    change a setting: temperature, top_p, top_k, min_p,
                   repetition_penalty, frequency_penalty, presence_penalty,
                   max_tokens, seed (a number, or none)
/show              the settings and where each came from
Ctrl-C             stop the answer being written (the part written stays)";

/// Where a setting's value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The built-in value: a penalty left off, no seed.
    Off,
    /// ingot's chat defaults ([`INGOT_DEFAULTS`]).
    Ingot,
    /// The model's files.
    Model,
    /// A command-line flag.
    Flag,
    /// `/set` in this session.
    Set,
}

/// The sampling settings of the session, with each one's origin.
struct Settings {
    params: SamplingParams,
    max_tokens: usize,
    /// The model's context: the bound on `max_tokens`.
    max_context: usize,
    origins: BTreeMap<&'static str, Origin>,
    /// Where the model's defaults were read (`generation_config.json`, the
    /// GGUF metadata).
    model_source: Option<&'static str>,
}

impl Settings {
    /// Built-in values, then ingot's defaults, the model's, the flags'.
    fn resolve(chat: &Chat<'_>) -> Self {
        let mut s = Settings {
            params: chat.base.0.clone(),
            max_tokens: chat.base.1.max_tokens,
            max_context: chat.gen.max_context(),
            origins: KNOBS.iter().map(|&k| (k, Origin::Off)).collect(),
            model_source: None,
        };
        for (name, value) in INGOT_DEFAULTS {
            // Built-in values, in range by construction.
            let _ = s.set(name, value, Origin::Ingot);
        }
        let model = model_defaults(chat.model);
        s.model_source = model.source;
        for (name, value) in model.values {
            if let Err(e) = s.set(name, &value, Origin::Model) {
                let source = model.source.unwrap_or("the model");
                eprintln!("warning: ignoring {source}'s {name}: {e}");
            }
        }
        for (name, value) in &chat.flags {
            // The flags were validated together before the model loaded;
            // only max_tokens can still exceed this model's context.
            if let Err(e) = s.set(name, value, Origin::Flag) {
                eprintln!("warning: ignoring --{}: {e}", name.replace('_', "-"));
            }
        }
        s
    }

    /// Sets `name` from text, checked as a request's field is: on error the
    /// setting is unchanged and the message names the value.
    fn set(&mut self, name: &str, value: &str, origin: Origin) -> Result<(), String> {
        let Some(&knob) = KNOBS.iter().find(|&&k| k == name) else {
            return Err(format!(
                "unknown setting {name:?}; one of: {}",
                KNOBS.join(", ")
            ));
        };
        let number = || {
            value
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| format!("{knob} must be a number, got {value:?}"))
        };
        let count = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{knob} must be a whole number >= 0, got {value:?}"))
        };
        let mut p = self.params.clone();
        let mut max_tokens = self.max_tokens;
        match knob {
            "temperature" => p.temperature = number()?,
            "top_p" => p.top_p = number()?,
            "top_k" => p.top_k = count()?,
            "min_p" => p.min_p = number()?,
            "repetition_penalty" => p.repetition_penalty = number()?,
            "frequency_penalty" => p.frequency_penalty = number()?,
            "presence_penalty" => p.presence_penalty = number()?,
            "max_tokens" => {
                max_tokens = count()?;
                if !(1..=self.max_context).contains(&max_tokens) {
                    return Err(format!(
                        "max_tokens must be in [1, {}] (the model's context), got {max_tokens}",
                        self.max_context
                    ));
                }
            }
            "seed" => {
                p.seed = match value {
                    "none" => None,
                    v => Some(v.parse::<u64>().map_err(|_| {
                        format!("seed must be a whole number >= 0 or none, got {value:?}")
                    })?),
                }
            }
            _ => return Err(format!("{knob} has no setter. This is a bug.")),
        }
        p.validate().map_err(|e| e.to_string())?;
        self.params = p;
        self.max_tokens = max_tokens;
        self.origins.insert(knob, origin);
        Ok(())
    }

    fn value(&self, knob: &str) -> String {
        let p = &self.params;
        match knob {
            "temperature" => p.temperature.to_string(),
            "top_p" => p.top_p.to_string(),
            "top_k" => p.top_k.to_string(),
            "min_p" => p.min_p.to_string(),
            "repetition_penalty" => p.repetition_penalty.to_string(),
            "frequency_penalty" => p.frequency_penalty.to_string(),
            "presence_penalty" => p.presence_penalty.to_string(),
            "max_tokens" => self.max_tokens.to_string(),
            "seed" => p.seed.map_or_else(|| "none".to_string(), |s| s.to_string()),
            _ => String::new(),
        }
    }

    fn origin_text(&self, origin: Origin) -> String {
        match origin {
            Origin::Off => "built-in".to_string(),
            Origin::Ingot => "ingot's default".to_string(),
            Origin::Model => format!("the model's {}", self.model_source.unwrap_or("files")),
            Origin::Flag => "command line".to_string(),
            Origin::Set => "/set".to_string(),
        }
    }

    /// One line for the banner: the values that shape sampling, then
    /// where they came from.
    fn summary(&self) -> String {
        let shown = ["temperature", "top_p", "top_k", "min_p", "max_tokens"];
        let mut values: Vec<String> = shown
            .iter()
            .map(|k| format!("{k} {}", self.value(k)))
            .collect();
        for k in ["repetition_penalty", "seed"] {
            if self.origins[k] != Origin::Off {
                values.push(format!("{k} {}", self.value(k)));
            }
        }
        let names = |o: Origin| -> Vec<&str> {
            KNOBS
                .iter()
                .copied()
                .filter(|k| self.origins[k] == o)
                .collect()
        };
        let mut from = Vec::new();
        match self.model_source {
            Some(source) => {
                let set = names(Origin::Model);
                if set.is_empty() {
                    from.push(format!("{source} suggests none"));
                } else {
                    from.push(format!("{source}: {}", set.join(", ")));
                }
            }
            None => from.push("the model suggests none".to_string()),
        }
        let flags = names(Origin::Flag);
        if !flags.is_empty() {
            from.push(format!("flags: {}", flags.join(", ")));
        }
        if !names(Origin::Ingot).is_empty() {
            from.push("ingot's defaults for the rest".to_string());
        }
        format!("sampling: {} ({})", values.join(", "), from.join("; "))
    }

    fn show(&self) -> String {
        KNOBS
            .iter()
            .map(|k| {
                let origin = self.origin_text(self.origins[k]);
                format!("{k:<20}{:<10}{origin}", self.value(k))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Sampling defaults a model's files suggest, as setting names and text.
#[derive(Default)]
struct ModelDefaults {
    /// Where they were read; `None` when the model has no such file or keys.
    source: Option<&'static str>,
    values: Vec<(&'static str, String)>,
}

/// Reads `generation_config.json` beside a Hugging Face model's
/// `config.json` (the keys vLLM takes: temperature, top_p, top_k, min_p,
/// repetition_penalty, max_new_tokens), or a GGUF file's
/// `general.sampling.*` keys. An unreadable file is a warning: the chat
/// works without its defaults.
fn model_defaults(path: &Path) -> ModelDefaults {
    let dir = if path.is_dir() {
        Some(path)
    } else if path.file_name().is_some_and(|n| n == "config.json") {
        path.parent()
    } else {
        None
    };
    let read = match dir {
        Some(dir) => generation_config(&dir.join("generation_config.json")),
        None => gguf_sampling(path),
    };
    read.unwrap_or_else(|e| {
        eprintln!("warning: no sampling defaults from the model: {e:#}");
        ModelDefaults::default()
    })
}

fn generation_config(file: &Path) -> anyhow::Result<ModelDefaults> {
    if !file.is_file() {
        return Ok(ModelDefaults::default());
    }
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", file.display()))?;
    let keys = [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("min_p", "min_p"),
        ("repetition_penalty", "repetition_penalty"),
        ("max_new_tokens", "max_tokens"),
    ];
    let values = keys
        .into_iter()
        .filter_map(|(key, knob)| Some((knob, number_text(json.get(key)?)?)))
        .collect();
    Ok(ModelDefaults {
        source: Some("generation_config.json"),
        values,
    })
}

/// A JSON number as `/set` reads it: integers as they are, floats at f32
/// precision (0.6, not 0.6000000238418579).
fn number_text(v: &serde_json::Value) -> Option<String> {
    if let Some(i) = v.as_i64() {
        return Some(i.to_string());
    }
    v.as_f64().map(|f| (f as f32).to_string())
}

fn gguf_sampling(path: &Path) -> anyhow::Result<ModelDefaults> {
    let gguf = ingot_models::gguf::GgufFile::open(path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    // llama.cpp's keys (gguf-py `Keys.General.SAMPLING_*`); mirostat and
    // XTC have no counterpart here.
    let keys = [
        ("general.sampling.temp", "temperature"),
        ("general.sampling.top_p", "top_p"),
        ("general.sampling.top_k", "top_k"),
        ("general.sampling.min_p", "min_p"),
        ("general.sampling.penalty_repeat", "repetition_penalty"),
    ];
    let values: Vec<_> = keys
        .into_iter()
        .filter_map(|(key, knob)| {
            let v = gguf.get(key)?;
            let text = match v.as_i64() {
                Some(i) => i.to_string(),
                None => (v.as_f64()? as f32).to_string(),
            };
            Some((knob, text))
        })
        .collect();
    Ok(ModelDefaults {
        source: Some("GGUF metadata"),
        values,
    })
}

/// Dims `text` for a person at a terminal (never into a file or a pipe,
/// never with `NO_COLOR` set).
struct Style {
    colour: bool,
}

impl Style {
    fn detect() -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Self {
            colour: std::io::stderr().is_terminal() && !no_color,
        }
    }

    fn note(&self, text: &str) {
        if self.colour {
            eprintln!("\x1b[2m{text}\x1b[0m");
        } else {
            eprintln!("{text}");
        }
    }
}

/// The conversation so far.
struct Conversation {
    system: Option<String>,
    turns: Vec<ChatMessage>,
}

impl Conversation {
    fn messages(&self) -> Vec<ChatMessage> {
        let system = self.system.iter().map(|s| ChatMessage::new("system", s));
        system.chain(self.turns.iter().cloned()).collect()
    }
}

/// What the session does after a line.
enum Next {
    Continue,
    Quit,
}

/// Runs the chat until `/bye`, end of input or a second Ctrl-C.
pub fn run(chat: Chat<'_>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    catch_interrupts(&rt)?;
    let mut settings = Settings::resolve(&chat);
    let style = Style::detect();
    let name = chat
        .model
        .file_stem()
        .unwrap_or(chat.model.as_os_str())
        .to_string_lossy();
    eprintln!("ingot chat: {name} on {}", chat.gen.device_name());
    style.note(&settings.summary());
    style.note("/help for commands, /bye or Ctrl-D to quit; Ctrl-C stops an answer");
    let mut editor = rustyline::DefaultEditor::new().context("cannot set up line editing")?;
    let mut conversation = Conversation {
        system: chat.system.clone(),
        turns: Vec::new(),
    };
    // A Ctrl-C at the prompt arms the exit; anything else disarms it.
    let mut armed = false;
    loop {
        let line = match editor.readline(PROMPT) {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) if armed => return Ok(()),
            Err(ReadlineError::Interrupted) => {
                armed = true;
                style.note("(Ctrl-C again, Ctrl-D or /bye to quit)");
                continue;
            }
            Err(ReadlineError::Eof) => return Ok(()),
            Err(e) => return Err(e).context("cannot read the terminal"),
        };
        armed = false;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        // In-memory only: a failure here loses nothing but recall.
        let _ = editor.add_history_entry(line);
        if let Some(command) = line.strip_prefix('/') {
            match command_line(command, &mut settings, &mut conversation, &style) {
                Next::Continue => continue,
                Next::Quit => return Ok(()),
            }
        }
        conversation.turns.push(ChatMessage::new("user", line));
        match answer(&rt, &chat, &settings, &conversation) {
            Ok(done) => {
                let secs = done.elapsed.as_secs_f64();
                let rate = if secs > 0.0 {
                    done.out.tokens as f64 / secs
                } else {
                    0.0
                };
                let stopped = if done.out.stopped { ", stopped" } else { "" };
                style.note(&format!(
                    "{} tokens, {secs:.2} s, {rate:.1} tokens/s{stopped}",
                    done.out.tokens
                ));
                if done.out.text.is_empty() && done.out.stopped {
                    conversation.turns.pop();
                } else {
                    conversation
                        .turns
                        .push(ChatMessage::new("assistant", &done.out.text));
                }
            }
            Err(e) => {
                // The question goes with its failed answer, so the next
                // turn starts from a conversation that rendered.
                conversation.turns.pop();
                eprintln!("error: {e:#}");
            }
        }
    }
}

/// Installs the process's SIGINT handler before the first prompt, so a
/// Ctrl-C that lands between the prompt and an answer never ends the
/// session (each answer then listens for its own).
#[cfg(unix)]
fn catch_interrupts(rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    rt.block_on(async { signal(SignalKind::interrupt()).map(drop) })
        .context("cannot catch Ctrl-C")
}

#[cfg(not(unix))]
fn catch_interrupts(_rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    Ok(())
}

/// Runs one `/command`.
fn command_line(
    command: &str,
    settings: &mut Settings,
    conversation: &mut Conversation,
    style: &Style,
) -> Next {
    let (name, rest) = command
        .split_once(char::is_whitespace)
        .map_or((command, ""), |(n, r)| (n, r.trim()));
    match name {
        "bye" | "exit" | "quit" => return Next::Quit,
        "help" | "?" => eprintln!("{HELP}"),
        "clear" => {
            conversation.turns.clear();
            style.note("(conversation cleared)");
        }
        "system" if rest.is_empty() => {
            conversation.system = None;
            style.note("(system message removed)");
        }
        "system" => {
            conversation.system = Some(rest.to_string());
            style.note("(system message set)");
        }
        "set" => match rest.split_once(char::is_whitespace) {
            Some((knob, value)) => match settings.set(knob, value.trim(), Origin::Set) {
                Ok(()) => style.note(&format!("({knob} = {})", settings.value(knob))),
                Err(e) => eprintln!("error: {e}"),
            },
            None => eprintln!("error: /set needs a name and a value, e.g. /set temperature 0.7"),
        },
        "show" => {
            eprintln!("{}", settings.show());
            match &conversation.system {
                Some(s) => eprintln!("system message: {s:?}"),
                None => eprintln!("system message: none"),
            }
            eprintln!("turns: {}", conversation.turns.len() / 2);
        }
        _ => eprintln!("error: unknown command /{name}; /help lists them"),
    }
    Next::Continue
}

/// One answer with its wall time.
struct Answered {
    out: Streamed,
    elapsed: std::time::Duration,
}

/// Renders the conversation and streams the model's answer until it ends
/// or Ctrl-C stops it.
fn answer(
    rt: &tokio::runtime::Runtime,
    chat: &Chat<'_>,
    settings: &Settings,
    conversation: &Conversation,
) -> anyhow::Result<Answered> {
    let ids = render(chat.gen, chat.template, &conversation.messages())?;
    // The answer may use what the context has left, up to max_tokens: a
    // long conversation gets shorter answers before it gets refusals.
    let room = settings.max_context.saturating_sub(ids.len());
    if room == 0 {
        anyhow::bail!(
            "the conversation ({} tokens) fills the model's context of {}; /clear starts over",
            ids.len(),
            settings.max_context
        );
    }
    let mut stop = chat.base.1.clone();
    stop.max_tokens = settings.max_tokens.min(room);
    let start = Instant::now();
    let cancel = async {
        // Each answer listens afresh, so a Ctrl-C from before it began is
        // not taken as stopping it. Without a handler, never cancel.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let out = rt.block_on(stream(
        chat.gen,
        ids,
        &settings.params,
        &stop,
        chat.show,
        cancel,
    ))?;
    Ok(Answered {
        out,
        elapsed: start.elapsed(),
    })
}
