//! Shared by the chat and completions handlers: fan a request out into
//! `prompts × n` generations through the pipeline, then collect them
//! (non-streaming) or merge their events into one stream (SSE).

use std::time::{Duration, Instant};

use futures_util::stream::{self, BoxStream, StreamExt};
use ingot_core::TokenId;
use ingot_engine::{
    Completion, EngineRequest, GeneratedToken, Grammar, PromptLogprob, RequestLimits, TokenEvent,
};
use ingot_protocol::sampling::ValidSampling;
use ingot_protocol::usage::Usage;

use crate::error::Timeout;
use crate::pipeline::{
    CacheStatus, EventStream, GenerateError, GenerateRequest, Generator, Sharing,
};
use crate::ApiError;

/// One choice being generated.
pub struct Job {
    /// Choice index in the response (prompt index × n + choice number).
    pub index: usize,
    /// Which prompt it continues.
    pub prompt_index: usize,
    events: EventStream,
    deadlines: Deadlines,
    /// When its first token came (the first-token deadline no longer
    /// applies).
    first_token: Option<Instant>,
    submitted: Instant,
    /// The request's span: the engine phases are exported under it.
    span: tracing::Span,
}

/// When a request must have its first token and its last, with the
/// timeouts they came from (for the error message).
#[derive(Debug, Clone, Copy, Default)]
pub struct Deadlines {
    /// First token by then.
    pub first_token: Option<(Instant, Duration)>,
    /// Last token by then.
    pub total: Option<(Instant, Duration)>,
}

impl Deadlines {
    /// Deadlines `first_token` and `total` after `arrival` (`None`: none).
    pub fn after(arrival: Instant, first_token: Option<Duration>, total: Option<Duration>) -> Self {
        Self {
            first_token: first_token.map(|d| (arrival + d, d)),
            total: total.map(|d| (arrival + d, d)),
        }
    }

    /// The deadline that applies now, as the timeout it breaks.
    fn next(&self, started: bool) -> Option<(Instant, Timeout)> {
        let total = self.total.map(|(at, d)| (at, Timeout::Request(d)));
        let first = self.first_token.map(|(at, d)| (at, Timeout::FirstToken(d)));
        match (started, first, total) {
            (true, _, t) | (false, None, t) => t,
            (false, Some(f), None) => Some(f),
            (false, Some(f), Some(t)) => Some(if f.0 <= t.0 { f } else { t }),
        }
    }
}

impl Job {
    /// When it was handed to the pipeline.
    pub fn submitted(&self) -> Instant {
        self.submitted
    }

    /// The next event, or the timeout the job ran past (dropping the job
    /// then cancels its generation).
    async fn next(&mut self) -> Result<Option<TokenEvent>, Timeout> {
        let event = match self.deadlines.next(self.first_token.is_some()) {
            None => self.events.next().await,
            Some((at, timeout)) => tokio::select! {
                e = self.events.next() => e,
                () = tokio::time::sleep_until(at.into()) => return Err(timeout),
            },
        };
        match &event {
            Some(TokenEvent::Token(_)) if self.first_token.is_none() => {
                self.first_token = Some(Instant::now());
            }
            Some(TokenEvent::Finished(c)) => crate::observe::engine_phases(
                &self.span,
                self.submitted,
                c.queue_time,
                self.first_token,
                Instant::now(),
            ),
            _ => {}
        }
        Ok(event)
    }
}

/// Which endpoint a request came from: names the prompt field in errors and
/// sets the default output length.
#[derive(Debug, Clone, Copy)]
pub enum Endpoint {
    /// `/v1/chat/completions`: without max_tokens, up to the context end.
    Chat,
    /// `/v1/completions`: without max_tokens, 16 tokens (OpenAI's default).
    Completions,
}

impl Endpoint {
    fn prompt_param(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// What a request generates from: its prompts, and the grammar every
/// output follows (structured output), compiled.
#[derive(Debug, Clone, Copy)]
pub struct Prompts<'a> {
    /// Token ids of each prompt.
    pub ids: &'a [Vec<TokenId>],
    /// The output grammar, at its start (each choice gets its own copy).
    pub grammar: Option<&'a Grammar>,
}

impl<'a> Prompts<'a> {
    /// Prompts whose outputs are free.
    #[cfg(test)]
    pub fn free(ids: &'a [Vec<TokenId>]) -> Self {
        Self { ids, grammar: None }
    }
}

/// OpenAI's default `max_tokens` for `/v1/completions`.
const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

/// Who asks and what they may share: everything the pipeline needs besides
/// the prompts and sampling.
#[derive(Debug, Clone)]
pub struct Submission {
    /// The served model's id.
    pub model: String,
    /// Scopes shared answers (the API key's tenant, once keys exist).
    pub tenant: Option<String>,
    /// What the pipeline's layers may do.
    pub sharing: Sharing,
    /// The model's context and vocabulary.
    pub limits: RequestLimits,
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// `limits.max_tokens`: more is refused, none asked gets at most this.
    pub max_tokens_cap: Option<usize>,
    /// Applied to every choice.
    pub deadlines: Deadlines,
    /// The request's span (the engine phases are exported under it).
    pub span: tracing::Span,
}

impl Submission {
    /// The canonical engine requests: `n` per prompt. Choice `c` of a
    /// seeded request uses seed + c, so choices differ yet the whole
    /// response is reproducible. The model's limits are checked once, by
    /// the engine at submission (a refusal aborts the choices started).
    pub fn requests(
        &self,
        inputs: Prompts<'_>,
        sampling: &ValidSampling,
    ) -> Result<Vec<(usize, usize, EngineRequest)>, ApiError> {
        let prompts = inputs.ids;
        if let (Some(asked), Some(cap)) = (sampling.max_tokens, self.max_tokens_cap) {
            if asked > cap {
                return Err(ApiError::BadRequest(ingot_protocol::ProtocolError::field(
                    "max_tokens",
                    format!("max_tokens is {asked}; this server allows at most {cap}"),
                )));
            }
        }
        let mut out = Vec::with_capacity(prompts.len() * sampling.n);
        for (p, prompt) in prompts.iter().enumerate() {
            for c in 0..sampling.n {
                let mut params = sampling.params.clone();
                params.seed = params.seed.map(|s| s.wrapping_add(c as u64));
                let mut stop = sampling.stop.clone();
                stop.max_tokens = self.max_tokens(prompt.len(), sampling);
                let request = EngineRequest {
                    prompt: prompt.clone(),
                    sampling: params,
                    stop,
                    priority: sampling.priority,
                    grammar: inputs.grammar.cloned(),
                    speculative: sampling.speculative,
                };
                out.push((p * sampling.n + c, p, request));
            }
        }
        Ok(out)
    }

    /// A choice's output cap: `max_tokens`, else the endpoint's default
    /// within the context left after the prompt.
    fn max_tokens(&self, prompt_len: usize, sampling: &ValidSampling) -> usize {
        let room = self.limits.max_context.saturating_sub(prompt_len).max(1);
        let room = self.max_tokens_cap.map_or(room, |cap| room.min(cap));
        sampling.max_tokens.unwrap_or(match self.endpoint {
            Endpoint::Chat => room,
            Endpoint::Completions => COMPLETIONS_DEFAULT_MAX_TOKENS.min(room),
        })
    }

    /// The most tokens the request can use: prompt + max_tokens of every
    /// choice (what a tokens-per-minute limit reserves at admission).
    pub fn token_budget(&self, prompts: &[Vec<TokenId>], sampling: &ValidSampling) -> u64 {
        let per_prompt = |p: &Vec<TokenId>| (p.len() + self.max_tokens(p.len(), sampling)) as u64;
        prompts.iter().map(per_prompt).sum::<u64>() * sampling.n as u64
    }

    /// Starts every choice through `generator`.
    /// Returns the jobs and where their answers come from.
    pub async fn submit(
        &self,
        generator: &dyn Generator,
        inputs: Prompts<'_>,
        sampling: &ValidSampling,
    ) -> Result<(Vec<Job>, CacheStatus), ApiError> {
        let requests = self.requests(inputs, sampling)?;
        let mut jobs = Vec::with_capacity(requests.len());
        let mut status: Option<CacheStatus> = None;
        for (index, prompt_index, request) in requests {
            let request = GenerateRequest::new(
                self.model.clone(),
                self.tenant.as_deref(),
                request,
                self.sharing,
            );
            let submitted = Instant::now();
            let generation = generator
                .generate(request)
                .await
                .map_err(|e| self.error(e))?;
            status = Some(status.map_or(generation.status, |s| s.combine(generation.status)));
            jobs.push(Job {
                index,
                prompt_index,
                events: generation.events,
                deadlines: self.deadlines,
                first_token: None,
                submitted,
                span: self.span.clone(),
            });
        }
        Ok((jobs, status.unwrap_or(CacheStatus::Bypass)))
    }

    fn error(&self, e: GenerateError) -> ApiError {
        match e {
            GenerateError::Rejected(e) => ApiError::from_submit(e, self.endpoint.prompt_param()),
            GenerateError::Model(e) => e.into(),
            GenerateError::Unavailable(m) => ApiError::Unavailable(m),
        }
    }
}

/// A finished choice.
pub struct ChoiceResult {
    /// Choice index.
    pub index: usize,
    /// Prompt index.
    pub prompt_index: usize,
    /// The prompt's logprobs, when asked for.
    pub prompt: Option<Vec<PromptLogprob>>,
    /// The generated text.
    pub text: String,
    /// Every generated token.
    pub tokens: Vec<GeneratedToken>,
    /// How it ended.
    pub completion: Completion,
}

/// Waits for every job; on failure the others are aborted (dropped).
pub async fn collect(jobs: Vec<Job>) -> Result<Vec<ChoiceResult>, ApiError> {
    let results = futures_util::future::join_all(jobs.into_iter().map(collect_one)).await;
    results.into_iter().collect()
}

async fn collect_one(mut job: Job) -> Result<ChoiceResult, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut prompt = None;
    while let Some(event) = job.next().await.map_err(ApiError::Timeout)? {
        match event {
            TokenEvent::Prompt(p) => prompt = Some(p),
            TokenEvent::Token(t) => {
                text.push_str(&t.text);
                tokens.push(t);
            }
            TokenEvent::Finished(completion) => {
                return Ok(ChoiceResult {
                    index: job.index,
                    prompt_index: job.prompt_index,
                    prompt,
                    text,
                    tokens,
                    completion,
                })
            }
            TokenEvent::Error(e) => return Err(ApiError::Internal(e)),
        }
    }
    Err(ApiError::Internal("the engine dropped the request".into()))
}

/// Usage over choices: prompt tokens once per prompt, completions summed.
pub fn usage_of<'a>(done: impl Iterator<Item = (usize, &'a Completion)>) -> Usage {
    let mut seen = std::collections::BTreeMap::new();
    let mut completion_tokens = 0;
    for (prompt_index, c) in done {
        seen.entry(prompt_index)
            .or_insert((c.prompt_tokens, c.cached_tokens));
        completion_tokens += c.completion_tokens;
    }
    let prompt: usize = seen.values().map(|v| v.0).sum();
    let cached: usize = seen.values().map(|v| v.1).sum();
    Usage::new(prompt, completion_tokens, cached)
}

/// An event of one choice in a merged stream.
pub enum ChoiceEvent {
    /// The prompt logprobs of choice `index`.
    Prompt {
        /// Choice index.
        index: usize,
        /// One entry per prompt token.
        prompt: Vec<PromptLogprob>,
    },
    /// A token of choice `index`.
    Token {
        /// Choice index.
        index: usize,
        /// The token.
        token: GeneratedToken,
    },
    /// Choice `index` ended.
    Done {
        /// Choice index.
        index: usize,
        /// Prompt index.
        prompt_index: usize,
        /// How.
        completion: Completion,
    },
    /// Choice `index` failed.
    Failed(String),
    /// A choice ran past a timeout (the stream ends; every choice is
    /// cancelled).
    TimedOut(Timeout),
}

/// Interleaves the events of every job as they arrive. Dropping the stream
/// aborts every unfinished job.
pub fn merge(jobs: Vec<Job>) -> BoxStream<'static, ChoiceEvent> {
    let streams = jobs.into_iter().map(|job| {
        stream::unfold(Some(job), |job| async move {
            let mut job = job?;
            let next = match job.next().await {
                Ok(next) => next,
                Err(timeout) => return Some((ChoiceEvent::TimedOut(timeout), None)),
            };
            let event = match next {
                Some(TokenEvent::Prompt(prompt)) => ChoiceEvent::Prompt {
                    index: job.index,
                    prompt,
                },
                Some(TokenEvent::Token(token)) => ChoiceEvent::Token {
                    index: job.index,
                    token,
                },
                Some(TokenEvent::Finished(completion)) => {
                    let done = ChoiceEvent::Done {
                        index: job.index,
                        prompt_index: job.prompt_index,
                        completion,
                    };
                    return Some((done, None));
                }
                Some(TokenEvent::Error(e)) => return Some((ChoiceEvent::Failed(e), None)),
                None => {
                    return Some((
                        ChoiceEvent::Failed("the engine dropped the request".into()),
                        None,
                    ))
                }
            };
            Some((event, Some(job)))
        })
        .boxed()
    });
    stream::select_all(streams).boxed()
}
