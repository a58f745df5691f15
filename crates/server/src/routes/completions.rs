//! `POST /v1/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use ingot_protocol::completions::{
    Completion, CompletionChoice, CompletionLogprobs, Prompt, ValidCompletionRequest,
};
use ingot_tokenizer::Tokenizer;

use super::{json_body, response_id, sse, unix_now, Shared};
use crate::generate::{self, ChoiceEvent};
use crate::logprobs::resolve;
use crate::state::InflightGuard;
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
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let engine = state.engine()?.clone();
    let body = json_body(body, limit)?;
    let req = ValidCompletionRequest::parse(&body)?;
    state.check_model(req.sampling.model.as_deref())?;
    let guard = state.track();
    let tokenizer = engine.tokenizer().clone();
    let prompts = req.prompts.clone();
    let encoded = tokio::task::spawn_blocking(move || encode_prompts(&prompts, &tokenizer))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    let ids: Vec<Vec<u32>> = encoded.iter().map(|(ids, _)| ids.clone()).collect();
    let echo: Vec<String> = encoded.into_iter().map(|(_, text)| text).collect();
    let jobs = generate::submit(
        &engine,
        &ids,
        &req.sampling,
        generate::Endpoint::Completions,
    )?;
    let meta = Meta {
        id: response_id("cmpl"),
        created: unix_now(),
        model: state.model_name().to_string(),
        logprobs: req.sampling.params.logprobs.is_some(),
        tokenizer: engine.tokenizer().clone(),
        echo: req.echo.then_some(echo),
    };
    if req.sampling.stream {
        return Ok(stream_response(
            jobs,
            meta,
            req.sampling.include_usage,
            guard,
        ));
    }
    let results = generate::collect(jobs).await?;
    let usage = generate::usage_of(results.iter().map(|r| (r.prompt_index, &r.completion)));
    let choices = results
        .iter()
        .map(|r| {
            let prefix = meta.echo_of(r.prompt_index);
            let mut logprobs = CompletionLogprobs::default();
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
    Ok(Json(Completion {
        id: meta.id,
        object: "text_completion",
        created: meta.created,
        model: meta.model,
        choices,
        usage: Some(Some(usage)),
        system_fingerprint: None,
    })
    .into_response())
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
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
    guard: InflightGuard,
) -> Response {
    // With echo, each choice starts with its prompt.
    let head: Vec<_> = jobs
        .iter()
        .filter(|_| meta.echo.is_some())
        .map(|j| {
            let choice = CompletionChoice {
                index: j.index,
                text: meta.echo_of(j.prompt_index).to_string(),
                logprobs: None,
                finish_reason: None,
            };
            sse::data(&meta.chunk(vec![choice], include_usage))
        })
        .collect();
    let state = StreamState {
        events: generate::merge(jobs),
        done: Vec::new(),
        finished: false,
        meta,
        include_usage,
        offsets: std::collections::HashMap::new(),
        _guard: guard,
    };
    let body = stream::once(async move { head })
        .chain(stream::unfold(state, |mut st| async move {
            if st.finished {
                return None;
            }
            let events = st.next_events().await;
            Some((events, st))
        }))
        .boxed();
    sse::response(body)
}

struct StreamState {
    events: futures_util::stream::BoxStream<'static, ChoiceEvent>,
    done: Vec<(usize, ingot_engine::Completion)>,
    finished: bool,
    meta: Meta,
    include_usage: bool,
    /// Text emitted so far per choice (for logprob text offsets).
    offsets: std::collections::HashMap<usize, usize>,
    _guard: InflightGuard,
}

impl StreamState {
    async fn next_events(&mut self) -> Vec<axum::response::sse::Event> {
        let m = &self.meta;
        match self.events.next().await {
            Some(ChoiceEvent::Token { index, token }) => {
                if token.text.is_empty() && !m.logprobs {
                    return Vec::new();
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
                vec![sse::data(&m.chunk(vec![choice], self.include_usage))]
            }
            Some(ChoiceEvent::Done {
                index,
                prompt_index,
                completion,
            }) => {
                self.done.push((prompt_index, completion));
                let choice = CompletionChoice {
                    index,
                    text: String::new(),
                    logprobs: None,
                    finish_reason: Some(completion.reason.as_str()),
                };
                vec![sse::data(&m.chunk(vec![choice], self.include_usage))]
            }
            Some(ChoiceEvent::Failed(message)) => {
                self.finished = true;
                vec![sse::error(&message), sse::done()]
            }
            None => {
                self.finished = true;
                let mut out = Vec::new();
                if self.include_usage {
                    let usage = generate::usage_of(self.done.iter().map(|(p, c)| (*p, c)));
                    let mut chunk = m.chunk(Vec::new(), true);
                    chunk.usage = Some(Some(usage));
                    out.push(sse::data(&chunk));
                }
                out.push(sse::done());
                out
            }
        }
    }
}
