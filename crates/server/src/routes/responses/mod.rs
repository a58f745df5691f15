//! OpenAI's Responses API on the shared path (`prepare::generate`):
//! `POST /v1/responses` maps onto a chat request
//! (`ingot_protocol::responses`), so it is rendered, sampled, constrained
//! and tool-called exactly as chat is; this module shapes the answer as a
//! response object, whole or as its SSE events (`stream`), and keeps it
//! (`store`) for `GET` / `DELETE /v1/responses/{id}` and for
//! `previous_response_id`, in memory, per tenant (`store`).

mod store;
mod stream;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use ingot_core::{FinishReason, TokenId};
use ingot_edge::Caller;
use ingot_protocol::responses::{
    self as wire, Deleted, Echo, IncompleteDetails, OutputItem, OutputText, ReasoningText,
    ResponseUsage, ResponsesRequest,
};
use ingot_protocol::sampling::ValidSampling;
use ingot_protocol::structured::OutputGrammar;
use ingot_protocol::tools::ToolChoice;
use ingot_protocol::usage::Usage;
use ingot_protocol::ProtocolError;
use serde_json::Value;

pub use store::ResponseStore;
use store::Stored;

use super::{json_body, sse, Shared};
use crate::generate::{self, ChoiceResult, Job};
use crate::models::ModelFront;
use crate::prepare::{self, Head, Incoming, Shape, WireFormat};
use crate::reasoning;
use crate::tools::{self, ToolFormat};
use crate::{ApiError, AppState};

/// `POST /v1/responses`: parse, put the previous response's conversation
/// first, then the shared path.
pub async fn create(
    State((state, limit)): State<Shared>,
    incoming: Incoming,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = json_body(body, limit)?;
    let mut request = ResponsesRequest::parse_with(&body, super::unknown_fields(&state))?;
    let scope = scope(incoming.caller());
    let mut history = Vec::new();
    if let Some(id) = &request.previous_response_id {
        let previous = state
            .responses()
            .get(&scope, id)
            .ok_or_else(|| ApiError::NotFound {
                message: format!("Previous response with id '{id}' not found."),
                param: Some("previous_response_id"),
                code: Some("previous_response_not_found"),
            })?;
        history.clone_from(&previous.context);
        request.with_history(&history)?;
    }
    let store = request.store.then(|| Keep {
        store: state.clone(),
        scope,
    });
    let create = Create {
        request,
        history,
        store,
    };
    // The engine names the prompt `messages` (chat's); here it is `input`.
    prepare::generate(state, incoming, create)
        .await
        .map_err(|e| match e {
            ApiError::BadRequest(mut p) if p.param.as_deref() == Some("messages") => {
                p.param = Some("input".into());
                ApiError::BadRequest(p)
            }
            other => other,
        })
}

/// `GET /v1/responses/{id}`: a stored response, as it was answered.
pub async fn retrieve(
    State((state, _)): State<Shared>,
    incoming: Incoming,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    refuse_query(query.as_deref())?;
    let stored = state
        .responses()
        .get(&scope(incoming.caller()), &id)
        .ok_or_else(|| not_found(&id))?;
    Ok(Json(stored.response.clone()).into_response())
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State((state, _)): State<Shared>,
    incoming: Incoming,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !state.responses().remove(&scope(incoming.caller()), &id) {
        return Err(not_found(&id));
    }
    let deleted = Deleted {
        id,
        object: "response",
        deleted: true,
    };
    Ok(Json(deleted).into_response())
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound {
        message: format!("Response with id '{id}' not found."),
        param: None,
        code: None,
    }
}

/// Refuses what `GET` cannot do: replay a stream (`stream=true`,
/// `starting_after`) or add outputs (`include`).
fn refuse_query(query: Option<&str>) -> Result<(), ApiError> {
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let refused = match name {
            "stream" => value != "false",
            "include_obfuscation" => value == "true",
            _ => true,
        };
        if refused {
            let name = name.trim_end_matches("[]");
            return Err(ApiError::BadRequest(ProtocolError::field(
                name,
                format!("{name}: this query parameter is not supported by this server (a stored response is answered whole)"),
            )));
        }
    }
    Ok(())
}

/// Whose stored responses a caller sees: its key's tenant, else its key,
/// else everyone's (auth off).
fn scope(caller: &Caller) -> String {
    match caller.key() {
        Some(k) => match &k.tenant {
            Some(t) => format!("tenant:{t}"),
            None => format!("key:{}", k.id),
        },
        None => String::new(),
    }
}

/// Where an answer is kept.
struct Keep {
    store: AppState,
    scope: String,
}

/// A request on its way through the shared path.
pub struct Create {
    request: ResponsesRequest,
    /// The previous response's conversation.
    history: Vec<Value>,
    store: Option<Keep>,
}

impl WireFormat for Create {
    const ENDPOINT: generate::Endpoint = generate::Endpoint::Chat;
    /// Whether the reasoning is split out, and from inside `<think>`.
    type Extra = Option<bool>;
    type Answer = Reply;

    fn sampling(&self) -> &ValidSampling {
        &self.request.chat.sampling
    }

    fn grammar(&self, front: &ModelFront) -> Result<Option<OutputGrammar>, ApiError> {
        self.request.chat.grammar(front)
    }

    fn schemas(&self) -> Vec<crate::structured::SchemaCheck> {
        self.request.chat.schemas()
    }

    fn encode(&self, front: &ModelFront) -> Result<(Vec<Vec<TokenId>>, Option<bool>), ApiError> {
        self.request.chat.encode(front)
    }

    fn answer(self, head: Head, front: &ModelFront, reasoning: Option<bool>) -> Reply {
        let tools = front
            .chat_template()
            .ok()
            .and_then(|t| super::chat::parsed_tools(&self.request.chat, &t));
        let mut context = self.history;
        context.extend(self.request.input);
        Reply {
            id: head.id.replacen("chatcmpl-", "resp_", 1),
            head,
            tools,
            reasoning,
            echo: self.request.echo,
            previous_response_id: self.request.previous_response_id,
            store: self.store,
            context,
        }
    }
}

/// What shaping (and keeping) an answer needs.
pub struct Reply {
    /// `resp_…`.
    id: String,
    head: Head,
    /// The format tool calls are parsed in, and the tool choice, when the
    /// answer may hold calls.
    tools: Option<(ToolFormat, ToolChoice)>,
    /// `Some(opened)`: the reasoning becomes a reasoning item, the answer
    /// starting inside `<think>` when the prompt opened it.
    reasoning: Option<bool>,
    echo: Echo,
    previous_response_id: Option<String>,
    store: Option<Keep>,
    /// The conversation before the answer.
    context: Vec<Value>,
}

impl Reply {
    /// The response object: `output` so far, with `usage` once it ended.
    fn response(
        &self,
        status: &'static str,
        output: Vec<OutputItem>,
        usage: Option<Usage>,
    ) -> wire::Response {
        wire::Response {
            id: self.id.clone(),
            object: "response",
            created_at: self.head.created,
            status,
            completed_at: (status == "completed").then(super::unix_now),
            error: None,
            incomplete_details: (status == "incomplete").then_some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
            model: self.head.model.clone(),
            output,
            previous_response_id: self.previous_response_id.clone(),
            reasoning: None,
            store: self.store.is_some(),
            truncation: "disabled",
            service_tier: "default",
            usage: usage.map(ResponseUsage::from),
            echo: self.echo.clone(),
        }
    }

    /// Whether the grammar made the whole answer calls (so left-over text
    /// is a call cut short, not content).
    fn forced(&self) -> bool {
        self.tools
            .as_ref()
            .is_some_and(|t| super::chat::is_forced(&t.1))
    }

    /// Keeps a finished response (with `store`); answers its JSON.
    fn keep(&self, response: &wire::Response) -> Value {
        let json = serde_json::to_value(response).unwrap_or(Value::Null);
        if let Some(keep) = &self.store {
            let mut context = self.context.clone();
            context.extend(wire::output_messages(&response.output));
            let stored = Stored {
                response: json.clone(),
                context,
            };
            if !keep.store.responses().insert(&keep.scope, &self.id, stored) {
                tracing::warn!(id = %self.id, "a response too large to store was not stored");
            }
        }
        json
    }
}

/// The status of an answer that ended for `reason`.
fn status(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// `msg_…`, `fc_…`: an item id.
fn item_id(prefix: &str) -> String {
    super::response_id(prefix).replacen('-', "_", 1)
}

/// A message item holding `text`.
fn message_item(id: String, status: &'static str, text: String) -> OutputItem {
    OutputItem::Message {
        id,
        status,
        role: "assistant",
        content: vec![OutputText::new(text)],
    }
}

/// A reasoning item holding `text`.
fn reasoning_item(id: String, status: &'static str, text: String) -> OutputItem {
    OutputItem::Reasoning {
        id,
        summary: Vec::new(),
        content: vec![ReasoningText::new(text)],
        status,
    }
}

/// A function call item.
fn call_item(call: tools::ParsedCall, status: &'static str) -> OutputItem {
    OutputItem::FunctionCall {
        id: item_id("fc"),
        call_id: tools::call_id(),
        name: call.name,
        arguments: call.arguments,
        status,
    }
}

impl Shape for Reply {
    fn stream(self, jobs: Vec<Job>, _: bool, delivery: sse::Delivery) -> Response {
        // The usage hook sends the closing `response.completed`, so it is on.
        let (head, events) = stream::Events::start(self);
        sse::stream_choices(head, jobs, events, true, delivery)
    }

    fn whole(self, results: &[ChoiceResult], usage: Usage) -> Response {
        let Some(r) = results.first() else {
            return ApiError::Internal("a response without its choice".into()).into_response();
        };
        let status = status(r.completion.reason);
        let mut output = Vec::new();
        let (thought, text) = match self.reasoning {
            Some(opened) => reasoning::split(&r.text, opened),
            None => (None, r.text.clone()),
        };
        if let Some(thought) = thought {
            output.push(reasoning_item(item_id("rs"), "completed", thought));
        }
        let answer = super::chat::split_answer(self.tools.as_ref(), &text);
        // Text makes a message; an answer with nothing else is one empty
        // message (as streamed).
        let text = answer.content.unwrap_or_default();
        if !text.is_empty() || (output.is_empty() && answer.calls.is_empty()) {
            output.push(message_item(item_id("msg"), status, text));
        }
        output.extend(answer.calls.into_iter().map(|c| call_item(c, "completed")));
        let response = self.response(status, output, Some(usage));
        Json(self.keep(&response)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_refuses_what_it_cannot_replay() {
        assert!(refuse_query(None).is_ok());
        assert!(refuse_query(Some("stream=false&include_obfuscation=false")).is_ok());
        for (query, param) in [
            ("stream=true", "stream"),
            ("include[]=message.output_text.logprobs", "include"),
            ("starting_after=3", "starting_after"),
        ] {
            let Err(ApiError::BadRequest(e)) = refuse_query(Some(query)) else {
                panic!("{query} was not refused");
            };
            assert_eq!(e.param.as_deref(), Some(param));
        }
    }

    #[test]
    fn item_ids_have_their_prefix() {
        assert!(item_id("msg").starts_with("msg_"));
        assert!(item_id("fc").starts_with("fc_"));
        assert_eq!(status(FinishReason::Length), "incomplete");
        assert_eq!(status(FinishReason::Stop), "completed");
    }
}
