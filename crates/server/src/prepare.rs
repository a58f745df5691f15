//! One path for every generating endpoint. An endpoint is a thin adapter
//! ([`WireFormat`]): it parses its wire format, says how to render and
//! tokenize its prompts and how to shape the answer. Everything between is
//! here, once:
//!
//! ```text
//! edge (auth, limits) ─► prepare: the model's front (tokenizer, template;
//!   never its engine) ─► render, tokenize, compile (blocking thread)
//!   ─► start: GenerateRequests ─► pipeline (cache ─► coalescer ─► engine
//!   stage: the one lease) ─► stream or collect ─► settle
//! ```
//!
//! Readiness is checked once (in [`front`]); the model's limits once, by
//! the engine at submission.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::Response;
use ingot_core::TokenId;
use ingot_edge::Caller;
use ingot_engine::Grammar;
use ingot_protocol::sampling::ValidSampling;
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::usage::Usage;
use ingot_structured::UniqueItems;
use ingot_tokenizer::Tokenizer;

use crate::conn::{ConnProbe, Received};
use crate::generate::{self, ChoiceResult, Deadlines, Endpoint, Job, Prompts, Submission};
use crate::models::ModelFront;
use crate::pipeline::CacheStatus;
use crate::routes::sse;
use crate::state::{CacheControl, InflightGuard};
use crate::usage::KeyUsage;
use crate::{ApiError, AppState};

/// What a request brings besides its body: who calls, its connection, when
/// its head came and what its `Cache-Control` asks.
pub struct Incoming {
    caller: Caller,
    probe: Option<ConnProbe>,
    received: Instant,
    control: CacheControl,
}

impl Incoming {
    /// Who calls.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Incoming {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let control = parts
            .headers
            .get(axum::http::header::CACHE_CONTROL)
            .and_then(|v| v.to_str().ok());
        Ok(Self {
            // The auth layer puts one on every request; none means auth is off.
            caller: parts
                .extensions
                .get::<Caller>()
                .cloned()
                .unwrap_or_default(),
            probe: parts.extensions.get::<ConnProbe>().cloned(),
            received: parts
                .extensions
                .get::<Received>()
                .map_or_else(Instant::now, |r| r.0),
            control: CacheControl::parse(control),
        })
    }
}

/// A generating endpoint's wire format around the shared path.
pub trait WireFormat: Send + 'static {
    /// Which endpoint (error field names, default length, id prefix).
    const ENDPOINT: Endpoint;
    /// What encoding leaves for shaping the answer.
    type Extra: Send + 'static;
    /// How the answer is shaped.
    type Answer: Shape;

    /// The request's model, sampling and stream options.
    fn sampling(&self) -> &ValidSampling;
    /// The output grammar every choice follows (structured output, forced
    /// tool calls), if any.
    fn grammar(&self, front: &ModelFront) -> Result<Option<OutputGrammar>, ApiError>;
    /// Schemas the request carries, checked each on its own whether or not
    /// the answer is held to them (tools' parameters under any tool_choice).
    fn schemas(&self) -> Vec<crate::structured::SchemaCheck> {
        Vec::new()
    }
    /// Renders and tokenizes every prompt (runs on a blocking thread).
    fn encode(&self, front: &ModelFront) -> Result<(Vec<Vec<TokenId>>, Self::Extra), ApiError>;
    /// The answer's shaper.
    fn answer(self, head: Head, front: &ModelFront, extra: Self::Extra) -> Self::Answer;
}

/// Shapes an answer: as SSE chunks, or as one body.
pub trait Shape {
    /// The SSE response over the choices' jobs.
    fn stream(self, jobs: Vec<Job>, include_usage: bool, delivery: sse::Delivery) -> Response;
    /// The whole answer.
    fn whole(self, results: &[ChoiceResult], usage: Usage) -> Response;
}

/// What every answer of a request repeats.
pub struct Head {
    /// The response id (`<prefix>-…`).
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The model's id.
    pub model: String,
    /// Resolves token ids in logprobs.
    pub tokenizer: Arc<Tokenizer>,
    /// Whether output logprobs were asked for.
    pub logprobs: bool,
    /// When the request's head came (Ollama reports durations from it).
    pub received: Instant,
}

/// Serves a generating request: prepare, start through the pipeline, then
/// stream or collect and settle. The one skeleton of every endpoint.
pub async fn generate<W: WireFormat>(
    state: AppState,
    incoming: Incoming,
    request: W,
) -> Result<Response, ApiError> {
    let guard = state.track();
    let (request, prepared) = prepare(&state, &incoming, request).await?;
    let started = start(
        &state,
        &incoming,
        &prepared,
        request.sampling(),
        W::ENDPOINT,
    )
    .await?;
    note_prepared(incoming.received, &started.jobs);
    let sampling = request.sampling();
    let (stream, include_usage) = (sampling.stream, sampling.include_usage);
    let continuous = sampling
        .continuous_usage
        .then_some(started.answer.prompt_tokens);
    let head = Head {
        id: started.id,
        created: crate::routes::unix_now(),
        model: prepared.front.id().to_string(),
        tokenizer: prepared.front.tokenizer()?.clone(),
        logprobs: sampling.params.logprobs.is_some(),
        received: incoming.received,
    };
    let shape = request.answer(head, &prepared.front, prepared.extra);
    if stream {
        let mut delivery = delivery(&state, incoming, guard, started.usage, continuous);
        delivery.check = prepared.check.clone();
        let response = shape.stream(started.jobs, include_usage, delivery);
        return Ok(served_by(
            started.answer.finish(response, None),
            &prepared.front,
        ));
    }
    let results = tracing::Instrument::instrument(
        generate::collect(started.jobs),
        tracing::info_span!("generate"),
    )
    .await?;
    if let Some(check) = &prepared.check {
        results.iter().try_for_each(|r| check.judge(&r.text))?;
    }
    let usage = generate::usage_of(results.iter().map(|r| (r.prompt_index, &r.completion)));
    drop(guard);
    let tokens = (usage.prompt_tokens, usage.completion_tokens);
    let response = shape.whole(&results, usage);
    started.usage.settle(tokens.0 as u64, tokens.1 as u64);
    Ok(served_by(
        started.answer.finish(response, Some(tokens)),
        &prepared.front,
    ))
}

/// Marks `response` as `front`'s answer: its HTTP series carry that model.
fn served_by(mut response: Response, front: &ModelFront) -> Response {
    response
        .extensions_mut()
        .insert(crate::http_metrics::ServedBy(front.id().to_string()));
    response
}

/// A request made ready for the pipeline: its model's front, token ids,
/// compiled grammar and what shaping needs.
struct Prepared<X> {
    front: Arc<ModelFront>,
    ids: Vec<Vec<TokenId>>,
    grammar: Option<Grammar>,
    /// What the finished answers are checked against.
    check: Option<AnswerCheck>,
    extra: X,
}

/// Finds the model's front and renders, tokenizes and compiles the request
/// with it on a blocking thread. Touches no engine.
async fn prepare<W: WireFormat>(
    state: &AppState,
    incoming: &Incoming,
    request: W,
) -> Result<(W, Prepared<W::Extra>), ApiError> {
    let front = front(state, &incoming.caller, request.sampling().model.as_deref()).await?;
    let spec = request.grammar(&front)?;
    let schemas = request.schemas();
    let check = spec.as_ref().and_then(|g| {
        UniqueItems::of(&g.spec).map(|unique| AnswerCheck {
            param: g.param.clone(),
            unique,
        })
    });
    let span = tracing::info_span!("tokenize");
    let encoding = front.clone();
    let (request, encoded) = tokio::task::spawn_blocking(move || {
        let encoded = span.in_scope(|| {
            // Each schema on its own first, so an error names its field
            // (`tools[i].function.parameters`), not the grammar built of all.
            if !schemas.is_empty() {
                let compiler = encoding.grammar_compiler()?;
                for s in &schemas {
                    crate::structured::check(&compiler, s)?;
                }
            }
            let grammar = compile(&encoding, spec.as_ref())?;
            let (ids, extra) = request.encode(&encoding)?;
            Ok::<_, ApiError>((ids, grammar, extra))
        });
        (request, encoded)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    let (ids, grammar, extra) = encoded?;
    let prepared = Prepared {
        front,
        ids,
        grammar,
        check,
        extra,
    };
    Ok((request, prepared))
}

/// A schema constraint the grammar could not enforce while generating
/// (`uniqueItems`), checked on each finished answer; a break fails the
/// request (an error event once a stream's head is out).
#[derive(Debug, Clone)]
pub struct AnswerCheck {
    param: String,
    unique: UniqueItems,
}

impl AnswerCheck {
    /// The error a finished answer `text` earns, if any.
    pub fn judge(&self, text: &str) -> Result<(), ApiError> {
        match self.unique.violation(text) {
            None => Ok(()),
            Some(message) => Err(ApiError::InvalidOutput {
                param: self.param.clone(),
                message,
            }),
        }
    }
}

/// Compiles `grammar` for `front`'s vocabulary (blocking).
fn compile(
    front: &ModelFront,
    grammar: Option<&OutputGrammar>,
) -> Result<Option<Grammar>, ApiError> {
    match grammar {
        None => Ok(None),
        Some(g) => crate::structured::compile(&*front.grammar_compiler()?, g).map(Some),
    }
}

/// The front of the model `requested` names (the default when absent), once
/// the server serves. With an API key, a model the key may not use is a
/// 404 as if it did not exist, decided before anything is built.
pub async fn front(
    state: &AppState,
    caller: &Caller,
    requested: Option<&str>,
) -> Result<Arc<ModelFront>, ApiError> {
    let name = allowed_model(state, caller, requested)?;
    let (_, front) = state.models().front(name).await?;
    Ok(front)
}

/// The name a request's model goes by, once the server serves and the
/// caller's key may use it; counts the request toward prefetching.
pub fn allowed_model<'a>(
    state: &'a AppState,
    caller: &Caller,
    requested: Option<&'a str>,
) -> Result<&'a str, ApiError> {
    state.check_serving()?;
    let models = state.models();
    let name = requested.unwrap_or(state.model_name());
    if let Some(key) = caller.key() {
        let id = models.resolve(name)?;
        if !key.allows_model(&id) && !key.allows_model(name) {
            return Err(ApiError::ModelNotFound(name.to_string()));
        }
    }
    models.note_request(name);
    Ok(name)
}

/// A request's generations, started through the pipeline.
struct Started {
    /// The response id (`<prefix>-…`), also the flag unit without `user`.
    id: String,
    jobs: Vec<Job>,
    /// What the answer reports: cache status, tenant, prompt tokens.
    answer: Answer,
    /// Settled when the answer ends.
    usage: KeyUsage,
}

/// What every answer of a started request carries (header, access log).
struct Answer {
    model: String,
    status: CacheStatus,
    tenant: Option<String>,
    prompt_tokens: usize,
}

impl Answer {
    /// Adds `x-ingot-cache` and what the access log reads: `tokens` is
    /// (prompt, completion) of a finished answer, `None` for a stream (whose
    /// head is logged, with the prompt tokens known then).
    fn finish(self, response: Response, tokens: Option<(usize, usize)>) -> Response {
        let access = crate::observe::Access {
            model: Some(self.model),
            tenant: self.tenant,
            prompt_tokens: Some(tokens.map_or(self.prompt_tokens, |t| t.0) as u64),
            completion_tokens: tokens.map(|t| t.1 as u64),
            stream: tokens.is_none(),
            cache: Some(self.status.as_str()),
        };
        crate::observe::with_access(
            crate::routes::with_cache_status(response, self.status),
            access,
        )
    }
}

/// Hands `prompts × n` generations to the pipeline. With an API key, its
/// priority ceiling lowers the request's tier, its tenant scopes shared
/// answers, its id is the flag unit (else the `user` field, else the
/// response id), and its tokens-per-minute bucket must hold prompt +
/// max_tokens of every choice.
async fn start<X>(
    state: &AppState,
    incoming: &Incoming,
    prepared: &Prepared<X>,
    sampling: &ValidSampling,
    endpoint: Endpoint,
) -> Result<Started, ApiError> {
    let model = prepared.front.id();
    let id = crate::routes::response_id(match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    });
    let key = incoming.caller.key();
    let sampling = &admit(key, sampling);
    let runtime = state.runtime();
    let shed = &runtime.config.remediation.shed;
    state
        .slo()
        .admit(model, sampling.priority, shed.retry_after.get())?;
    let unit = key
        .map(|k| k.id.as_str())
        .or(sampling.user.as_deref())
        .unwrap_or(&id);
    let tenant = key.and_then(|k| k.tenant.clone());
    let configured = &runtime.config.limits;
    let submission = Submission {
        model: model.to_string(),
        tenant: tenant.clone(),
        sharing: state.sharing(unit, incoming.control),
        limits: prepared.front.limits()?,
        endpoint,
        max_tokens_cap: configured.max_tokens,
        deadlines: deadlines(configured, key, sampling.priority),
        span: tracing::Span::current(),
    };
    let prompts = &prepared.ids;
    let mut reserved = 0;
    if let Some(k) = key {
        reserved = submission.token_budget(prompts, sampling);
        state
            .edge()
            .reserve_tokens(k, reserved)
            .await
            .map_err(|r| ApiError::RateLimited {
                retry_after: r.retry_after(),
                message: r.message(),
            })?;
    }
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    // From here on the reservation is corrected when `usage` drops, even
    // if submitting fails.
    let usage = KeyUsage::new(
        incoming.caller.0.clone(),
        reserved,
        prompt_tokens as u64,
        sampling.n as u64,
    );
    let inputs = Prompts {
        ids: prompts,
        grammar: prepared.grammar.as_ref(),
    };
    let (jobs, status) = tracing::Instrument::instrument(
        submission.submit(state.pipeline(), inputs, sampling),
        tracing::info_span!("submit"),
    )
    .await?;
    let answer = Answer {
        model: model.to_string(),
        status,
        tenant,
        prompt_tokens,
    };
    Ok(Started {
        id,
        jobs,
        answer,
        usage,
    })
}

/// The request's deadlines from now: the tier's timeouts, or the key's
/// overrides (zero: none).
fn deadlines(
    limits: &ingot_config::LimitsSection,
    key: Option<&ingot_edge::Key>,
    priority: ingot_core::Priority,
) -> Deadlines {
    let tier = priority.rank();
    let pick = |overridden: Option<Duration>, tiered: Option<Duration>| {
        overridden.map_or(tiered, |d| (!d.is_zero()).then_some(d))
    };
    let first = pick(
        key.and_then(|k| k.first_token_timeout),
        limits.first_token_timeout.get(tier),
    );
    let total = pick(
        key.and_then(|k| k.request_timeout),
        limits.request_timeout.get(tier),
    );
    Deadlines::after(Instant::now(), first, total)
}

/// `sampling` with its tier lowered to `key`'s ceiling.
fn admit(key: Option<&ingot_edge::Key>, sampling: &ValidSampling) -> ValidSampling {
    let mut sampling = sampling.clone();
    if let Some(key) = key {
        sampling.priority = key.clamp(sampling.priority);
    }
    sampling
}

/// Records how long the request took from its head to the engine
/// (`ingot_request_prepare_seconds`).
fn note_prepared(received: Instant, jobs: &[Job]) {
    if let Some(job) = jobs.first() {
        let took = job.submitted().saturating_duration_since(received);
        metrics::histogram!(crate::http_metrics::PREPARE_SECONDS).record(took.as_secs_f64());
    }
}

/// What a stream of this connection holds and where it goes, under the
/// running config's slow-client policy.
fn delivery(
    state: &AppState,
    incoming: Incoming,
    guard: InflightGuard,
    usage: KeyUsage,
    continuous: Option<usize>,
) -> sse::Delivery {
    let runtime = state.runtime();
    let c = &runtime.config;
    let out = sse::Output {
        probe: incoming.probe,
        settings: crate::routes::send_queue::Settings {
            stall_timeout: c.engine.stall_timeout.get(),
            flush_interval: c.server.stream_flush_interval.get(),
            max_pending: usize::try_from(c.server.max_stream_pending_bytes.bytes())
                .unwrap_or(usize::MAX),
        },
    };
    sse::Delivery {
        guard,
        usage,
        out,
        received: incoming.received,
        continuous,
        check: None,
    }
}
