//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use ingot_edge::Caller;
use ingot_engine::{Completion, GeneratedToken};
use ingot_protocol::chat::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta,
    ChatLogprobs, ChatTurn, ValidChatRequest,
};
use ingot_protocol::usage::Usage;
use ingot_protocol::ProtocolError;
use ingot_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use super::sse::Event;
use super::{json_body, sse, start, unix_now, Shared, Started};
use crate::conn::ConnProbe;
use crate::generate;
use crate::logprobs::resolve;
use crate::ApiError;

/// Renders the conversation and tokenizes it (runs on a blocking thread).
pub(super) fn prompt_ids(
    req: &ValidChatRequest,
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
) -> Result<Vec<u32>, ApiError> {
    let messages: Vec<ChatMessage> = req
        .messages
        .iter()
        .map(to_message)
        .collect::<Result<_, _>>()?;
    let text = template
        .render_with_kwargs(
            &messages,
            req.add_generation_prompt,
            req.tools.as_ref(),
            &req.template_kwargs,
        )
        .map_err(|e| ApiError::BadRequest(ProtocolError::field("messages", e.to_string())))?;
    tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::Internal(e.to_string()))
}

fn to_message(turn: &ChatTurn) -> Result<ChatMessage, ApiError> {
    let mut obj = turn.extra.clone();
    obj.insert("role".into(), turn.role.clone().into());
    obj.insert("content".into(), turn.content.clone().into());
    serde_json::from_value(serde_json::Value::Object(obj)).map_err(|e| {
        ApiError::BadRequest(ProtocolError::field(
            "messages",
            format!("invalid message: {e}"),
        ))
    })
}

/// The handler.
pub async fn chat_completions(
    State((state, limit)): State<Shared>,
    Extension(caller): Extension<Caller>,
    probe: Option<Extension<ConnProbe>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body, limit)?;
    let req = ValidChatRequest::parse(&body)?;
    let model = super::lease(&state, &caller, req.sampling.model.as_deref()).await?;
    let engine = model.engine.clone();
    let guard = state.track();
    let template = model.chat_template()?;
    let tokenizer = engine.tokenizer().clone();
    let span = tracing::info_span!("tokenize");
    let (req, ids) = tokio::task::spawn_blocking(move || {
        let ids = span.in_scope(|| prompt_ids(&req, &template, &tokenizer));
        (req, ids)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    let ids = ids?;
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
        &[ids],
        &req.sampling,
        generate::Endpoint::Chat,
    )
    .await?;
    let meta = Meta {
        id,
        created: unix_now(),
        model: model.id().to_string(),
        logprobs: req.sampling.params.logprobs.is_some(),
        tokenizer: engine.tokenizer().clone(),
    };
    if req.sampling.stream {
        let delivery = super::delivery(&state, probe, guard, key_usage);
        let response = stream_response(jobs, meta, req.sampling.include_usage, delivery);
        return Ok(answer.finish(response, None));
    }
    let results =
        tracing::Instrument::instrument(generate::collect(jobs), tracing::info_span!("generate"))
            .await?;
    let usage = generate::usage_of(results.iter().map(|r| (r.prompt_index, &r.completion)));
    let choices = results
        .iter()
        .map(|r| ChatChoice {
            index: r.index,
            message: AssistantMessage {
                role: "assistant",
                content: r.text.clone(),
                refusal: None,
            },
            logprobs: meta.logprobs.then(|| ChatLogprobs {
                content: r
                    .tokens
                    .iter()
                    .map(|t| (&resolve(&meta.tokenizer, t)).into())
                    .collect(),
                refusal: None,
            }),
            finish_reason: Some(r.completion.reason.as_str()),
        })
        .collect();
    drop(guard);
    let tokens = (usage.prompt_tokens, usage.completion_tokens);
    let response = Json(ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices,
        usage,
        system_fingerprint: None,
    })
    .into_response();
    key_usage.settle(tokens.0 as u64, tokens.1 as u64);
    Ok(answer.finish(response, Some(tokens)))
}

/// What every chunk repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    tokenizer: Arc<Tokenizer>,
}

impl Meta {
    fn chunk(&self, choices: Vec<ChatChunkChoice>, include_usage: bool) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
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
    // Every choice opens with the assistant role, as OpenAI does.
    let head: Vec<_> = jobs
        .iter()
        .map(|j| {
            let delta = ChatDelta {
                role: Some("assistant"),
                content: Some(String::new()),
            };
            let choice = ChatChunkChoice {
                index: j.index,
                delta,
                logprobs: None,
                finish_reason: None,
            };
            sse::data(&meta.chunk(vec![choice], include_usage))
        })
        .collect();
    let format = ChatChunks {
        meta,
        include_usage,
    };
    sse::stream_choices(head, jobs, format, include_usage, delivery)
}

struct ChatChunks {
    meta: Meta,
    include_usage: bool,
}

impl sse::ChunkFormat for ChatChunks {
    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<Event> {
        let m = &self.meta;
        if token.text.is_empty() && !m.logprobs {
            return None;
        }
        let choice = ChatChunkChoice {
            index,
            delta: ChatDelta {
                role: None,
                content: Some(token.text.clone()),
            },
            logprobs: m.logprobs.then(|| ChatLogprobs {
                content: vec![(&resolve(&m.tokenizer, &token)).into()],
                refusal: None,
            }),
            finish_reason: None,
        };
        Some(sse::data(&m.chunk(vec![choice], self.include_usage)))
    }

    fn finish(&mut self, index: usize, completion: &Completion) -> Event {
        let choice = ChatChunkChoice {
            index,
            delta: ChatDelta::default(),
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
