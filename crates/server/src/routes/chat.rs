//! `POST /v1/chat/completions`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ingot_core::TokenId;
use ingot_engine::{Completion, GeneratedToken};
use ingot_protocol::chat::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, ChatCompletionChunk, ChatDelta,
    ChatLogprobs, ChatTurn, ValidChatRequest,
};
use ingot_protocol::sampling::ValidSampling;
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::tools::{FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta, ToolChoice};
use ingot_protocol::usage::Usage;
use ingot_protocol::ProtocolError;
use ingot_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use super::sse::Event;
use super::{json_body, sse, unknown_fields, Shared};
use crate::generate::{self, ChoiceResult, Job};
use crate::logprobs::resolve;
use crate::models::ModelFront;
use crate::prepare::{self, Head, Incoming, Shape, WireFormat};
use crate::reasoning::{self, Part, ReasoningSplitter};
use crate::tools::{self, Piece, ToolFormat, ToolStream};
use crate::ApiError;

/// Renders the conversation (with its tools, as the template or the
/// model's tool format wants them) and tokenizes it (runs on a blocking
/// thread).
pub(super) fn prompt_ids(
    req: &ValidChatRequest,
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
) -> Result<Vec<u32>, ApiError> {
    let text = render(req, template)?;
    tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// The conversation rendered by the chat template, tools included.
fn render(req: &ValidChatRequest, template: &ChatTemplate) -> Result<String, ApiError> {
    let mut messages: Vec<ChatMessage> = req
        .messages
        .iter()
        .map(to_message)
        .collect::<Result<_, _>>()?;
    let format = ToolFormat::from_template(template.source());
    let tools = tools::prepare(
        &mut messages,
        req.tool_config.as_ref(),
        req.tools.as_ref(),
        template.source(),
        format,
    );
    template
        .render_with_kwargs(
            &messages,
            req.add_generation_prompt,
            tools.as_ref(),
            &req.template_kwargs,
        )
        .map_err(|e| ApiError::BadRequest(ProtocolError::field("messages", e.to_string())))
}

/// Whether the answer's reasoning is split out, and if so whether the
/// prompt left `<think>` open (`Some(opened)`): with the model's reasoning
/// parser, unless a grammar shapes the answer from its first token.
fn reasoning_split(req: &ValidChatRequest, front: &ModelFront, prompt: &str) -> Option<bool> {
    let forced = req
        .tool_config
        .as_ref()
        .is_some_and(|t| is_forced(&t.choice));
    (front.splits_reasoning() && req.sampling.grammar.is_none() && !forced)
        .then(|| reasoning::opened_in_prompt(prompt))
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

/// The handler: parse, then the shared path (`prepare::generate`).
pub async fn chat_completions(
    State((state, limit)): State<Shared>,
    incoming: Incoming,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = ValidChatRequest::parse_with(&json_body(body, limit)?, unknown_fields(&state))?;
    prepare::generate(state, incoming, req).await
}

/// The format tool calls are parsed in, and the tool choice, when the
/// answer may hold calls (unless tool_choice is none).
pub(super) fn parsed_tools(
    req: &ValidChatRequest,
    template: &ChatTemplate,
) -> Option<(ToolFormat, ToolChoice)> {
    let format = ToolFormat::from_template(template.source());
    req.tool_config
        .as_ref()
        .filter(|t| t.choice != ToolChoice::None)
        .map(|t| (format, t.choice.clone()))
}

impl WireFormat for ValidChatRequest {
    const ENDPOINT: generate::Endpoint = generate::Endpoint::Chat;
    /// Whether the reasoning is split out, and from inside `<think>`.
    type Extra = Option<bool>;
    type Answer = Meta;

    fn sampling(&self) -> &ValidSampling {
        &self.sampling
    }

    fn grammar(&self, front: &ModelFront) -> Result<Option<OutputGrammar>, ApiError> {
        let format = ToolFormat::from_template(front.chat_template()?.source());
        Ok(self.sampling.grammar.clone().or_else(|| {
            self.tool_config
                .as_ref()
                .and_then(|t| tools::tool_grammar(format, t))
        }))
    }

    fn schemas(&self) -> Vec<crate::structured::SchemaCheck> {
        self.tool_config
            .as_ref()
            .map(tools::tool_schemas)
            .unwrap_or_default()
    }

    fn encode(&self, front: &ModelFront) -> Result<(Vec<Vec<TokenId>>, Option<bool>), ApiError> {
        let text = render(self, &*front.chat_template()?)?;
        let ids = front
            .tokenizer()?
            .encode(&text, false)
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        Ok((vec![ids], reasoning_split(self, front, &text)))
    }

    fn answer(self, head: Head, front: &ModelFront, reasoning: Option<bool>) -> Meta {
        let tools = front
            .chat_template()
            .ok()
            .and_then(|t| parsed_tools(&self, &t));
        Meta {
            head,
            tools,
            reasoning,
        }
    }
}

impl Shape for Meta {
    fn stream(self, jobs: Vec<Job>, include_usage: bool, delivery: sse::Delivery) -> Response {
        let meta = self;
        let usage = sse::ChunkUsage::at_start(include_usage, &delivery);
        // Every choice opens with the assistant role, as OpenAI does.
        let head: Vec<_> = jobs
            .iter()
            .map(|j| {
                let delta = ChatDelta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..ChatDelta::default()
                };
                let choice = ChatChunkChoice {
                    index: j.index,
                    delta,
                    logprobs: None,
                    finish_reason: None,
                };
                sse::data(&meta.chunk(vec![choice], usage))
            })
            .collect();
        let format = ChatChunks {
            streams: Default::default(),
            splitters: Default::default(),
            meta,
            usage,
        };
        sse::stream_choices(head, jobs, format, include_usage, delivery)
    }

    fn whole(self, results: &[ChoiceResult], usage: Usage) -> Response {
        let choices = results
            .iter()
            .map(|r| {
                let (message, finish_reason) = self.message(&r.text, r.completion.reason.as_str());
                ChatChoice {
                    index: r.index,
                    message,
                    logprobs: self.head.logprobs.then(|| ChatLogprobs {
                        content: r
                            .tokens
                            .iter()
                            .map(|t| (&resolve(&self.head.tokenizer, t)).into())
                            .collect(),
                        refusal: None,
                    }),
                    finish_reason: Some(finish_reason),
                }
            })
            .collect();
        Json(ChatCompletion {
            id: self.head.id,
            object: "chat.completion",
            created: self.head.created,
            model: self.head.model,
            choices,
            usage,
            system_fingerprint: None,
        })
        .into_response()
    }
}

/// What every chunk repeats.
pub struct Meta {
    head: Head,
    /// The format tool calls are parsed in, and the tool choice, when the
    /// answer may hold calls.
    tools: Option<(ToolFormat, ToolChoice)>,
    /// `Some(opened)`: the reasoning is split out, the answer starting
    /// inside `<think>` when the prompt opened it.
    reasoning: Option<bool>,
}

/// Whether the grammar made the whole answer calls: any text left over is
/// a call cut short by `max_tokens`, not content.
pub(super) fn is_forced(choice: &ToolChoice) -> bool {
    matches!(choice, ToolChoice::Required | ToolChoice::Named(_))
}

/// A whole answer's text and calls under `tools` (the format calls are
/// parsed in and the tool choice, when the answer may hold calls): with a
/// forced choice, text beside the calls is a call cut short and is
/// dropped.
pub(super) fn split_answer(tools: Option<&(ToolFormat, ToolChoice)>, text: &str) -> tools::Answer {
    let Some((format, choice)) = tools else {
        return tools::Answer {
            content: Some(text.to_string()),
            calls: Vec::new(),
        };
    };
    let mut answer = tools::parse_answer(*format, text);
    if !answer.calls.is_empty() && is_forced(choice) {
        answer.content = None;
    }
    answer
}

/// OpenAI's finish reason of an answer that called tools (a forced,
/// named call finishes with "stop", as OpenAI's do).
fn finish_with_calls(choice: &ToolChoice, reason: &'static str) -> &'static str {
    match (choice, reason) {
        (ToolChoice::Named(_), _) | (_, "length") | (_, "abort") => reason,
        _ => "tool_calls",
    }
}

impl Meta {
    /// The assistant message of a whole answer, and its finish reason.
    fn message(&self, text: &str, reason: &'static str) -> (AssistantMessage, &'static str) {
        let (reasoning_content, text) = match self.reasoning {
            Some(opened) => reasoning::split(text, opened),
            None => (None, text.to_string()),
        };
        // An answer that is only reasoning has no content, as vLLM's.
        let content = (!text.is_empty() || reasoning_content.is_none()).then(|| text.clone());
        let plain = |content| AssistantMessage {
            role: "assistant",
            content,
            refusal: None,
            reasoning_content: reasoning_content.clone(),
            tool_calls: None,
        };
        let Some((format, choice)) = &self.tools else {
            return (plain(content), reason);
        };
        let answer = tools::parse_answer(*format, &text);
        if answer.calls.is_empty() {
            return (plain(content), reason);
        }
        let calls = answer
            .calls
            .into_iter()
            .map(|c| ToolCall {
                id: tools::call_id(),
                kind: "function",
                function: FunctionCall {
                    name: c.name,
                    arguments: c.arguments,
                },
            })
            .collect();
        let message = AssistantMessage {
            role: "assistant",
            content: answer.content.filter(|_| !is_forced(choice)),
            refusal: None,
            reasoning_content,
            tool_calls: Some(calls),
        };
        (message, finish_with_calls(choice, reason))
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: sse::ChunkUsage) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk",
            created: self.head.created,
            model: self.head.model.clone(),
            choices,
            usage: usage.field(),
            system_fingerprint: None,
        }
    }
}

struct ChatChunks {
    meta: Meta,
    usage: sse::ChunkUsage,
    /// Each choice's tool-call parser (when tools are parsed), and how
    /// many calls it has sent.
    streams: std::collections::HashMap<usize, (ToolStream, usize)>,
    /// Each choice's reasoning splitter (with a reasoning parser).
    splitters: std::collections::HashMap<usize, ReasoningSplitter>,
}

impl ChatChunks {
    fn choice(&self, index: usize, delta: ChatDelta, logprobs: Option<ChatLogprobs>) -> Event {
        let choice = ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: None,
        };
        sse::data(&self.meta.chunk(vec![choice], self.usage))
    }

    /// Chunks for parsed pieces: content as text deltas, each call as a
    /// delta with its id and name, then one with its arguments.
    fn pieces(
        &mut self,
        index: usize,
        pieces: Vec<Piece>,
        mut logprobs: Option<ChatLogprobs>,
    ) -> Vec<Event> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Content(_) if self.meta.tools.as_ref().is_some_and(|t| is_forced(&t.1)) => {}
                Piece::Content(text) => {
                    let delta = ChatDelta {
                        content: Some(text),
                        ..ChatDelta::default()
                    };
                    out.push(self.choice(index, delta, logprobs.take()));
                }
                Piece::Call(call) => {
                    let n = self.streams.get_mut(&index).map_or(0, |s| {
                        s.1 += 1;
                        s.1 - 1
                    });
                    let head = ToolCallDelta {
                        index: n,
                        id: Some(tools::call_id()),
                        kind: Some("function"),
                        function: FunctionCallDelta {
                            name: Some(call.name),
                            arguments: Some(String::new()),
                        },
                    };
                    let args = ToolCallDelta {
                        index: n,
                        id: None,
                        kind: None,
                        function: FunctionCallDelta {
                            name: None,
                            arguments: Some(call.arguments),
                        },
                    };
                    for (d, lp) in [(head, logprobs.take()), (args, None)] {
                        let delta = ChatDelta {
                            tool_calls: Some(vec![d]),
                            ..ChatDelta::default()
                        };
                        out.push(self.choice(index, delta, lp));
                    }
                }
            }
        }
        if let Some(lp) = logprobs {
            // A token held back (it may start a call) still reports its logprob.
            out.push(self.choice(index, ChatDelta::default(), Some(lp)));
        }
        out
    }
}

impl ChatChunks {
    /// Chunks for answer text (after any reasoning): through the tool-call
    /// parser when calls are parsed.
    fn content(&mut self, index: usize, text: &str, logprobs: Option<ChatLogprobs>) -> Vec<Event> {
        if let Some((format, _)) = &self.meta.tools {
            let format = *format;
            let stream = self
                .streams
                .entry(index)
                .or_insert_with(|| (ToolStream::new(format), 0));
            let pieces = stream.0.push(text);
            return self.pieces(index, pieces, logprobs);
        }
        if text.is_empty() && logprobs.is_none() {
            return Vec::new();
        }
        let delta = ChatDelta {
            content: Some(text.to_string()),
            ..ChatDelta::default()
        };
        vec![self.choice(index, delta, logprobs)]
    }

    /// Chunks for split parts: reasoning as `reasoning_content` deltas,
    /// the rest as content. A token's logprobs go with its first chunk.
    fn parts(
        &mut self,
        index: usize,
        parts: Vec<Part>,
        mut logprobs: Option<ChatLogprobs>,
    ) -> Vec<Event> {
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Reasoning(text) => {
                    let delta = ChatDelta {
                        reasoning_content: Some(text),
                        ..ChatDelta::default()
                    };
                    out.push(self.choice(index, delta, logprobs.take()));
                }
                Part::Content(text) => out.extend(self.content(index, &text, logprobs.take())),
            }
        }
        if let Some(lp) = logprobs {
            // A token held back (it may start a tag) still reports its logprob.
            out.push(self.choice(index, ChatDelta::default(), Some(lp)));
        }
        out
    }
}

impl sse::ChunkFormat for ChatChunks {
    fn token(&mut self, index: usize, token: GeneratedToken) -> Option<Event> {
        let m = &self.meta;
        let logprobs = m.head.logprobs.then(|| ChatLogprobs {
            content: vec![(&resolve(&m.head.tokenizer, &token)).into()],
            refusal: None,
        });
        let events = match m.reasoning {
            Some(opened) => {
                let parts = self
                    .splitters
                    .entry(index)
                    .or_insert_with(|| ReasoningSplitter::new(opened))
                    .push(&token.text);
                self.parts(index, parts, logprobs)
            }
            None => self.content(index, &token.text, logprobs),
        };
        sse::concat(events)
    }

    fn finish(&mut self, index: usize, completion: &Completion) -> Event {
        let mut events = Vec::new();
        let mut reason = completion.reason.as_str();
        if let Some(opened) = self.meta.reasoning {
            let parts = self
                .splitters
                .entry(index)
                .or_insert_with(|| ReasoningSplitter::new(opened))
                .finish();
            events = self.parts(index, parts, None);
        }
        if let Some((format, choice)) = self.meta.tools.clone() {
            let stream = self
                .streams
                .entry(index)
                .or_insert_with(|| (ToolStream::new(format), 0));
            let pieces = stream.0.finish();
            events.extend(self.pieces(index, pieces, None));
            if self.streams.get(&index).is_some_and(|s| s.1 > 0) {
                reason = finish_with_calls(&choice, reason);
            }
        }
        let choice = ChatChunkChoice {
            index,
            delta: ChatDelta::default(),
            logprobs: None,
            finish_reason: Some(reason),
        };
        events.push(sse::data(&self.meta.chunk(vec![choice], self.usage)));
        sse::concat(events).unwrap_or_else(|| sse::data(&serde_json::json!({})))
    }

    fn usage(&self, usage: Usage) -> Event {
        let mut chunk = self.meta.chunk(Vec::new(), self.usage);
        chunk.usage = Some(Some(usage));
        sse::data(&chunk)
    }

    fn running_usage(&mut self, usage: Usage) {
        self.usage.running = Some(usage);
    }
}
