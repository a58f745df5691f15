//! Reasoning parsers: a reasoning model's `<think>…</think>` moved out of
//! the answer into `reasoning_content` (chat) or a reasoning item
//! (Responses), as vLLM's `--reasoning-parser` does.
//!
//! Qwen3 and DeepSeek-R1 both write their reasoning between `<think>` and
//! `</think>` before the answer. Which of the two tags the answer holds
//! depends on the chat template, so it is read from the rendered prompt,
//! not assumed per model: Qwen3's template leaves the tag to the model
//! (and with `enable_thinking: false` closes an empty block itself),
//! DeepSeek-R1's and Qwen3-2507's open `<think>` in the prompt, so their
//! answers start inside the reasoning. An answer cut before `</think>` is
//! all reasoning.
//!
//! One splitter serves whole and streamed answers (a whole answer is the
//! stream of its text), so both give the same parts. Whitespace at the
//! edges of the reasoning and at the start of the answer is the tags'
//! layout, not text: it is dropped.

use crate::tools::held_prefix;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether the rendered prompt leaves a `<think>` block open, so the answer
/// starts inside the reasoning.
pub fn opened_in_prompt(prompt: &str) -> bool {
    match (prompt.rfind(OPEN), prompt.rfind(CLOSE)) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

/// A part of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the answer may open `<think>`.
    Start,
    /// Inside the reasoning; `begun` once it has shown a non-blank character.
    Reasoning { begun: bool },
    /// After `</think>`, before the answer's first non-blank character.
    AfterReasoning,
    /// The answer.
    Content,
}

/// Splits an answer's text, pushed as it is generated, into reasoning and
/// content. Text that may be the start of a tag, and blanks that may end
/// the reasoning, are held until the next push tells.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    state: State,
    held: String,
}

impl ReasoningSplitter {
    /// A splitter for an answer to a prompt that (`opened`) or that does not
    /// leave a `<think>` block open.
    pub fn new(opened: bool) -> Self {
        let state = if opened {
            State::Reasoning { begun: false }
        } else {
            State::Start
        };
        Self {
            state,
            held: String::new(),
        }
    }

    /// The parts `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<Part> {
        self.held.push_str(text);
        let mut parts = Vec::new();
        loop {
            let before = (self.state, self.held.len());
            self.step(&mut parts);
            if self.held.is_empty() || (self.state, self.held.len()) == before {
                break;
            }
        }
        parts
    }

    /// The parts left when the answer ends: a tag cut short is text.
    pub fn finish(&mut self) -> Vec<Part> {
        let held = std::mem::take(&mut self.held);
        let part = match self.state {
            State::AfterReasoning => Part::Content(held.trim_start().to_string()),
            State::Start | State::Content => Part::Content(held),
            State::Reasoning { begun } => {
                let text = if begun { held.trim_end() } else { held.trim() };
                Part::Reasoning(text.to_string())
            }
        };
        self.state = State::Content;
        nonempty(part).into_iter().collect()
    }

    /// Moves what can be decided out of `held`.
    fn step(&mut self, parts: &mut Vec<Part>) {
        match self.state {
            State::Start => {
                let text = self.held.trim_start();
                if let Some(rest) = text.strip_prefix(OPEN) {
                    self.held = rest.to_string();
                    self.state = State::Reasoning { begun: false };
                } else if !OPEN.starts_with(text) {
                    self.state = State::Content;
                }
            }
            State::Reasoning { begun } => {
                if !begun {
                    self.held = self.held.trim_start().to_string();
                    if self.held.is_empty() {
                        return;
                    }
                }
                if let Some(at) = self.held.find(CLOSE) {
                    let reasoning = self.held[..at].trim_end().to_string();
                    self.held = self.held[at + CLOSE.len()..].to_string();
                    parts.extend(nonempty(Part::Reasoning(reasoning)));
                    self.state = State::AfterReasoning;
                    return;
                }
                // Keep back trailing blanks and what may start `</think>`.
                let keep = held_prefix(&self.held, CLOSE);
                let body_end = self.held.len() - keep;
                let body = self.held[..body_end].trim_end();
                let cut = body.len();
                if cut > 0 {
                    parts.push(Part::Reasoning(self.held[..cut].to_string()));
                    self.held.drain(..cut);
                    self.state = State::Reasoning { begun: true };
                }
            }
            State::AfterReasoning => {
                let text = self.held.trim_start();
                if !text.is_empty() {
                    self.held = text.to_string();
                    self.state = State::Content;
                } else {
                    self.held.clear();
                }
            }
            State::Content => {
                let text = std::mem::take(&mut self.held);
                parts.extend(nonempty(Part::Content(text)));
            }
        }
    }
}

fn nonempty(part: Part) -> Option<Part> {
    match &part {
        Part::Reasoning(t) | Part::Content(t) if t.is_empty() => None,
        _ => Some(part),
    }
}

/// A whole answer's reasoning (when it has any) and content.
pub fn split(text: &str, opened: bool) -> (Option<String>, String) {
    let mut splitter = ReasoningSplitter::new(opened);
    let mut parts = splitter.push(text);
    parts.extend(splitter.finish());
    joined(parts)
}

/// Parts put back together: the reasoning (when there is any) and the content.
fn joined(parts: Vec<Part>) -> (Option<String>, String) {
    let (mut reasoning, mut content) = (None::<String>, String::new());
    for part in parts {
        match part {
            Part::Reasoning(t) => reasoning.get_or_insert_with(String::new).push_str(&t),
            Part::Content(t) => content.push_str(&t),
        }
    }
    (reasoning, content)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every way of cutting `text` into two pushes gives the whole split.
    fn all_cuts(text: &str, opened: bool) -> (Option<String>, String) {
        let whole = split(text, opened);
        for (at, _) in text.char_indices() {
            let mut s = ReasoningSplitter::new(opened);
            let mut parts = s.push(&text[..at]);
            parts.extend(s.push(&text[at..]));
            parts.extend(s.finish());
            assert_eq!(joined(parts), whole, "cut at {at} of {text:?}");
        }
        whole
    }

    fn some(s: &str) -> Option<String> {
        Some(s.to_string())
    }

    #[test]
    fn qwen3_answer_with_its_own_tags() {
        let text = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!";
        assert_eq!(
            all_cuts(text, false),
            (some("The user greets me.\nI greet back."), "Hello!".into())
        );
    }

    #[test]
    fn a_prompt_that_opened_the_block_starts_in_reasoning() {
        let text = "Two and two.\n</think>\n\n4";
        assert_eq!(all_cuts(text, true), (some("Two and two."), "4".into()));
    }

    #[test]
    fn an_answer_cut_before_the_close_is_all_reasoning() {
        assert_eq!(
            all_cuts("<think>\nStill thinking </th", false),
            (some("Still thinking </th"), String::new())
        );
        assert_eq!(all_cuts("hmm, so", true), (some("hmm, so"), String::new()));
    }

    #[test]
    fn an_answer_without_tags_is_content() {
        assert_eq!(
            all_cuts("Hello <think> there", false),
            (None, "Hello <think> there".into())
        );
        assert_eq!(all_cuts("  <thin", false), (None, "  <thin".into()));
        assert_eq!(all_cuts("", false), (None, String::new()));
    }

    #[test]
    fn thinking_off_closes_the_block_in_the_prompt() {
        let prompt = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert!(!opened_in_prompt(prompt));
        assert!(opened_in_prompt("<|im_start|>assistant\n<think>\n"));
        assert!(!opened_in_prompt("<|im_start|>assistant\n"));
    }

    #[test]
    fn an_empty_block_gives_no_reasoning() {
        assert_eq!(
            all_cuts("<think>\n\n</think>\n\nHi", false),
            (None, "Hi".into())
        );
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let text = "<think>Dois é … ok</think>Olá — é";
        assert_eq!(
            all_cuts(text, false),
            (some("Dois é … ok"), "Olá — é".into())
        );
    }

    #[test]
    fn streamed_reasoning_is_sent_as_it_comes() {
        let mut s = ReasoningSplitter::new(false);
        assert_eq!(s.push("<think>"), vec![]);
        assert_eq!(s.push("\nOne"), vec![Part::Reasoning("One".into())]);
        assert_eq!(s.push(" two\n"), vec![Part::Reasoning(" two".into())]);
        assert_eq!(s.push("</think>\n\nAn"), vec![Part::Content("An".into())]);
        assert_eq!(s.push("swer"), vec![Part::Content("swer".into())]);
        assert_eq!(s.finish(), vec![]);
    }
}
