//! A message as Anthropic's SSE events: `message_start` and `ping`, then
//! each block (`content_block_start`, its deltas, `content_block_stop`),
//! text and tool calls as the tool parser finds them, then `message_delta`
//! (stop reason, output tokens) and `message_stop`. No `[DONE]`: Anthropic's
//! streams end with `message_stop`.

use ingot_core::TokenId;
use ingot_engine::{Completion, GeneratedToken};
use ingot_protocol::anthropic::{
    error_body, BlockDelta, ContentBlock, DeltaUsage, MessageDelta, MessageUsage, StreamEvent,
};
use ingot_protocol::usage::Usage;

use super::super::sse::{self, Event};
use super::{tool_id, Reply, Stop};
use crate::tools::{Piece, Pieces};

/// The stream's state (one choice: Anthropic has no `n`).
pub struct Events {
    reply: Reply,
    /// The answer's text and calls.
    parser: Pieces,
    blocks: Blocks,
    /// Every generated token (to name the stop sequence at the end).
    ids: Vec<TokenId>,
    /// Why it ended, once it has.
    stop: Option<Stop>,
}

fn event(e: &StreamEvent) -> Event {
    sse::named(e.name(), e)
}

fn events(list: &[StreamEvent]) -> Option<Event> {
    sse::concat(list.iter().map(event).collect())
}

impl Events {
    /// The head events and the state that follows them.
    pub fn start(reply: Reply) -> (Vec<Event>, Self) {
        let usage = MessageUsage {
            input_tokens: reply.prompt_tokens,
            output_tokens: 0,
        };
        let message = reply.message(Vec::new(), None, usage);
        let head = vec![
            event(&StreamEvent::MessageStart { message }),
            event(&StreamEvent::Ping),
        ];
        let parser = Pieces::new(reply.tools.as_ref().map(|t| t.0));
        let state = Self {
            blocks: Blocks::new(reply.forced()),
            reply,
            parser,
            ids: Vec::new(),
            stop: None,
        };
        (head, state)
    }
}

/// Turns parsed pieces into blocks: text into the open text block (opened
/// on demand), each call a block of its own.
#[derive(Debug, Default)]
struct Blocks {
    /// The open text block, if any.
    open: Option<usize>,
    /// The next block's index.
    next: usize,
    /// Whether a call was sent.
    called: bool,
    /// The grammar made the whole answer calls: text is a call cut short.
    forced: bool,
}

impl Blocks {
    fn new(forced: bool) -> Self {
        Self {
            forced,
            ..Self::default()
        }
    }

    fn pieces(&mut self, pieces: Vec<Piece>) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        for piece in pieces {
            match piece {
                Piece::Content(text) if text.is_empty() || self.forced => {}
                Piece::Content(text) => {
                    let index = match self.open {
                        Some(i) => i,
                        None => {
                            let empty = ContentBlock::Text {
                                text: String::new(),
                            };
                            let i = self.open_block(&mut out, empty);
                            self.open = Some(i);
                            i
                        }
                    };
                    let delta = BlockDelta::TextDelta { text };
                    out.push(StreamEvent::ContentBlockDelta { index, delta });
                }
                Piece::Call(call) => {
                    out.extend(self.close());
                    let block = ContentBlock::ToolUse {
                        id: tool_id(),
                        name: call.name,
                        input: serde_json::json!({}),
                    };
                    let index = self.open_block(&mut out, block);
                    let delta = BlockDelta::InputJsonDelta {
                        partial_json: call.arguments,
                    };
                    out.push(StreamEvent::ContentBlockDelta { index, delta });
                    out.push(StreamEvent::ContentBlockStop { index });
                    self.called = true;
                }
            }
        }
        out
    }

    /// Sends `content_block_start` of a new block; returns its index.
    fn open_block(&mut self, out: &mut Vec<StreamEvent>, content_block: ContentBlock) -> usize {
        let index = self.next;
        self.next += 1;
        out.push(StreamEvent::ContentBlockStart {
            index,
            content_block,
        });
        index
    }

    /// Closes the open text block.
    fn close(&mut self) -> Option<StreamEvent> {
        self.open
            .take()
            .map(|index| StreamEvent::ContentBlockStop { index })
    }
}

impl sse::ChunkFormat for Events {
    fn token(&mut self, _: usize, token: GeneratedToken) -> Option<Event> {
        self.ids.push(token.token);
        let pieces = self.parser.push(token.text);
        events(&self.blocks.pieces(pieces))
    }

    fn finish(&mut self, _: usize, completion: &Completion) -> Event {
        let rest = self.parser.finish();
        let mut list = self.blocks.pieces(rest);
        list.extend(self.blocks.close());
        let called = self.blocks.called;
        self.stop = Some(self.reply.stop(completion.reason, &self.ids, called));
        // A stream with nothing left to say still sends an event here.
        events(&list).unwrap_or_else(|| event(&StreamEvent::Ping))
    }

    fn usage(&self, usage: Usage) -> Event {
        let (stop_reason, stop_sequence) = self.stop.clone().unwrap_or(("end_turn", None));
        let delta = StreamEvent::MessageDelta {
            delta: MessageDelta {
                stop_reason,
                stop_sequence,
            },
            usage: DeltaUsage {
                output_tokens: usage.completion_tokens,
            },
        };
        events(&[delta, StreamEvent::MessageStop])
            .unwrap_or_else(|| event(&StreamEvent::MessageStop))
    }

    fn error(&self, body: &serde_json::Value) -> Event {
        let message =
            super::super::dialect::error_field(body, "message").unwrap_or("internal error");
        let kind = match super::super::dialect::error_field(body, "type") {
            Some("timeout_error") => "timeout_error",
            _ => "api_error",
        };
        sse::named("error", &error_body(kind, message))
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
    fn text_then_a_call_are_two_blocks() {
        let mut blocks = Blocks::new(false);
        let mut out = blocks.pieces(crate::tools::stream::streamed_pieces());
        out.extend(blocks.close());
        assert!(blocks.called);
        let starts: Vec<_> = out
            .iter()
            .filter_map(|e| match e {
                StreamEvent::ContentBlockStart {
                    index,
                    content_block,
                } => Some((*index, content_block.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(starts.len(), 2, "{out:?}");
        assert!(matches!(&starts[0], (0, ContentBlock::Text { .. })));
        assert!(
            matches!(&starts[1], (1, ContentBlock::ToolUse { name, .. }) if name == "get_weather")
        );
        let json: String = out
            .iter()
            .filter_map(|e| match e {
                StreamEvent::ContentBlockDelta {
                    delta: BlockDelta::InputJsonDelta { partial_json },
                    ..
                } => Some(partial_json.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&json).unwrap()["city"],
            "Paris"
        );
        assert_eq!(names(&out).last(), Some(&"content_block_stop"));
        let stops = names(&out)
            .iter()
            .filter(|n| **n == "content_block_stop")
            .count();
        assert_eq!(stops, 2, "each block is closed once: {out:?}");
    }

    #[test]
    fn forced_calls_send_no_text() {
        let mut blocks = Blocks::new(true);
        let out = blocks.pieces(vec![Piece::Content("{\"na".into())]);
        assert!(out.is_empty());
        assert_eq!(blocks.close(), None);
    }
}
