//! Answer extraction: which part of a response is its final answer, before an exact-match
//! verifier compares it with the reference. It judges nothing itself.

use super::VerifierError;
use regex::Regex;
use std::sync::OnceLock;

/// Where a response's answer is.
#[derive(Debug, Clone)]
pub enum Extract {
    /// The response up to its first newline, trimmed (the arithmetic task's one-line answer).
    FirstLine,
    /// The contents of the last `\boxed{...}`, braces balanced, trimmed.
    Boxed,
    /// The last number in the response (`-12`, `3.5`, `1,000`), thousands separators removed.
    LastNumber,
    /// Capture group `answer` of the first match of a regex, or group 1 when it has no group
    /// named `answer`; trimmed.
    Regex(Regex),
}

/// Which [`Extract`], without `Regex`'s compiled pattern: the choice a recipe names
/// (`extract = "boxed"`), whose pattern comes from another key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExtractKind {
    /// [`Extract::FirstLine`].
    #[default]
    FirstLine,
    /// [`Extract::Boxed`].
    Boxed,
    /// [`Extract::LastNumber`].
    LastNumber,
    /// [`Extract::Regex`], built with [`Extract::regex`].
    Regex,
}

impl ExtractKind {
    /// The extraction of a kind that takes no pattern; `None` for `Regex`, which
    /// [`Extract::regex`] builds from its pattern.
    pub fn without_pattern(self) -> Option<Extract> {
        match self {
            ExtractKind::FirstLine => Some(Extract::FirstLine),
            ExtractKind::Boxed => Some(Extract::Boxed),
            ExtractKind::LastNumber => Some(Extract::LastNumber),
            ExtractKind::Regex => None,
        }
    }
}

impl Extract {
    /// A regex extraction; the pattern must compile and have a capture group.
    pub fn regex(pattern: &str) -> Result<Self, VerifierError> {
        let re = compile(pattern)?;
        if re.captures_len() < 2 {
            return Err(VerifierError::Pattern {
                pattern: pattern.to_string(),
                message: "has no capture group: wrap the answer in (...) or (?P<answer>...)".into(),
            });
        }
        Ok(Extract::Regex(re))
    }

    /// The answer in `text`, or `None` when there is none to find.
    pub fn apply(&self, text: &str) -> Option<String> {
        match self {
            Extract::FirstLine => Some(text.split('\n').next().unwrap_or("").trim().to_string()),
            Extract::Boxed => last_boxed(text).map(|s| s.trim().to_string()),
            Extract::LastNumber => number_regex()
                .find_iter(text)
                .last()
                .map(|m| m.as_str().replace(',', "")),
            Extract::Regex(re) => {
                let c = re.captures(text)?;
                c.name("answer")
                    .or_else(|| c.get(1))
                    .map(|m| m.as_str().trim().to_string())
            }
        }
    }
}

/// Compiles `pattern`, naming it in the error.
pub(crate) fn compile(pattern: &str) -> Result<Regex, VerifierError> {
    Regex::new(pattern).map_err(|e| VerifierError::Pattern {
        pattern: pattern.to_string(),
        // The parser's last line says what is wrong ("error: unclosed group").
        message: e
            .to_string()
            .lines()
            .rfind(|l| !l.trim().is_empty())
            .unwrap_or("does not compile")
            .trim()
            .to_string(),
    })
}

fn number_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?").expect("a valid number pattern")
    })
}

/// An opening and a closing brace, spelled by code point so that no brace stands in a
/// literal here (line-based brace counters read this file right).
const LEFT_BRACE: char = '\u{7b}';
const RIGHT_BRACE: char = '\u{7d}';

/// The inside of the last `\boxed{...}` whose braces balance.
fn last_boxed(text: &str) -> Option<&str> {
    const OPEN: &str = "\\boxed\u{7b}";
    let start = text.rfind(OPEN)? + OPEN.len();
    let mut depth = 1isize;
    for (i, c) in text[start..].char_indices() {
        depth += match c {
            LEFT_BRACE => 1,
            RIGHT_BRACE => -1,
            _ => 0,
        };
        if depth == 0 {
            return Some(&text[start..start + i]);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_line_is_trimmed_and_cut_at_the_newline() {
        assert_eq!(
            Extract::FirstLine.apply(" 81 \nmore").as_deref(),
            Some("81")
        );
        assert_eq!(Extract::FirstLine.apply("").as_deref(), Some(""));
    }

    #[test]
    fn boxed_takes_the_last_balanced_box() {
        let e = Extract::Boxed;
        assert_eq!(
            e.apply(r"so \boxed{3} or \boxed{ 4 }").as_deref(),
            Some("4")
        );
        assert_eq!(
            e.apply(r"\boxed{\frac{1}{2}} done").as_deref(),
            Some(r"\frac{1}{2}")
        );
        assert_eq!(e.apply(r"\boxed{unclosed").as_deref(), None);
        assert_eq!(e.apply("no box").as_deref(), None);
    }

    #[test]
    fn last_number_strips_separators() {
        let e = Extract::LastNumber;
        assert_eq!(e.apply("3 apples and 12 pears").as_deref(), Some("12"));
        assert_eq!(e.apply("it is -2.5.").as_deref(), Some("-2.5"));
        assert_eq!(e.apply("total: 1,000 units").as_deref(), Some("1000"));
        assert_eq!(e.apply("none").as_deref(), None);
    }

    #[test]
    fn regex_uses_the_answer_group_or_group_one() {
        let e = Extract::regex(r"Answer: (\S+)").unwrap();
        assert_eq!(e.apply("Work... Answer: 42 ok").as_deref(), Some("42"));
        assert_eq!(e.apply("no answer").as_deref(), None);
        let e = Extract::regex(r"(x)=(?P<answer>\d+)").unwrap();
        assert_eq!(e.apply("x=7").as_deref(), Some("7"));
        let err = Extract::regex(r"Answer: \d+").unwrap_err().to_string();
        assert!(err.contains("capture group"), "{err}");
        let err = Extract::regex(r"(unclosed").unwrap_err().to_string();
        assert!(err.contains("(unclosed"), "{err}");
    }

    /// The kind of `e`; exhaustive, so a new [`Extract`] needs its kind.
    fn kind(e: &Extract) -> ExtractKind {
        match e {
            Extract::FirstLine => ExtractKind::FirstLine,
            Extract::Boxed => ExtractKind::Boxed,
            Extract::LastNumber => ExtractKind::LastNumber,
            Extract::Regex(_) => ExtractKind::Regex,
        }
    }

    #[test]
    fn kinds_without_a_pattern_build_their_extraction() {
        for k in [
            ExtractKind::FirstLine,
            ExtractKind::Boxed,
            ExtractKind::LastNumber,
        ] {
            assert_eq!(kind(&k.without_pattern().unwrap()), k);
        }
        assert!(ExtractKind::Regex.without_pattern().is_none());
        assert_eq!(kind(&Extract::regex("(a)").unwrap()), ExtractKind::Regex);
    }
}
