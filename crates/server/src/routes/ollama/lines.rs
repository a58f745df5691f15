//! An answer as Ollama's NDJSON lines: one per piece of text (or call),
//! then a closing line with `done: true`, `done_reason`, the counts and
//! durations. An error after the head is an `{"error": "..."}` line.

use std::time::Instant;

use ingot_core::FinishReason;
use ingot_engine::{Completion, GeneratedToken};
use ingot_protocol::usage::Usage;

use super::super::sse::{self, Event};
use super::{to_call, Reply};
use crate::tools::{Piece, Pieces};

/// The stream's state (one choice: Ollama has no `n`).
pub struct Lines {
    reply: Reply,
    /// The answer's text and calls.
    parser: Pieces,
    /// When the first token came.
    first: Option<Instant>,
    /// How the answer ended, once it has.
    reason: FinishReason,
}

impl Lines {
    pub fn new(reply: Reply) -> Self {
        Self {
            parser: Pieces::new(reply.tools),
            reply,
            first: None,
            reason: FinishReason::Stop,
        }
    }

    /// Lines for parsed pieces.
    fn pieces(&self, pieces: Vec<Piece>) -> Vec<Event> {
        pieces
            .into_iter()
            .filter_map(|piece| match piece {
                Piece::Content(text) if text.is_empty() => None,
                Piece::Content(text) => Some(self.reply.line(text, Vec::new(), None)),
                Piece::Call(call) => Some(match to_call(call) {
                    Ok(call) => self.reply.line(String::new(), vec![call], None),
                    Err(raw) => self.reply.line(raw, Vec::new(), None),
                }),
            })
            .map(|line| sse::ndjson(&line))
            .collect()
    }

    /// The closing line.
    fn closing(&self, usage: Usage) -> Event {
        let stats = self.reply.stats(self.reason, usage, self.first);
        sse::ndjson(&self.reply.line(String::new(), Vec::new(), Some(stats)))
    }
}

impl sse::ChunkFormat for Lines {
    fn token(&mut self, _: usize, token: GeneratedToken) -> Option<Event> {
        self.first.get_or_insert_with(Instant::now);
        let pieces = self.parser.push(token.text);
        sse::concat(self.pieces(pieces))
    }

    fn finish(&mut self, _: usize, completion: &Completion) -> Event {
        let rest = self.parser.finish();
        let mut lines = self.pieces(rest);
        self.reason = completion.reason;
        let usage = Usage::new(completion.prompt_tokens, completion.completion_tokens, 0);
        lines.push(self.closing(usage));
        sse::concat(lines).unwrap_or_else(|| self.closing(usage))
    }

    /// The closing line with the request's totals (sent by `finish`, so
    /// only used when a usage event is asked for).
    fn usage(&self, usage: Usage) -> Event {
        self.closing(usage)
    }

    fn error(&self, body: &serde_json::Value) -> Event {
        let message = body
            .pointer("/error/message")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("internal error");
        sse::ndjson(&serde_json::json!({ "error": message }))
    }

    fn done(&self) -> Option<Event> {
        None
    }
}
