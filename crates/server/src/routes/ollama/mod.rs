//! Ollama's API: `/api/chat` and `/api/generate` on the shared path
//! (`prepare::generate`), answered whole or as NDJSON lines (Ollama streams
//! by default); `/api/embed` on the embeddings route's path; `/api/tags`,
//! `/api/show` and `/api/version` from the models' fronts (`info`). The
//! requests map onto chat and embeddings requests
//! (`ingot_protocol::ollama`); errors are reshaped into `{"error": "..."}`
//! at the edge (`super::dialect`).

mod info;
mod lines;

pub use info::{embed, show, tags, version};

use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ingot_core::{FinishReason, TokenId};
use ingot_protocol::ollama::{
    ChatChunk, ChatRequest, FunctionCall, GenerateChunk, GenerateRequest, Message, Stats, ToolCall,
};
use ingot_protocol::sampling::ValidSampling;
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::usage::Usage;

use super::{json_body, sse, Shared};
use crate::generate::{self, ChoiceResult, Job};
use crate::models::ModelFront;
use crate::prepare::{self, Head, Incoming, Shape, WireFormat};
use crate::tools::{self, ToolFormat};
use crate::ApiError;

/// `POST /api/chat`.
pub async fn chat(
    State((state, limit)): State<Shared>,
    incoming: Incoming,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = ChatRequest::parse(&json_body(body, limit)?)?;
    prepare::generate(state, incoming, req).await
}

/// `POST /api/generate`.
pub async fn generate(
    State((state, limit)): State<Shared>,
    incoming: Incoming,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = GenerateRequest::parse(&json_body(body, limit)?)?;
    prepare::generate(state, incoming, req).await
}

impl WireFormat for ChatRequest {
    const ENDPOINT: generate::Endpoint = generate::Endpoint::Chat;
    type Extra = ();
    type Answer = Reply;

    fn sampling(&self) -> &ValidSampling {
        &self.chat.sampling
    }

    fn grammar(&self, front: &ModelFront) -> Result<Option<OutputGrammar>, ApiError> {
        self.chat.grammar(front)
    }

    fn schemas(&self) -> Vec<crate::structured::SchemaCheck> {
        self.chat.schemas()
    }

    fn encode(&self, front: &ModelFront) -> Result<(Vec<Vec<TokenId>>, ()), ApiError> {
        // Ollama's `thinking` field is not served: the text as written.
        Ok((self.chat.encode(front)?.0, ()))
    }

    fn answer(self, head: Head, front: &ModelFront, (): ()) -> Reply {
        let tools = front
            .chat_template()
            .ok()
            .and_then(|t| super::chat::parsed_tools(&self.chat, &t));
        Reply {
            head,
            kind: Kind::Chat,
            tools: tools.map(|(format, _)| format),
        }
    }
}

impl WireFormat for GenerateRequest {
    // Ollama's `num_predict` defaults to no limit: the context, as chat's.
    const ENDPOINT: generate::Endpoint = generate::Endpoint::Chat;
    type Extra = ();
    type Answer = Reply;

    fn sampling(&self) -> &ValidSampling {
        &self.chat.sampling
    }

    fn grammar(&self, _: &ModelFront) -> Result<Option<OutputGrammar>, ApiError> {
        Ok(self.chat.sampling.grammar.clone())
    }

    /// Through the chat template (as Ollama's template wraps a prompt),
    /// unless `raw` or the model has none: then the prompt as it is.
    fn encode(&self, front: &ModelFront) -> Result<(Vec<Vec<TokenId>>, ()), ApiError> {
        if !self.raw && front.chat_template().is_ok() {
            return Ok((self.chat.encode(front)?.0, ()));
        }
        let ids = front
            .tokenizer()?
            .encode(&self.prompt, true)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok((vec![ids], ()))
    }

    fn answer(self, head: Head, _: &ModelFront, (): ()) -> Reply {
        Reply {
            head,
            kind: Kind::Generate,
            tools: None,
        }
    }
}

/// Which endpoint's lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Generate,
}

/// What shaping an answer needs.
pub struct Reply {
    head: Head,
    kind: Kind,
    /// The format tool calls are parsed in, when the answer may hold calls.
    tools: Option<ToolFormat>,
}

impl Reply {
    /// A line adding `text` and `calls`, closing the answer with `stats`.
    fn line(&self, text: String, calls: Vec<ToolCall>, stats: Option<Stats>) -> serde_json::Value {
        let model = self.head.model.clone();
        let created_at = info::now_rfc3339();
        let done = stats.is_some();
        let value = match self.kind {
            Kind::Chat => serde_json::to_value(ChatChunk {
                model,
                created_at,
                message: Message {
                    role: "assistant",
                    content: text,
                    tool_calls: calls,
                },
                done,
                stats,
            }),
            Kind::Generate => serde_json::to_value(GenerateChunk {
                model,
                created_at,
                response: text,
                done,
                stats,
            }),
        };
        value.unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}))
    }

    /// The closing fields: counts, and durations from the request's
    /// arrival; `first` is when the first token went out (unknown for a
    /// whole answer, whose time is then all `eval_duration`).
    fn stats(&self, reason: FinishReason, usage: Usage, first: Option<Instant>) -> Stats {
        let total = self.head.received.elapsed();
        let prompt = first.map_or(Duration::ZERO, |f| {
            f.saturating_duration_since(self.head.received)
        });
        Stats {
            done_reason: match reason {
                FinishReason::Length => "length",
                FinishReason::Stop | FinishReason::Abort => "stop",
            },
            total_duration: nanos(total),
            load_duration: 0,
            prompt_eval_count: usage.prompt_tokens,
            prompt_eval_duration: nanos(prompt),
            eval_count: usage.completion_tokens,
            eval_duration: nanos(total.saturating_sub(prompt)),
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A whole chat answer's text and calls; a call whose arguments are not
/// an object stays text, so nothing the model wrote is lost.
fn split_calls(format: Option<ToolFormat>, text: &str) -> (String, Vec<ToolCall>) {
    let Some(format) = format else {
        return (text.to_string(), Vec::new());
    };
    let answer = tools::parse_answer(format, text);
    let mut content = answer.content.unwrap_or_default();
    let mut calls = Vec::new();
    for call in answer.calls {
        match to_call(call) {
            Ok(c) => calls.push(c),
            Err(raw) => content.push_str(&raw),
        }
    }
    (content, calls)
}

/// A parsed call as Ollama's, or its arguments' text when they are not an
/// object.
fn to_call(call: tools::ParsedCall) -> Result<ToolCall, String> {
    match serde_json::from_str::<serde_json::Value>(&call.arguments) {
        Ok(arguments) if arguments.is_object() => Ok(ToolCall {
            function: FunctionCall {
                name: call.name,
                arguments,
            },
        }),
        _ => Err(call.arguments),
    }
}

impl Shape for Reply {
    fn stream(self, jobs: Vec<Job>, _: bool, delivery: sse::Delivery) -> Response {
        // The closing line goes out with each choice's end (it has the
        // counts), so no separate usage event.
        let lines = lines::Lines::new(self);
        let mut response = sse::stream_choices(Vec::new(), jobs, lines, false, delivery);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        );
        response
    }

    fn whole(self, results: &[ChoiceResult], usage: Usage) -> Response {
        let Some(r) = results.first() else {
            return ApiError::Internal("an answer without its choice".into()).into_response();
        };
        let (text, calls) = split_calls(self.tools, &r.text);
        let stats = self.stats(r.completion.reason, usage, None);
        Json(self.line(text, calls, Some(stats))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_split_from_text_and_bad_ones_stay_text() {
        let text = r#"<tool_call>{"name": "w", "arguments": {"city": "Paris"}}</tool_call>"#;
        let (content, calls) = split_calls(Some(ToolFormat::Hermes), text);
        assert_eq!(content, "");
        assert_eq!(calls[0].function.name, "w");
        assert_eq!(calls[0].function.arguments["city"], "Paris");
        let (content, calls) = split_calls(None, text);
        assert_eq!((content.as_str(), calls.len()), (text, 0));
    }
}
