//! `ingot generate`: stream a completion (or a chat) to stdout.

use std::io::Write;

use anyhow::Context;
use clap::Args;
use ingot_core::{SamplingParams, StopCriteria, TokenId};
use ingot_engine::{EngineHandle, EngineRequest, TokenEvent};
use ingot_tokenizer::{ChatMessage, ChatTemplate};

use crate::cmd::{chat, score};
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
    /// template; without --prompt, chat interactively, sampling with the
    /// model's defaults where flags leave a value out (docs/chat.md).
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

/// Sampling flags, named as in the OpenAI API. A flag left out takes the
/// one-shot default shown here with `--prompt` (greedy, for comparisons
/// with references), and the model's own default in the interactive chat
/// (docs/chat.md).
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate [default: 256].
    #[arg(long)]
    max_tokens: Option<usize>,
    /// 0 is greedy [default: 0].
    #[arg(long)]
    temperature: Option<f32>,
    /// Keep the k most likely tokens (0: all) [default: 0].
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus mass [default: 1].
    #[arg(long)]
    top_p: Option<f32>,
    /// Drop tokens below min_p × the top probability [default: 0].
    #[arg(long)]
    min_p: Option<f32>,
    /// >1 discourages tokens already in prompt or output [default: 1].
    #[arg(long)]
    repetition_penalty: Option<f32>,
    /// Penalty per occurrence in the output [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    frequency_penalty: Option<f32>,
    /// Penalty for any occurrence in the output [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    presence_penalty: Option<f32>,
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

/// One-shot generation's `max_tokens` when the flag is left out.
const ONE_SHOT_MAX_TOKENS: usize = 256;

impl SamplingArgs {
    /// The one-shot request: every flag left out is greedy and unpenalised.
    fn params(&self) -> anyhow::Result<(SamplingParams, StopCriteria)> {
        let greedy = SamplingParams::GREEDY;
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(greedy.temperature),
            top_k: self.top_k.unwrap_or(greedy.top_k),
            top_p: self.top_p.unwrap_or(greedy.top_p),
            min_p: self.min_p.unwrap_or(greedy.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(greedy.repetition_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(greedy.frequency_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(greedy.presence_penalty),
            seed: self.seed,
            logprobs: self.logprobs,
            prompt_logprobs: None,
            logit_bias: Vec::new(),
        };
        params.validate()?;
        let stop = StopCriteria {
            max_tokens: self.max_tokens.unwrap_or(ONE_SHOT_MAX_TOKENS),
            stop_strings: self.stop.clone(),
            stop_token_ids: Vec::new(),
            ignore_eos: self.ignore_eos,
        };
        Ok((params, stop))
    }

    /// The settings given on the command line, by their `/set` names, for
    /// the interactive chat (which fills the rest from the model).
    pub fn given(&self) -> Vec<(&'static str, String)> {
        let f = |name, v: Option<f32>| v.map(|v| (name, v.to_string()));
        let n = |name, v: Option<usize>| v.map(|v| (name, v.to_string()));
        [
            f("temperature", self.temperature),
            f("top_p", self.top_p),
            n("top_k", self.top_k),
            f("min_p", self.min_p),
            f("repetition_penalty", self.repetition_penalty),
            f("frequency_penalty", self.frequency_penalty),
            f("presence_penalty", self.presence_penalty),
            n("max_tokens", self.max_tokens),
            self.seed.map(|s| ("seed", s.to_string())),
        ]
        .into_iter()
        .flatten()
        .collect()
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
        stream_once(&gen, ids, &params, &stop, show)?;
        return Ok(());
    }
    let template = chat_template(&gen)?;
    let Some(p) = &args.prompt else {
        let model = settings::model_path(&config)?;
        let chat = chat::Chat {
            gen: &gen,
            template: &template,
            model,
            system: args.system.clone(),
            flags: args.sampling.given(),
            base: (params, stop),
            show,
        };
        return chat::run(chat);
    };
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system));
    }
    messages.push(ChatMessage::new("user", p));
    let ids = render(&gen, &template, &messages)?;
    stream_once(&gen, ids, &params, &stop, show)?;
    Ok(())
}

pub(crate) fn chat_template(gen: &EngineHandle) -> anyhow::Result<ChatTemplate> {
    ChatTemplate::for_tokenizer(gen.tokenizer())?
        .context("this model has no chat template; use --prompt without --chat")
}

pub(crate) fn render(
    gen: &EngineHandle,
    template: &ChatTemplate,
    messages: &[ChatMessage],
) -> anyhow::Result<Vec<TokenId>> {
    let text = template.render(messages, true, None)?;
    Ok(gen.tokenizer().encode(&text, false)?)
}

/// Generates one answer and prints it; Ctrl-C keeps its default (the
/// process ends), as for any one-shot command.
fn stream_once(
    gen: &EngineHandle,
    prompt: Vec<TokenId>,
    params: &SamplingParams,
    stop: &StopCriteria,
    show: Show,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(stream(
        gen,
        prompt,
        params,
        stop,
        show,
        std::future::pending(),
    ))?;
    Ok(())
}

/// What one answer produced.
pub(crate) struct Streamed {
    /// The text printed.
    pub text: String,
    /// Tokens generated (a stop token included).
    pub tokens: usize,
    /// Whether `cancel` stopped it.
    pub stopped: bool,
}

/// Generates and prints until the answer ends or `cancel` resolves; then
/// the request's stream is dropped, which aborts it in the engine.
pub(crate) async fn stream(
    gen: &EngineHandle,
    prompt: Vec<TokenId>,
    params: &SamplingParams,
    stop: &StopCriteria,
    show: Show,
    cancel: impl std::future::Future<Output = ()>,
) -> anyhow::Result<Streamed> {
    let tokenizer = gen.tokenizer().clone();
    let prompt_ids = show.ids.then(|| prompt.clone());
    let mut output_ids = Vec::new();
    let mut events = gen.submit(EngineRequest {
        prompt,
        sampling: params.clone(),
        stop: stop.clone(),
        priority: Default::default(),
        grammar: None,
        speculative: true,
    })?;
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    let mut tokens = None;
    tokio::pin!(cancel);
    let stopped = loop {
        let event = tokio::select! {
            event = events.next() => event,
            () = &mut cancel => break true,
        };
        match event {
            Some(TokenEvent::Token(t)) => {
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
            Some(TokenEvent::Finished(done)) => {
                tokens = Some(done.completion_tokens);
                break false;
            }
            Some(TokenEvent::Error(e)) => anyhow::bail!("generation failed: {e}"),
            Some(TokenEvent::Prompt(_)) => {}
            None => break false,
        }
    };
    drop(events);
    writeln!(out)?;
    if let Some(prompt_ids) = prompt_ids {
        eprintln!(
            "{}",
            serde_json::json!({"prompt_ids": prompt_ids, "output_ids": output_ids})
        );
    }
    Ok(Streamed {
        text,
        tokens: tokens.unwrap_or(output_ids.len()),
        stopped,
    })
}

/// What to print besides the text.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Show {
    logprobs: bool,
    ids: bool,
}
