//! A choice's text as it grows: complete UTF-8 only, stop sequences cut out, and
//! nothing emitted that a stop sequence might still claim.

/// Text of one choice, split into what was emitted and what is held back.
#[derive(Debug, Default, Clone)]
pub struct ChoiceText {
    emitted: String,
    /// Characters of `emitted`, kept as it grows (`held` is short: a stop's length).
    emitted_chars: usize,
    held: String,
}

impl ChoiceText {
    /// Starts with `prefix` already emitted (the prompt, for `echo`).
    pub fn with_prefix(prefix: &str) -> Self {
        ChoiceText {
            emitted: prefix.to_owned(),
            emitted_chars: prefix.chars().count(),
            held: String::new(),
        }
    }

    /// Characters of all text so far, emitted and held: where the next token's text
    /// begins, as `logprobs.text_offset` counts (in characters, as OpenAI's API does).
    pub fn chars(&self) -> usize {
        self.emitted_chars + self.held.chars().count()
    }

    /// The text emitted so far.
    pub fn emitted(&self) -> &str {
        &self.emitted
    }

    /// Adds `delta`. Returns the text that may be emitted now, and whether a stop
    /// sequence was found (the text then ends before it, and nothing more may follow).
    ///
    /// A suffix that could be the start of a stop sequence is held back until the next
    /// text settles it; since the longest such suffix is held, no stop sequence can
    /// ever begin inside text already emitted.
    pub fn push(&mut self, delta: &str, stops: &[String]) -> (String, bool) {
        self.held.push_str(delta);
        let found = stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = found {
            let out = self.held[..at].to_owned();
            self.emit(&out);
            self.held.clear();
            return (out, true);
        }
        let keep = stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out: String = self.held.drain(..cut).collect();
        self.emit(&out);
        (out, false)
    }

    /// Ends the text: emits what was held back.
    pub fn finish(&mut self) -> String {
        let out = std::mem::take(&mut self.held);
        self.emit(&out);
        out
    }

    fn emit(&mut self, out: &str) {
        self.emitted.push_str(out);
        self.emitted_chars += out.chars().count();
    }
}

/// Length in bytes of the longest suffix of `text` that is a proper prefix of `stop`,
/// on character boundaries.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&k| {
            text.is_char_boundary(text.len() - k)
                && stop.is_char_boundary(k)
                && text.ends_with(&stop[..k])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(deltas: &[&str], stops: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut t = ChoiceText::default();
        let mut outs = Vec::new();
        let mut stopped = false;
        for d in deltas {
            let (o, s) = t.push(d, &stops);
            outs.push(o);
            if s {
                stopped = true;
                break;
            }
        }
        if !stopped {
            outs.push(t.finish());
        }
        (outs, stopped, t.emitted().to_owned())
    }

    #[test]
    fn counts_characters_not_bytes() {
        let stops = vec!["éx".to_string()];
        let mut t = ChoiceText::with_prefix("🌮");
        assert_eq!(t.chars(), 1);
        // "é" may start the stop: held back, and still counted.
        let (out, _) = t.push("añé", &stops);
        assert_eq!((out.as_str(), t.chars()), ("añ", 4));
        t.finish();
        assert_eq!((t.emitted(), t.chars()), ("🌮añé", 4));
    }

    #[test]
    fn cuts_a_stop_that_spans_deltas() {
        let (outs, stopped, text) = run(&["Hello", " wor", "ld and", " more"], &["world"]);
        assert!(stopped);
        assert_eq!(text, "Hello ");
        assert_eq!(outs.concat(), "Hello ");
    }

    #[test]
    fn releases_held_text_that_turns_out_not_to_stop() {
        let (outs, stopped, text) = run(&["ab", "c", "d"], &["cx"]);
        assert!(!stopped);
        assert_eq!(outs, vec!["ab", "", "cd", ""]);
        assert_eq!(text, "abcd");
    }

    #[test]
    fn picks_the_earliest_stop() {
        let (_, stopped, text) = run(&["one. two\n"], &["\n", "."]);
        assert!(stopped);
        assert_eq!(text, "one");
    }

    #[test]
    fn without_stops_everything_flows() {
        let (outs, _, text) = run(&["a", "é", "🦀"], &[]);
        assert_eq!(outs, vec!["a", "é", "🦀", ""]);
        assert_eq!(text, "aé🦀");
    }

    #[test]
    fn multibyte_stops_hold_on_char_boundaries() {
        let (_, stopped, text) = run(&["x🦀", "y"], &["🦀y"]);
        assert!(stopped);
        assert_eq!(text, "x");
    }
}
