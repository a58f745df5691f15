//! `ingot generate`: stream a completion (or a chat) to stdout.

use std::io::{BufRead, Write};

use anyhow::Context;
use clap::Args;
use ingot_core::{SamplingParams, StopCriteria, TokenId};
use ingot_engine::{EngineHandle, EngineRequest, TokenEvent};
use ingot_tokenizer::{ChatMessage, ChatTemplate};

use crate::cmd::score;
use crate::model::{load_engine, load_runner, ModelArgs};
use crate::settings::{self, FlagSet, LogArgs};

/// Flags of `ingot generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// The prompt (read from stdin when absent and --chat is not given).
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// Treat the prompt as a user message and apply the model's chat
    /// template; without --prompt, chat interactively (one line per turn).
    #[arg(long)]
    chat: bool,
    /// System message for --chat (default: whatever the template does).
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// After generating, print {"prompt_ids": [...], "output_ids": [...]}
    /// as one JSON line on stderr (for comparisons with references).
    #[arg(long)]
    print_ids: bool,
    /// Score this continuation of the prompt instead of generating: print
    /// {"context_ids", "continuation_ids", "logprobs", "sum", "greedy"} as
    /// one JSON line, computed one decode step per token on the model
    /// runner. Tokens are split as lm-evaluation-harness does.
    #[arg(long, conflicts_with = "chat")]
    score: Option<String>,
}

/// Sampling flags, named as in the OpenAI API.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// 0 is greedy (the default for this command).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens below min_p × the top probability.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// >1 discourages tokens already in prompt or output.
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Penalty per occurrence in the output.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Penalty for any occurrence in the output.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop string (repeatable); never printed.
    #[arg(long)]
    stop: Vec<String>,
    /// Keep going past the end-of-sequence token.
    #[arg(long)]
    ignore_eos: bool,
    /// Print each token's logprob and this many alternatives to stderr.
    #[arg(long)]
    logprobs: Option<usize>,
}

impl SamplingArgs {
    fn params(&self) -> anyhow::Result<(SamplingParams, StopCriteria)> {
        let params = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed: self.seed,
            logprobs: self.logprobs,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
        };
        params.validate()?;
        let stop = StopCriteria {
            max_tokens: self.max_tokens,
            stop_strings: self.stop.clone(),
            stop_token_ids: Vec::new(),
            ignore_eos: self.ignore_eos,
        };
        Ok((params, stop))
    }
}

/// Runs the command.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let (params, stop) = args.sampling.params()?;
    let show = Show {
        logprobs: args.sampling.logprobs.is_some(),
        ids: args.print_ids,
    };
    let mut log = FlagSet::default();
    args.log.add_to(&mut log);
    let config = args.model.load(log)?.config;
    if let Some(continuation) = &args.score {
        let prompt = args.prompt.as_deref().context("--score needs --prompt")?;
        let (mut runner, tokenizer) = load_runner(&config, 1)?;
        let (context, tail) = score::split(&tokenizer, prompt, continuation)?;
        let result = score::score(runner.as_mut(), context, tail)?;
        println!("{}", result.to_json());
        return Ok(());
    }
    let gen = load_engine(&config, settings::engine_config(&config))?;
    if !args.chat {
        let prompt = match &args.prompt {
            Some(p) => p.clone(),
            None => std::io::read_to_string(std::io::stdin())
                .context("cannot read the prompt from stdin")?,
        };
        let ids = gen.tokenizer().encode(&prompt, true)?;
        stream(&gen, ids, &params, &stop, show)?;
        return Ok(());
    }
    let template = chat_template(&gen)?;
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system));
    }
    if let Some(p) = &args.prompt {
        messages.push(ChatMessage::new("user", p));
        let ids = render(&gen, &template, &messages)?;
        stream(&gen, ids, &params, &stop, show)?;
        return Ok(());
    }
    // Interactive: one line per user turn until EOF.
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            return Ok(());
        }
        messages.push(ChatMessage::new("user", line.trim_end()));
        let ids = render(&gen, &template, &messages)?;
        let reply = stream(&gen, ids, &params, &stop, show)?;
        messages.push(ChatMessage::new("assistant", &reply));
    }
}

fn chat_template(gen: &EngineHandle) -> anyhow::Result<ChatTemplate> {
    ChatTemplate::for_tokenizer(gen.tokenizer())?
        .context("this model has no chat template; use --prompt without --chat")
}

fn render(
    gen: &EngineHandle,
    template: &ChatTemplate,
    messages: &[ChatMessage],
) -> anyhow::Result<Vec<TokenId>> {
    let text = template.render(messages, true, None)?;
    Ok(gen.tokenizer().encode(&text, false)?)
}

/// Generates and prints; returns the full text.
fn stream(
    gen: &EngineHandle,
    prompt: Vec<TokenId>,
    params: &SamplingParams,
    stop: &StopCriteria,
    show: Show,
) -> anyhow::Result<String> {
    let tokenizer = gen.tokenizer().clone();
    let prompt_ids = show.ids.then(|| prompt.clone());
    let mut output_ids = Vec::new();
    let mut events = gen.submit(EngineRequest {
        prompt,
        sampling: params.clone(),
        stop: stop.clone(),
        priority: Default::default(),
        grammar: None,
    })?;
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    while let Some(event) = events.next_blocking() {
        match event {
            TokenEvent::Token(t) => {
                output_ids.push(t.token);
                text.push_str(&t.text);
                out.write_all(t.text.as_bytes())?;
                out.flush()?;
                if show.logprobs {
                    let alts: Vec<String> = t
                        .top_logprobs
                        .iter()
                        .map(|a| {
                            let piece = tokenizer.id_to_token(a.token).unwrap_or_default();
                            format!("{piece:?}={:.4}", a.logprob)
                        })
                        .collect();
                    eprintln!(
                        "[{} logprob={:.4} top: {}]",
                        t.token,
                        t.logprob,
                        alts.join(" ")
                    );
                }
            }
            TokenEvent::Finished(_) => break,
            TokenEvent::Error(e) => anyhow::bail!("generation failed: {e}"),
            TokenEvent::Prompt(_) => {}
        }
    }
    writeln!(out)?;
    if let Some(prompt_ids) = prompt_ids {
        eprintln!(
            "{}",
            serde_json::json!({"prompt_ids": prompt_ids, "output_ids": output_ids})
        );
    }
    Ok(text)
}

/// What to print besides the text.
#[derive(Debug, Clone, Copy)]
struct Show {
    logprobs: bool,
    ids: bool,
}
