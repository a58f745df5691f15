//! A response as the Responses API's SSE events, each numbered
//! (`sequence_number`): `response.created` and `response.in_progress`,
//! then per output item `response.output_item.added`, its content
//! (`response.content_part.added`, `response.output_text.delta`…,
//! `response.output_text.done`, `response.content_part.done`, a call's
//! `response.function_call_arguments.delta` and `.done`, or a reasoning
//! item's `response.reasoning_text.delta`… and `.done`) and
//! `response.output_item.done`, then `response.completed` (or
//! `response.incomplete` when cut at `max_output_tokens`). A failure after
//! the head is an `error` event and `response.failed`. No `[DONE]`.

use std::cell::Cell;

use ingot_core::FinishReason;
use ingot_engine::{Completion, GeneratedToken};
use ingot_protocol::responses::{OutputItem, OutputText, ResponseError, Sequenced, StreamEvent};
use ingot_protocol::usage::Usage;

use super::super::dialect::error_field;
use super::super::sse::{self, Event};
use super::{call_item, item_id, message_item, reasoning_item, status, Reply};
use crate::reasoning::{Part, ReasoningSplitter};
use crate::tools::{Piece, Pieces};

/// The stream's state (one choice: the Responses API has no `n`).
pub struct Events {
    reply: Reply,
    /// The reasoning split from the answer (with a reasoning parser).
    splitter: Option<ReasoningSplitter>,
    /// The answer's text and calls.
    parser: Pieces,
    items: Items,
    /// Why it ended, once it has.
    reason: Option<FinishReason>,
    /// The next event's number.
    sequence: Cell<u64>,
}

impl Events {
    /// The head events and the state that follows them.
    pub fn start(reply: Reply) -> (Vec<Event>, Self) {
        let parser = Pieces::new(reply.tools.as_ref().map(|t| t.0));
        let state = Self {
            items: Items::new(reply.forced()),
            splitter: reply.reasoning.map(ReasoningSplitter::new),
            reply,
            parser,
            reason: None,
            sequence: Cell::new(0),
        };
        let response = Box::new(state.reply.response("in_progress", Vec::new(), None));
        let head = vec![
            state.event(&StreamEvent::Created {
                response: response.clone(),
            }),
            state.event(&StreamEvent::InProgress { response }),
        ];
        (head, state)
    }

    /// `e`, framed and numbered.
    fn event(&self, e: &StreamEvent) -> Event {
        let sequence_number = self.sequence.get();
        self.sequence.set(sequence_number + 1);
        sse::named(
            e.name(),
            &Sequenced {
                event: e,
                sequence_number,
            },
        )
    }

    fn events(&self, list: &[StreamEvent]) -> Option<Event> {
        sse::concat(list.iter().map(|e| self.event(e)).collect())
    }

    /// The events for split parts: reasoning into the reasoning item, the
    /// rest through the tool-call parser.
    fn parts(&mut self, parts: Vec<Part>) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Reasoning(text) => out.extend(self.items.reasoning(text)),
                Part::Content(text) => {
                    let pieces = self.parser.push(text);
                    out.extend(self.items.pieces(pieces));
                }
            }
        }
        out
    }
}

/// Turns parsed pieces into output items: text into the open message
/// (opened on demand), each call an item of its own.
#[derive(Debug, Default)]
struct Items {
    /// The finished items.
    done: Vec<OutputItem>,
    /// The open message: its id and text so far.
    open: Option<(String, String)>,
    /// The open reasoning item: its id and text so far.
    thinking: Option<(String, String)>,
    /// The grammar made the whole answer calls: text is a call cut short.
    forced: bool,
}

impl Items {
    fn new(forced: bool) -> Self {
        Self {
            forced,
            ..Self::default()
        }
    }

    /// The open message's index in `output`.
    fn index(&self) -> usize {
        self.done.len()
    }

    /// More reasoning: opens the reasoning item on the first.
    fn reasoning(&mut self, delta: String) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        let output_index = self.index();
        let (id, text) = self.thinking.get_or_insert_with(|| {
            let id = item_id("rs");
            let item = OutputItem::Reasoning {
                id: id.clone(),
                summary: Vec::new(),
                content: Vec::new(),
                status: "in_progress",
            };
            out.push(StreamEvent::OutputItemAdded { output_index, item });
            (id, String::new())
        });
        text.push_str(&delta);
        out.push(StreamEvent::ReasoningTextDelta {
            item_id: id.clone(),
            output_index,
            content_index: 0,
            delta,
        });
        out
    }

    /// Closes the reasoning item, once the answer goes on past it.
    fn close_reasoning(&mut self) -> Vec<StreamEvent> {
        let Some((id, text)) = self.thinking.take() else {
            return Vec::new();
        };
        let output_index = self.index();
        let item = reasoning_item(id.clone(), "completed", text.clone());
        self.done.push(item.clone());
        vec![
            StreamEvent::ReasoningTextDone {
                item_id: id,
                output_index,
                content_index: 0,
                text,
            },
            StreamEvent::OutputItemDone { output_index, item },
        ]
    }

    fn pieces(&mut self, pieces: Vec<Piece>) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        for piece in pieces {
            if !matches!(&piece, Piece::Content(t) if t.is_empty() || self.forced) {
                out.extend(self.close_reasoning());
            }
            match piece {
                Piece::Content(text) if text.is_empty() || self.forced => {}
                Piece::Content(delta) => {
                    self.open_message(&mut out);
                    let output_index = self.index();
                    if let Some((id, text)) = &mut self.open {
                        text.push_str(&delta);
                        out.push(StreamEvent::OutputTextDelta {
                            item_id: id.clone(),
                            output_index,
                            content_index: 0,
                            delta,
                            logprobs: Vec::new(),
                        });
                    }
                }
                Piece::Call(call) => {
                    out.extend(self.close("completed"));
                    let output_index = self.index();
                    let item = call_item(call, "completed");
                    let OutputItem::FunctionCall {
                        id,
                        name,
                        arguments,
                        ..
                    } = &item
                    else {
                        continue;
                    };
                    let mut added = item.clone();
                    if let OutputItem::FunctionCall {
                        arguments, status, ..
                    } = &mut added
                    {
                        arguments.clear();
                        *status = "in_progress";
                    }
                    out.push(StreamEvent::OutputItemAdded {
                        output_index,
                        item: added,
                    });
                    out.push(StreamEvent::FunctionCallArgumentsDelta {
                        item_id: id.clone(),
                        output_index,
                        delta: arguments.clone(),
                    });
                    out.push(StreamEvent::FunctionCallArgumentsDone {
                        item_id: id.clone(),
                        output_index,
                        name: name.clone(),
                        arguments: arguments.clone(),
                    });
                    out.push(StreamEvent::OutputItemDone {
                        output_index,
                        item: item.clone(),
                    });
                    self.done.push(item);
                }
            }
        }
        out
    }

    /// Opens a message (its item and its one text part) unless one is.
    fn open_message(&mut self, out: &mut Vec<StreamEvent>) {
        if self.open.is_some() {
            return;
        }
        let output_index = self.index();
        let id = item_id("msg");
        out.push(StreamEvent::OutputItemAdded {
            output_index,
            item: OutputItem::Message {
                id: id.clone(),
                status: "in_progress",
                role: "assistant",
                content: Vec::new(),
            },
        });
        out.push(StreamEvent::ContentPartAdded {
            item_id: id.clone(),
            output_index,
            content_index: 0,
            part: OutputText::new(String::new()),
        });
        self.open = Some((id, String::new()));
    }

    /// Closes the open message with `status`.
    fn close(&mut self, status: &'static str) -> Vec<StreamEvent> {
        let Some((id, text)) = self.open.take() else {
            return Vec::new();
        };
        let output_index = self.index();
        let item = message_item(id.clone(), status, text.clone());
        let part = OutputText::new(text.clone());
        let events = vec![
            StreamEvent::OutputTextDone {
                item_id: id.clone(),
                output_index,
                content_index: 0,
                text,
                logprobs: Vec::new(),
            },
            StreamEvent::ContentPartDone {
                item_id: id,
                output_index,
                content_index: 0,
                part,
            },
            StreamEvent::OutputItemDone {
                output_index,
                item: item.clone(),
            },
        ];
        self.done.push(item);
        events
    }
}

impl sse::ChunkFormat for Events {
    fn token(&mut self, _: usize, token: GeneratedToken) -> Option<Event> {
        let list = match &mut self.splitter {
            Some(splitter) => {
                let parts = splitter.push(&token.text);
                self.parts(parts)
            }
            None => {
                let pieces = self.parser.push(token.text);
                self.items.pieces(pieces)
            }
        };
        self.events(&list)
    }

    fn finish(&mut self, _: usize, completion: &Completion) -> Event {
        let parts = self.splitter.as_mut().map(ReasoningSplitter::finish);
        let mut list = self.parts(parts.unwrap_or_default());
        let rest = self.parser.finish();
        list.extend(self.items.pieces(rest));
        list.extend(self.items.close_reasoning());
        if self.items.done.is_empty() {
            // An empty answer is still one (empty) message, as whole.
            self.items.open_message(&mut list);
        }
        list.extend(self.items.close(status(completion.reason)));
        self.reason = Some(completion.reason);
        // Never empty: the answer's last item closes here.
        self.events(&list)
            .unwrap_or_else(|| sse::data(&serde_json::json!({})))
    }

    fn usage(&self, usage: Usage) -> Event {
        let status = status(self.reason.unwrap_or(FinishReason::Stop));
        let response = self
            .reply
            .response(status, self.items.done.clone(), Some(usage));
        self.reply.keep(&response);
        let response = Box::new(response);
        let end = match status {
            "incomplete" => StreamEvent::Incomplete { response },
            _ => StreamEvent::Completed { response },
        };
        self.event(&end)
    }

    fn error(&self, body: &serde_json::Value) -> Event {
        let field = |name: &str| error_field(body, name).map(String::from);
        let message = field("message").unwrap_or_else(|| "internal error".into());
        let error = StreamEvent::Error {
            code: field("code").or_else(|| field("type")),
            message: message.clone(),
            param: field("param"),
        };
        let mut response = self.reply.response("failed", self.items.done.clone(), None);
        response.error = Some(ResponseError {
            code: "server_error",
            message,
        });
        let failed = StreamEvent::Failed {
            response: Box::new(response),
        };
        self.events(&[error, failed])
            .unwrap_or_else(|| sse::named("error", body))
    }

    fn done(&self) -> Option<Event> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(events: &[StreamEvent]) -> Vec<&'static str> {
        events.iter().map(StreamEvent::name).collect()
    }

    #[test]
    fn text_then_a_call_are_two_items() {
        let mut items = Items::new(false);
        let mut out = items.pieces(crate::tools::stream::streamed_pieces());
        out.extend(items.close("completed"));
        assert_eq!(
            names(&out),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        assert!(
            matches!(&items.done[0], OutputItem::Message { content, .. } if content[0].text == "Checking.")
        );
        assert!(
            matches!(&items.done[1], OutputItem::FunctionCall { name, arguments, .. } if name == "get_weather" && arguments.contains("Paris"))
        );
        let StreamEvent::OutputItemAdded { output_index, item } = &out[6] else {
            panic!("{out:?}");
        };
        assert_eq!(*output_index, 1);
        assert!(
            matches!(item, OutputItem::FunctionCall { arguments, status, .. } if arguments.is_empty() && *status == "in_progress")
        );
    }

    #[test]
    fn forced_calls_send_no_text() {
        let mut items = Items::new(true);
        assert!(items
            .pieces(vec![Piece::Content("{\"na".into())])
            .is_empty());
        assert!(items.close("completed").is_empty());
    }
}
