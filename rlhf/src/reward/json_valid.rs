//! JSON validity: 1 when the whole response, trimmed, is one JSON value, else 0. It does not
//! look inside code fences or check a schema.

/// Scores whether the response parses as JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JsonValid;

impl JsonValid {
    /// 1 when `response` (trimmed) is valid JSON, else 0.
    pub fn score(&self, response: &str) -> f64 {
        let ok = serde_json::from_str::<serde::de::IgnoredAny>(response.trim()).is_ok();
        f64::from(u8::from(ok))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_response_must_parse() {
        let j = JsonValid;
        assert_eq!(j.score(r#" {"a": [1, 2]} "#), 1.0);
        assert_eq!(j.score("42"), 1.0);
        assert_eq!(j.score(r#"{"a": 1"#), 0.0);
        assert_eq!(j.score(r#"{"a": 1} trailing"#), 0.0);
        assert_eq!(j.score(""), 0.0);
    }
}
