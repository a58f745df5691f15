//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use ingot_protocol::chat::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta,
    ChatLogprobs, ChatTurn, ValidChatRequest,
};
use ingot_protocol::ProtocolError;
use ingot_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use super::{json_body, response_id, sse, unix_now, Shared};
use crate::generate::{self, ChoiceEvent};
use crate::logprobs::resolve;
use crate::state::InflightGuard;
use crate::ApiError;

/// Renders the conversation and tokenizes it (runs on a blocking thread).
fn prompt_ids(
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
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let engine = state.engine()?.clone();
    let body = json_body(body, limit)?;
    let req = ValidChatRequest::parse(&body)?;
    state.check_model(req.sampling.model.as_deref())?;
    let guard = state.track();
    let template = state.chat_template()?;
    let tokenizer = engine.tokenizer().clone();
    let (req, ids) = tokio::task::spawn_blocking(move || {
        let ids = prompt_ids(&req, &template, &tokenizer);
        (req, ids)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))?;
    let jobs = generate::submit(&engine, &[ids?], &req.sampling, generate::Endpoint::Chat)?;
    let meta = Meta {
        id: response_id("chatcmpl"),
        created: unix_now(),
        model: state.model_name().to_string(),
        logprobs: req.sampling.params.logprobs.is_some(),
        tokenizer: engine.tokenizer().clone(),
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
        .map(|r| ChatChoice {
            index: r.index,
            message: AssistantMessage {
                role: "assistant",
                content: r.text.clone(),
            },
            logprobs: meta.logprobs.then(|| ChatLogprobs {
                content: r
                    .tokens
                    .iter()
                    .map(|t| (&resolve(&meta.tokenizer, t)).into())
                    .collect(),
            }),
            finish_reason: Some(r.completion.reason.as_str()),
        })
        .collect();
    drop(guard);
    Ok(Json(ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices,
        usage,
        system_fingerprint: None,
    })
    .into_response())
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
    guard: InflightGuard,
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
    let state = StreamState {
        events: generate::merge(jobs),
        done: Vec::new(),
        finished: false,
        meta,
        include_usage,
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
                let choice = ChatChunkChoice {
                    index,
                    delta: ChatDelta {
                        role: None,
                        content: Some(token.text.clone()),
                    },
                    logprobs: m.logprobs.then(|| ChatLogprobs {
                        content: vec![(&resolve(&m.tokenizer, &token)).into()],
                    }),
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
                let choice = ChatChunkChoice {
                    index,
                    delta: ChatDelta::default(),
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
