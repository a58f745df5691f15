//! Stop strings over a stream of text pieces: a stop string may straddle
//! token boundaries, and neither it nor anything after it is ever emitted.
//!
//! Text that could be the start of a stop string is held back until the next
//! piece proves it is not (the same scheme as vLLM's detokenizer and TGI's
//! `StopSequenceCriteria`).

/// Result of feeding one piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopOutcome {
    /// Text safe to emit now.
    pub emit: String,
    /// A stop string matched; generation ends after emitting `emit`.
    pub stopped: bool,
}

/// Watches generated text for stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text not yet emitted because it may begin a stop string.
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Feeds the next piece of decoded text.
    pub fn push(&mut self, piece: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome {
                emit: piece.to_string(),
                stopped: false,
            };
        }
        self.held.push_str(piece);
        let earliest = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = earliest {
            let emit = self.held[..at].to_string();
            self.held.clear();
            return StopOutcome {
                emit,
                stopped: true,
            };
        }
        let keep = self.longest_partial_suffix();
        let split = self.held.len() - keep;
        let emit = self.held[..split].to_string();
        self.held.drain(..split);
        StopOutcome {
            emit,
            stopped: false,
        }
    }

    /// Releases held text when generation ends for another reason.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest suffix of `held` that is a proper
    /// prefix of some stop string (always on a char boundary).
    fn longest_partial_suffix(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let max = (stop.len() - 1).min(held.len());
            for len in (best + 1..=max).rev() {
                let start = held.len() - len;
                if held.is_char_boundary(start)
                    && stop.as_bytes().starts_with(&held.as_bytes()[start..])
                {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let o = m.push(p);
            out.push_str(&o.emit);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.flush());
        (out, false)
    }

    #[test]
    fn stop_across_pieces_is_not_emitted() {
        assert_eq!(
            run(&["\n\nUser:"], &["Hi", " there\n", "\nUs", "er: x"]),
            ("Hi there".into(), true)
        );
    }

    #[test]
    fn partial_match_that_fails_is_released() {
        assert_eq!(run(&["STOP"], &["ST", "OP"]), ("".into(), true));
        assert_eq!(run(&["STOP"], &["ST", "AR"]), ("STAR".into(), false));
        assert_eq!(run(&["abc"], &["xab", "d"]), ("xabd".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(
            run(&["world", "lo"], &["hello world"]),
            ("hel".into(), true)
        );
    }

    #[test]
    fn multibyte_text_is_split_on_char_boundaries() {
        assert_eq!(
            run(&["日本語"], &["これは日本", "人"]),
            ("これは日本人".into(), false)
        );
        assert_eq!(
            run(&["日本語"], &["これは日本", "語です"]),
            ("これは".into(), true)
        );
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }
}
