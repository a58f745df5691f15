//! Reading tool calls out of a streamed answer, text piece by text piece:
//! content is passed on as it comes, except text that may still turn out
//! to start a call (held back until it is known); each call is handed on
//! once it is complete. The pieces reassemble to what [`parse_answer`]
//! finds in the whole text.
//!
//! [`parse_answer`]: super::parse_answer

use super::parse::{
    call_from, llama3, mistral, ParsedCall, HERMES_CLOSE, HERMES_OPEN, MISTRAL_MARK, PYTHON_TAG,
};
use super::ToolFormat;

/// What the stream hands on.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Answer text.
    Content(String),
    /// A complete call.
    Call(ParsedCall),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Llama 3: not yet known whether the answer is calls or text.
    Undecided,
    /// Text, watching for the format's call marker.
    Text,
    /// Inside a Hermes `<tool_call>` block.
    Block,
    /// Calls until the end (Llama 3, Mistral): parsed whole at the end.
    Rest,
}

/// A choice's streamed text as pieces: through the tool-call parser when
/// the answer may hold calls (a format is given), else all content.
#[derive(Debug)]
pub struct Pieces(Option<ToolStream>);

impl Pieces {
    /// Pieces parsed as `format` writes calls, or plain content.
    pub fn new(format: Option<ToolFormat>) -> Self {
        Self(format.map(ToolStream::new))
    }

    /// Takes more of the answer.
    pub fn push(&mut self, text: String) -> Vec<Piece> {
        match &mut self.0 {
            Some(parser) => parser.push(&text),
            None => vec![Piece::Content(text)],
        }
    }

    /// The answer ended: what was held back.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.0.as_mut().map(ToolStream::finish).unwrap_or_default()
    }
}

/// A Hermes answer with text, then a call (tests of the streams over it).
#[cfg(test)]
pub(crate) const TEXT_THEN_CALL: &str =
    r#"Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>"#;

/// The pieces of [`TEXT_THEN_CALL`] streamed a tag at a time, in order.
#[cfg(test)]
pub(crate) fn streamed_pieces() -> Vec<Piece> {
    let mut parser = ToolStream::new(ToolFormat::Hermes);
    let mut out: Vec<Piece> = TEXT_THEN_CALL
        .split_inclusive('>')
        .flat_map(|piece| parser.push(piece))
        .collect();
    out.extend(parser.finish());
    out
}

/// One choice's stream parser.
#[derive(Debug)]
pub struct ToolStream {
    format: ToolFormat,
    mode: Mode,
    /// Text not handed on yet.
    pending: String,
    /// Some content has been handed on (leading whitespace is dropped).
    started: bool,
    /// Trailing whitespace of the content so far, handed on only if more
    /// content follows (the whole answer's content is trimmed).
    held_space: String,
}

impl ToolStream {
    /// A parser for `format`.
    pub fn new(format: ToolFormat) -> Self {
        Self {
            format,
            mode: if format == ToolFormat::Llama3Json {
                Mode::Undecided
            } else {
                Mode::Text
            },
            pending: String::new(),
            started: false,
            held_space: String::new(),
        }
    }

    /// Takes more of the answer.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.mode {
                Mode::Undecided => {
                    let t = self.pending.trim_start();
                    if t.is_empty() || (PYTHON_TAG.starts_with(t) && t.len() < PYTHON_TAG.len()) {
                        break;
                    }
                    self.mode = if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                        Mode::Rest
                    } else {
                        Mode::Text
                    };
                }
                Mode::Text => {
                    let Some(marker) = self.marker() else {
                        let text = std::mem::take(&mut self.pending);
                        self.content(&text, &mut out);
                        break;
                    };
                    if let Some(at) = self.pending.find(marker) {
                        let before = self.pending[..at].to_string();
                        self.content(&before, &mut out);
                        if self.format == ToolFormat::Hermes {
                            self.pending.drain(..at + marker.len());
                            self.mode = Mode::Block;
                        } else {
                            self.pending.drain(..at);
                            self.mode = Mode::Rest;
                        }
                        continue;
                    }
                    let keep = held_prefix(&self.pending, marker);
                    let cut = self.pending.len() - keep;
                    let text: String = self.pending.drain(..cut).collect();
                    self.content(&text, &mut out);
                    break;
                }
                Mode::Block => {
                    let Some(end) = self.pending.find(HERMES_CLOSE) else {
                        break;
                    };
                    let body = self.pending[..end].to_string();
                    self.pending.drain(..end + HERMES_CLOSE.len());
                    self.block(&body, true, &mut out);
                    self.mode = Mode::Text;
                }
                Mode::Rest => break,
            }
        }
        out
    }

    /// The answer ended: everything still held.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.pending);
        match self.mode {
            Mode::Undecided | Mode::Text => self.content(&rest, &mut out),
            Mode::Block => self.block(&rest, false, &mut out),
            Mode::Rest => {
                let answer = match self.format {
                    ToolFormat::Mistral => mistral(&rest),
                    _ => llama3(&rest),
                };
                if answer.calls.is_empty() {
                    self.content(&rest, &mut out);
                } else {
                    if let Some(c) = answer.content {
                        self.content(&c, &mut out);
                    }
                    out.extend(answer.calls.into_iter().map(Piece::Call));
                }
            }
        }
        self.held_space.clear();
        out
    }

    fn marker(&self) -> Option<&'static str> {
        match self.format {
            ToolFormat::Hermes => Some(HERMES_OPEN),
            ToolFormat::Mistral => Some(MISTRAL_MARK),
            ToolFormat::Llama3Json => None,
        }
    }

    /// A Hermes block's body: a call, or back to text when it is not one.
    fn block(&mut self, body: &str, closed: bool, out: &mut Vec<Piece>) {
        match call_from(body.trim(), "arguments") {
            Some(call) => out.push(Piece::Call(call)),
            None => {
                let close = if closed { HERMES_CLOSE } else { "" };
                self.content(&format!("{HERMES_OPEN}{body}{close}"), out);
            }
        }
    }

    fn content(&mut self, text: &str, out: &mut Vec<Piece>) {
        let text = if self.started {
            text
        } else {
            text.trim_start()
        };
        if text.is_empty() {
            return;
        }
        self.held_space.push_str(text);
        let kept = self.held_space.trim_end().len();
        if kept == 0 {
            return;
        }
        let rest = self.held_space.split_off(kept);
        out.push(Piece::Content(std::mem::replace(
            &mut self.held_space,
            rest,
        )));
        self.started = true;
    }
}

/// The length of the longest end of `text` that `marker` starts with (what
/// a stream holds back: it may open the marker).
pub(crate) fn held_prefix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::super::parse_answer;
    use super::*;

    /// Streams `text` in pieces of `step` bytes (on char boundaries).
    fn stream(format: ToolFormat, text: &str, step: usize) -> (String, Vec<ParsedCall>) {
        let mut s = ToolStream::new(format);
        let mut pieces = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            pieces.extend(s.push(&text[i..j]));
            i = j;
        }
        pieces.extend(s.finish());
        let mut content = String::new();
        let mut calls = Vec::new();
        for p in pieces {
            match p {
                Piece::Content(c) => content.push_str(&c),
                Piece::Call(c) => calls.push(c),
            }
        }
        (content, calls)
    }

    #[test]
    fn streams_reassemble_to_the_whole_answer() {
        let cases = [
            (ToolFormat::Hermes, "Checking <tool_call>\n{\"name\": \"w\", \"arguments\": {\"c\": \"é\"}}\n</tool_call>\n<tool_call>{\"name\": \"v\", \"arguments\": {}}</tool_call>  "),
            (ToolFormat::Hermes, "plain text with < and <tool and more"),
            (ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}"),
            (ToolFormat::Hermes, "a <tool_call>{bad}</tool_call> b"),
            (ToolFormat::Llama3Json, " {\"name\": \"a\", \"parameters\": {\"x\": [1, 2]}}; {\"name\": \"b\", \"parameters\": {}}"),
            (ToolFormat::Llama3Json, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}"),
            (ToolFormat::Llama3Json, "It is sunny."),
            (ToolFormat::Mistral, "ok [TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": 1}}]"),
            (ToolFormat::Mistral, "[TOOL_CALLS] not json"),
        ];
        for (format, text) in cases {
            let whole = parse_answer(format, text);
            for step in [1, 2, 3, 7, 1000] {
                let (content, calls) = stream(format, text, step);
                assert_eq!(calls, whole.calls, "{format:?} {text:?} step {step}");
                assert_eq!(
                    content,
                    whole.content.clone().unwrap_or_default(),
                    "{format:?} {text:?} step {step}"
                );
            }
        }
    }
}
