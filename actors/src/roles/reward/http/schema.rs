//! The reward service's wire format, one JSON object each way.
//!
//! Request (`POST`, `Content-Type: application/json`), one entry per row, in row order:
//! `{"prompts": ["7+8="], "responses": ["15"], "answers": ["15"]}`; an answer is `null`
//! when the data has none. When the prompt rows have columns besides the prompt (TRL's
//! `solution`, test cases, ...), `"columns": [{"solution": "15"}]` carries each row's as an
//! object (`{}` for a row without).
//!
//! Response (any 2xx): `{"rewards": [1.0]}`, exactly one finite number per row, in the same
//! order. Other keys are ignored. Anything else is a bad response, never a default reward.

use serde::{Deserialize, Serialize};

/// The body posted for one chunk of rows.
#[derive(Debug, Serialize)]
pub struct RewardRequest<'a> {
    /// Prompt texts.
    pub prompts: &'a [String],
    /// Decoded response texts.
    pub responses: &'a [String],
    /// Reference answers (`null` when none).
    pub answers: &'a [Option<String>],
    /// Each row's other columns, or nothing when no row has any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub columns: Vec<serde_json::Value>,
}

/// The `columns` of a request: one object per row (`{}` for a row without), or none at all
/// when no row has columns.
pub(crate) fn column_objects(columns: &[Option<String>]) -> Vec<serde_json::Value> {
    if columns.iter().all(Option::is_none) {
        return Vec::new();
    }
    let object = |text: &Option<String>| match text {
        // written by the data loader from a parsed JSON object
        Some(t) => serde_json::from_str(t).unwrap_or(serde_json::Value::Null),
        None => serde_json::Value::Object(Default::default()),
    };
    columns.iter().map(object).collect()
}

#[derive(Debug, Deserialize)]
struct RewardResponse {
    rewards: Vec<Option<f64>>,
}

/// What is wrong with a 2xx answer's body.
#[derive(Debug, thiserror::Error)]
pub enum ResponseError {
    /// Not `{"rewards": [...]}` JSON.
    #[error("expected {{\"rewards\": [{rows} numbers]}}: {source}{hint}; body starts {start:?}")]
    Schema {
        /// Rows in the request.
        rows: usize,
        /// The JSON error.
        source: serde_json::Error,
        /// Advice for NaN / Infinity in the body, or empty.
        hint: &'static str,
        /// The body's first 200 bytes.
        start: String,
    },
    /// Another number of rewards than rows.
    #[error("expected {rows} rewards (one per row), got {got}")]
    Count {
        /// Rows in the request.
        rows: usize,
        /// Rewards in the answer.
        got: usize,
    },
    /// A reward that is not a finite f32 (`None`: null).
    #[error("reward of row {row} is {}: expected a finite number", .value.map_or("null".to_string(), |x| x.to_string()))]
    NotFinite {
        /// The row.
        row: usize,
        /// The value sent, `None` for null.
        value: Option<f64>,
    },
}

/// The rewards in `body` for a request of `rows` rows, or what is wrong with it. Rewards must
/// be finite and fit an f32 (the batch's precision).
pub(crate) fn parse_rewards(body: &[u8], rows: usize) -> Result<Vec<f64>, ResponseError> {
    let parsed: RewardResponse = serde_json::from_slice(body).map_err(|source| {
        let start = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
        let hint = if ["NaN", "Infinity"].iter().any(|t| start.contains(t)) {
            " (NaN and Infinity are not JSON numbers; send finite rewards)"
        } else {
            ""
        };
        ResponseError::Schema {
            rows,
            source,
            hint,
            start,
        }
    })?;
    if parsed.rewards.len() != rows {
        return Err(ResponseError::Count {
            rows,
            got: parsed.rewards.len(),
        });
    }
    parsed
        .rewards
        .iter()
        .enumerate()
        .map(|(row, r)| match r {
            Some(x) if x.is_finite() && x.abs() <= f32::MAX as f64 => Ok(*x),
            value => Err(ResponseError::NotFinite { row, value: *value }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_has_one_entry_per_row() {
        let (p, r, a) = (vec!["1+1=".to_string()], vec!["2".to_string()], vec![None]);
        let body = serde_json::to_string(&RewardRequest {
            prompts: &p,
            responses: &r,
            answers: &a,
            columns: column_objects(&[None]),
        })
        .unwrap();
        assert_eq!(
            body,
            r#"{"prompts":["1+1="],"responses":["2"],"answers":[null]}"#
        );
        let columns = column_objects(&[Some(r#"{"solution":"2"}"#.into()), None]);
        assert_eq!(
            serde_json::to_string(&columns).unwrap(),
            r#"[{"solution":"2"},{}]"#
        );
    }

    #[test]
    fn response_must_have_one_finite_reward_per_row() {
        assert_eq!(
            parse_rewards(br#"{"rewards": [1, -0.5], "extra": 1}"#, 2).unwrap(),
            vec![1.0, -0.5]
        );
        let e = parse_rewards(br#"{"rewards": [1]}"#, 2)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("expected 2 rewards") && e.contains("got 1"),
            "{e}"
        );
        let e = parse_rewards(br#"{"rewards": [1, null]}"#, 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 1 is null"), "{e}");
        let e = parse_rewards(br#"{"rewards": [NaN]}"#, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("NaN and Infinity are not JSON"), "{e}");
        let e = parse_rewards(br#"{"rewards": [1e39]}"#, 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 0") && e.contains("finite"), "{e}");
        let e = parse_rewards(b"<html>oops</html>", 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("expected {\"rewards\"") && e.contains("<html>"),
            "{e}"
        );
    }
}
