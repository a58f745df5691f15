//! `POST /v1/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use ingot_edge::Caller;
use std::collections::HashMap;

use ingot_engine::{Completion as EngineCompletion, GeneratedToken, PromptLogprob};
use ingot_protocol::completions::{
    Completion, CompletionChoice, CompletionLogprobs, Prompt, ValidCompletionRequest,
};
use ingot_protocol::usage::Usage;
use ingot_tokenizer::Tokenizer;

use super::sse::Event;
use super::{json_body, sse, start, unix_now, Shared, Started};
use crate::conn::{ConnProbe, Received};
use crate::generate;
use crate::logprobs::{push_prompt, resolve};
use crate::ApiError;

/// Token ids and display text of every prompt (runs on a blocking thread).
fn encode_prompts(
    prompts: &[Prompt],
    tokenizer: &Tokenizer,
) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    prompts
        .iter()
        .map(|p| match p {
            Prompt::Text(t) => tokenizer
                .encode(t, true)
                .map(|ids| (ids, t.clone()))
                .map_err(|e| ApiError::Internal(e.to_string())),
            Prompt::Ids(ids) => {
                let text = tokenizer.decode(ids, false).unwrap_or_default();
                Ok((ids.clone(), text))
            }
        })
        .collect()
}

/// The handler.
pub async fn completions(
    State((state, limit)): State<Shared>,
    Extension(caller): Extension<Caller>,
    probe: Option<Extension<ConnProbe>>,
    received: Option<Extension<Received>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let received = Received::or_now(received);
    let body = json_body(body, limit)?;
    let req = ValidCompletionRequest::parse(&body)?;
    let model = super::lease(&state, &caller, req.sampling.model.as_deref()).await?;
    let engine = model.engine()?.clone();
    let guard = state.track();
    let tokenizer = engine.tokenizer().clone();
    let prompts = req.prompts.clone();
    let span = tracing::info_span!("tokenize");
    let (compiling, spec) = (engine.clone(), req.sampling.grammar.clone());
    let (encoded, grammar) = tokio::task::spawn_blocking(move || {
        span.in_scope(|| {
            let grammar = crate::structured::compile(&compiling, spec.as_ref())?;
            Ok::<_, ApiError>((encode_prompts(&prompts, &tokenizer)?, grammar))
        })
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    let ids: Vec<Vec<u32>> = encoded.iter().map(|(ids, _)| ids.clone()).collect();
    let echo: Vec<String> = encoded.into_iter().map(|(_, text)| text).collect();
    let Started {
        id,
        jobs,
        answer,
        usage: key_usage,
    } = start(
        &state,
        &model,
        &caller,
        &headers,
        generate::Prompts {
            ids: &ids,
            grammar: grammar.as_ref(),
        },
        &req.sampling,
        generate::Endpoint::Completions,
    )
    .await?;
    super::note_prepared(received, &jobs);
    let meta = Meta {
        id,
        created: unix_now(),
        model: model.id().to_string(),
        logprobs: req.sampling.params.logprobs.is_some(),
        prompt_logprobs: req.sampling.params.prompt_logprobs.is_some(),
        tokenizer: engine.tokenizer().clone(),
        echo: req.echo.then_some(echo),
    };
    if req.sampling.stream {
        let delivery = super::delivery(&state, probe, guard, key_usage, received);
        let response = stream_response(jobs, meta, req.sampling.include_usage, delivery);
        return Ok(answer.finish(response, None));
    }
    let results =
        tracing::Instrument::instrument(generate::collect(jobs), tracing::info_span!("generate"))
            .await?;
    let usage = generate::usage_of(results.iter().map(|r| (r.prompt_index, &r.completion)));
    let choices = results
        .iter()
        .map(|r| {
            let prefix = meta.echo_of(r.prompt_index);
            let mut logprobs = CompletionLogprobs::default();
            if let Some(prompt) = &r.prompt {
                push_prompt(&mut logprobs, &meta.tokenizer, prompt);
            }
            let mut offset = prefix.len();
            for t in &r.tokens {
                logprobs.push(&resolve(&meta.tokenizer, t), offset);
                offset += t.text.len();
            }
            CompletionChoice {
                index: r.index,
                text: format!("{prefix}{}", r.text),
                logprobs: meta.logprobs.then_some(logprobs),
                finish_reason: Some(r.completion.reason.as_str()),
            }
        })
        .collect();
    drop(guard);
    let tokens = (usage.prompt_tokens, usage.completion_tokens);
    let response = Json(Completion {
        id: meta.id,
        object: "text_completion",
        created: meta.created,
        model: meta.model,
        choices,
        usage: Some(Some(usage)),
        system_fingerprint: None,
    })
    .into_response();
    key_usage.settle(tokens.0 as u64, tokens.1 as u64);
    Ok(answer.finish(response, Some(tokens)))
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    /// Echoed prompts come with their logprobs (sent when they arrive).
    prompt_logprobs: bool,
    tokenizer: Arc<Tokenizer>,
    /// Prompt texts when echoing.
    echo: Option<Vec<String>>,
}

impl Meta {
    fn echo_of(&self, prompt_index: usize) -> &str {
        self.echo
            .as_ref()
            .and_then(|e| e.get(prompt_index))
            .map_or("", String::as_str)
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, include_usage: bool) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: include_usage.then_some(None),
            system_fingerprint: None,
        }
    }
}

fn stream_response(
    jobs: Vec<generate::Job>,
    meta: Meta,
    include_usage: bool,
    delivery: sse::Delivery,
) -> Response {
    // With echo, each choice starts with its prompt (with its logprobs,
    // the prompt goes out when they arrive).
    let mut offsets = HashMap::new();
    let head: Vec<_> = jobs
        .iter()
        .filter(|_| meta.echo.is_some() && !meta.prompt_logprobs)
        .map(|j| {
            let text = meta.echo_of(j.prompt_index).to_string();
            offsets.insert(j.index, text.len());
            let choice = CompletionChoice {
                index: j.index,
                text,
                logprobs: None,
                finish_reason: None,
            };
            sse::data(&meta.chunk(vec![choice], include_usage))
        })
        .collect();
    let prompt_index = jobs.iter().map(|j| (j.index, j.prompt_index)).collect();
    let format = CompletionChunks {
        meta,
        include_usage,
        offsets,
        prompt_index,
    };
    sse::stream_choices(head, jobs, format, include_usage, delivery)
}

struct CompletionChunks {
    meta: Meta,
    include_usage: bool,
    /// Text sent so far per choice (for logprob text offsets).
    offsets: HashMap<usize, usize>,
    /// Choice index → prompt index.
    prompt_index: HashMap<usize, usize>,
}

impl sse::ChunkFormat for CompletionChunks {
    fn prompt(&mut self, index: usize, prompt: Vec<PromptLogprob>) -> Option<Event> {
        let m = &self.meta;
        let text = m
            .echo_of(self.prompt_index.get(&index).copied()?)
            .to_string();
        let mut logprobs = CompletionLogprobs::default();
        push_prompt(&mut logprobs, &m.tokenizer, &prompt);
        self.offsets.insert(index, text.len());
        let choice = CompletionChoice {
            index,
            text,
            logprobs: Some(logprobs),
            finish_reason: None,
        };
        Some(sse::data(&m.chunk(vec![choice], self.include_usage)))
    }

    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<Event> {
        let m = &self.meta;
        if token.text.is_empty() && !m.logprobs {
            return None;
        }
        let offset = self.offsets.entry(index).or_insert(0);
        let logprobs = m.logprobs.then(|| {
            let mut l = CompletionLogprobs::default();
            l.push(&resolve(&m.tokenizer, &token), *offset);
            l
        });
        *offset += token.text.len();
        let choice = CompletionChoice {
            index,
            text: token.text,
            logprobs,
            finish_reason: None,
        };
        Some(sse::data(&m.chunk(vec![choice], self.include_usage)))
    }

    fn finish(&mut self, index: usize, completion: &EngineCompletion) -> Event {
        let choice = CompletionChoice {
            index,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(completion.reason.as_str()),
        };
        sse::data(&self.meta.chunk(vec![choice], self.include_usage))
    }

    fn usage(&self, usage: Usage) -> Event {
        let mut chunk = self.meta.chunk(Vec::new(), true);
        chunk.usage = Some(Some(usage));
        sse::data(&chunk)
    }
}
