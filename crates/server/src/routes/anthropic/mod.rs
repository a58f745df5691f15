//! `POST /v1/messages`: Anthropic's Messages API on the shared path
//! (`prepare::generate`). The request maps onto a chat request
//! (`ingot_protocol::anthropic`), so its prompt is rendered, sampled and
//! tool-called exactly as chat's is; this module shapes the answer as
//! Anthropic's message, whole or as its SSE events (`stream`). Errors are
//! reshaped into Anthropic's body at the edge (`super::dialect`).

mod stream;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ingot_core::{FinishReason, TokenId};
use ingot_protocol::anthropic::{ContentBlock, Message, MessageUsage, MessagesRequest};
use ingot_protocol::sampling::ValidSampling;
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::tools::ToolChoice;
use ingot_protocol::usage::Usage;

use super::{json_body, sse, Shared};
use crate::generate::{self, ChoiceResult, Job};
use crate::models::ModelFront;
use crate::prepare::{self, Head, Incoming, Shape, WireFormat};
use crate::tools::{self, ToolFormat};
use crate::ApiError;

/// The handler: parse, then the shared path.
pub async fn messages(
    State((state, limit)): State<Shared>,
    incoming: Incoming,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = MessagesRequest::parse(&json_body(body, limit)?)?;
    prepare::generate(state, incoming, req).await
}

impl WireFormat for MessagesRequest {
    const ENDPOINT: generate::Endpoint = generate::Endpoint::Chat;
    /// The prompt's length (`message_start` reports it).
    type Extra = usize;
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

    fn encode(&self, front: &ModelFront) -> Result<(Vec<Vec<TokenId>>, usize), ApiError> {
        // The answer's text as the model wrote it: Anthropic's thinking
        // blocks (asked for with `thinking`) are not served.
        let (ids, _) = self.chat.encode(front)?;
        let prompt_tokens = ids.iter().map(Vec::len).sum();
        Ok((ids, prompt_tokens))
    }

    fn answer(self, head: Head, front: &ModelFront, prompt_tokens: usize) -> Reply {
        let tools = front
            .chat_template()
            .ok()
            .and_then(|t| super::chat::parsed_tools(&self.chat, &t));
        Reply {
            id: head.id.replacen("chatcmpl-", "msg_", 1),
            head,
            tools,
            stops: self.stop_sequences,
            prompt_tokens,
        }
    }
}

/// What shaping an answer needs.
pub struct Reply {
    /// `msg_…`.
    id: String,
    head: Head,
    /// The format tool calls are parsed in, and the tool choice, when the
    /// answer may hold calls.
    tools: Option<(ToolFormat, ToolChoice)>,
    /// `stop_sequences`.
    stops: Vec<String>,
    prompt_tokens: usize,
}

/// Why an answer ended, as Anthropic says it, and the stop sequence that
/// ended it.
type Stop = (&'static str, Option<String>);

impl Reply {
    /// The message holding `content`, ended by `stop` (`message_start`
    /// has neither yet).
    fn message(
        &self,
        content: Vec<ContentBlock>,
        stop: Option<Stop>,
        usage: MessageUsage,
    ) -> Message {
        let (stop_reason, stop_sequence) = stop.map_or((None, None), |(r, s)| (Some(r), s));
        Message {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.head.model.clone(),
            content,
            stop_reason,
            stop_sequence,
            usage,
        }
    }

    /// Whether the grammar made the whole answer calls (so left-over text
    /// is a call cut short, not content).
    fn forced(&self) -> bool {
        forced(self.tools.as_ref())
    }

    /// Why the answer ended: a call, `max_tokens`, the end of its turn (an
    /// end-of-sequence token) or one of `stop_sequences` (found in the
    /// decoded output: the engine stops at the first occurrence of any).
    fn stop(&self, reason: FinishReason, ids: &[TokenId], called: bool) -> Stop {
        match reason {
            FinishReason::Length => ("max_tokens", None),
            _ if called => ("tool_use", None),
            FinishReason::Stop if !self.stops.is_empty() => {
                let ended = ids
                    .last()
                    .is_some_and(|t| self.head.tokenizer.eos_ids().contains(t));
                let text = if ended {
                    None
                } else {
                    self.head.tokenizer.decode(ids, false).ok()
                };
                match text.and_then(|t| first_stop(&self.stops, &t)) {
                    Some(s) => ("stop_sequence", Some(s)),
                    None => ("end_turn", None),
                }
            }
            _ => ("end_turn", None),
        }
    }
}

fn forced(tools: Option<&(ToolFormat, ToolChoice)>) -> bool {
    tools.is_some_and(|t| super::chat::is_forced(&t.1))
}

/// A whole answer's blocks: its text, then its calls; and whether it
/// called a tool.
fn content_blocks(
    tools: Option<&(ToolFormat, ToolChoice)>,
    text: &str,
) -> (Vec<ContentBlock>, bool) {
    let answer = super::chat::split_answer(tools, text);
    let called = !answer.calls.is_empty();
    let mut blocks = Vec::new();
    if let Some(content) = answer.content {
        blocks.push(ContentBlock::Text { text: content });
    }
    blocks.extend(
        answer
            .calls
            .into_iter()
            .map(|c| tool_use(c.name, &c.arguments)),
    );
    (blocks, called)
}

/// The stop sequence occurring first in `text`.
fn first_stop(stops: &[String], text: &str) -> Option<String> {
    stops
        .iter()
        .filter_map(|s| text.find(s.as_str()).map(|at| (at, s)))
        .min_by_key(|(at, _)| *at)
        .map(|(_, s)| s.clone())
}

/// A call as a `tool_use` block; arguments that are not a JSON object (a
/// call the model wrote badly) stay text, so nothing it wrote is lost.
fn tool_use(name: String, arguments: &str) -> ContentBlock {
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(input) if input.is_object() => ContentBlock::ToolUse {
            id: tool_id(),
            name,
            input,
        },
        _ => ContentBlock::Text {
            text: arguments.to_string(),
        },
    }
}

/// A new `toolu_…` id.
fn tool_id() -> String {
    tools::call_id().replacen("call_", "toolu_", 1)
}

impl Shape for Reply {
    fn stream(self, jobs: Vec<Job>, _: bool, delivery: sse::Delivery) -> Response {
        // The usage hook sends the closing `message_delta`, so it is on.
        let (head, events) = stream::Events::start(self);
        sse::stream_choices(head, jobs, events, true, delivery)
    }

    fn whole(self, results: &[ChoiceResult], usage: Usage) -> Response {
        let Some(r) = results.first() else {
            return ApiError::Internal("a message without its choice".into()).into_response();
        };
        let (content, called) = content_blocks(self.tools.as_ref(), &r.text);
        let ids: Vec<TokenId> = r.tokens.iter().map(|t| t.token).collect();
        let stop = self.stop(r.completion.reason, &ids, called);
        let usage = MessageUsage {
            input_tokens: usage.prompt_tokens,
            output_tokens: usage.completion_tokens,
        };
        Json(self.message(content, Some(stop), usage)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_stop_in_the_text_is_the_one_that_ended_it() {
        let stops = ["END".to_string(), "##".to_string()];
        assert_eq!(first_stop(&stops, "a ## b END").as_deref(), Some("##"));
        assert_eq!(first_stop(&stops, "nothing"), None);
    }

    #[test]
    fn a_whole_answer_splits_into_text_and_tool_use() {
        let tools = (ToolFormat::Hermes, ToolChoice::Auto);
        let text = r#"Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>"#;
        let (blocks, called) = content_blocks(Some(&tools), text);
        assert!(called);
        assert_eq!(
            blocks[0],
            ContentBlock::Text {
                text: "Checking.".into()
            }
        );
        assert!(
            matches!(&blocks[1], ContentBlock::ToolUse { name, input, .. } if name == "get_weather" && input["city"] == "Paris")
        );
        let forced = (ToolFormat::Hermes, ToolChoice::Required);
        let (blocks, _) = content_blocks(Some(&forced), text);
        assert_eq!(blocks.len(), 1, "a forced answer is only its calls");
        let (plain, called) = content_blocks(None, "Hi");
        assert_eq!(
            (plain, called),
            (vec![ContentBlock::Text { text: "Hi".into() }], false)
        );
    }

    #[test]
    fn calls_with_object_arguments_become_tool_use() {
        let block = tool_use("f".into(), r#"{"x":1}"#);
        assert!(
            matches!(&block, ContentBlock::ToolUse { id, input, .. } if id.starts_with("toolu_") && input["x"] == 1)
        );
        let kept = tool_use("f".into(), "[1]");
        assert_eq!(kept, ContentBlock::Text { text: "[1]".into() });
    }
}
