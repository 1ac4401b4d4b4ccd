//! `[reward]`: how a response is scored — the exact-match reward of the quickstart, a
//! weighted sum of rule-based verifiers (`[[reward.verifiers]]`), an HF reward model, or an
//! HTTP reward service (`[reward.http]`) — with its checks and the conversion into the
//! scorers (`oxalign-rlhf`'s verifiers, the config of `roles/reward/http/`). It scores nothing
//! itself. docs/REWARDS.md has examples and the service's JSON schema.

use super::python_reward::PythonRewardSection;
pub(super) use super::reward_key::{key_error, RewardKeyError};
use super::{Recipe, RecipeError};
use crate::roles::reward::http::{check_url, HttpRewardConfig};
use oxalign_rlhf::reward::VerifierKind;
use oxalign_rlhf::reward::{
    AnswerMatch, Extract, ExtractKind, JsonValid, LengthPenalty, RegexMatch, Verifier, Verifiers,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How a response is scored.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// Rule-based: the response's first line equals the reference answer.
    ExactMatch,
    /// A weighted sum of the verifiers in `[[reward.verifiers]]`.
    Verifiers,
    /// An HF sequence-classification reward model.
    Model,
    /// A reward service over HTTP (`[reward.http]`).
    Http,
    /// TRL-style Python reward functions (`[reward.python]`), served over HTTP on
    /// 127.0.0.1 by a child process (`[reward.http]` may tune the client, without `url`).
    Python,
}

/// `[reward]`: how a response is scored.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSection {
    /// `exact_match` (`correct` if the response's first line, trimmed, equals the answer,
    /// else `incorrect`), `verifiers` (the weighted sum of `[[reward.verifiers]]`), `model`
    /// (an HF sequence-classification reward model from `model.reward_path`) or `http` (the
    /// service of `[reward.http]`). Default `"exact_match"`.
    pub kind: RewardKind,
    /// Reward for a response that matches the reference answer (`kind = "exact_match"`).
    /// Default `1.0`.
    pub correct: f64,
    /// Reward for one that does not (`kind = "exact_match"`). Default `0.0`.
    pub incorrect: f64,
    /// `[[reward.verifiers]]`, summed with their weights when `kind = "verifiers"`.
    /// Default: none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub verifiers: Vec<VerifierSpec>,
    /// `[reward.http]`, the reward service when `kind = "http"`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpRewardSection>,
    /// `[reward.python]`, the functions when `kind = "python"`. Default: none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<PythonRewardSection>,
}

impl Default for RewardSection {
    fn default() -> Self {
        Self {
            kind: RewardKind::ExactMatch,
            correct: 1.0,
            incorrect: 0.0,
            verifiers: Vec::new(),
            http: None,
            python: None,
        }
    }
}

/// One `[[reward.verifiers]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VerifierSpec {
    /// `exact_match`, `regex`, `length_penalty` or `json_valid`.
    pub kind: VerifierKind,
    /// The verifier's weight in the sum (any finite number). Default `1.0`.
    #[serde(default = "one")]
    pub weight: f64,
    /// `exact_match` only, where the answer is: `first_line` (the response up to its first
    /// newline, trimmed), `boxed` (the inside of the last `\boxed{...}`), `last_number` (the
    /// last number, compared by value: `2.50` equals `2.5`) or `regex` (capture group `answer`,
    /// or group 1, of `pattern`). Default `"first_line"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extract: Option<ExtractKind>,
    /// The regex (Rust `regex` syntax) of `kind = "regex"`, or of `extract = "regex"`, where
    /// it needs a capture group. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// `length_penalty` only: response tokens (EOS included) allowed before the penalty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_tokens: Option<usize>,
}

fn one() -> f64 {
    1.0
}

/// `[reward.http]`: the reward service. Each RL step posts its responses in chunks of
/// `rows_per_request`, up to `concurrency` at a time; an attempt that fails (refused, reset,
/// timed out, 5xx, 408, 429) is retried with exponential backoff and jitter within the
/// budget. A request that still fails fails the step: nothing of it is applied, and the
/// supervisor replays it (`[supervision]`). Keep `retry_budget_s + timeout_s` well under
/// `supervision.call_timeout_s`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpRewardSection {
    /// The endpoint that takes the POST, `http://` or `https://`. Required.
    pub url: String,
    /// Seconds one attempt may take, connect to last byte. Default `30`.
    pub timeout_s: f64,
    /// Retries after a request's first attempt. Default `3`.
    pub max_retries: u32,
    /// Seconds of backoff before the first retry, doubled for each later one (capped at
    /// `backoff_max_s`), then jittered: the wait is uniform between half of `backoff_min_s`
    /// and that value. Default `0.5`.
    pub backoff_min_s: f64,
    /// Longest backoff between two attempts, in seconds. Default `8`.
    pub backoff_max_s: f64,
    /// Seconds after a request's first attempt past which no retry starts. Default `60`.
    pub retry_budget_s: f64,
    /// Rows (responses) per request. Default `64`.
    pub rows_per_request: usize,
    /// Requests in flight at once. Default `4`.
    pub concurrency: usize,
    /// Consecutive failed attempts that open the circuit breaker; while it is open every
    /// attempt fails at once without being sent. Default `5`.
    pub breaker_failures: u32,
    /// Seconds the open breaker fails fast before letting an attempt through. Default `30`.
    pub breaker_cooldown_s: f64,
}

impl Default for HttpRewardSection {
    fn default() -> Self {
        Self {
            url: String::new(),
            timeout_s: 30.0,
            max_retries: 3,
            backoff_min_s: 0.5,
            backoff_max_s: 8.0,
            retry_budget_s: 60.0,
            rows_per_request: 64,
            concurrency: 4,
            breaker_failures: 5,
            breaker_cooldown_s: 30.0,
        }
    }
}

impl RewardSection {
    /// The weighted sum of `[[reward.verifiers]]` (for `kind = "verifiers"`).
    pub fn build_verifiers(&self) -> Result<Verifiers, RewardKeyError> {
        if self.verifiers.is_empty() {
            return Err(key_error(
                "reward.verifiers",
                "reward.kind = \"verifiers\" needs at least one [[reward.verifiers]] entry",
            ));
        }
        let terms = self
            .verifiers
            .iter()
            .enumerate()
            .map(|(i, v)| Ok((v.weight, v.build(i)?)))
            .collect::<Result<Vec<_>, RewardKeyError>>()?;
        Verifiers::new(terms).map_err(|e| key_error("reward.verifiers", e.to_string()))
    }

    /// The exact-match check that defines accuracy: the `exact_match` reward's, or the first
    /// exact-match verifier's; none for a model, a service, or verifiers without one.
    pub fn answer_check(&self) -> Result<Option<AnswerMatch>, RewardKeyError> {
        Ok(match self.kind {
            RewardKind::ExactMatch => Some(AnswerMatch::first_line()),
            RewardKind::Verifiers => self.build_verifiers()?.answer_check().cloned(),
            RewardKind::Model | RewardKind::Http | RewardKind::Python => None,
        })
    }
}

impl VerifierSpec {
    /// The verifier of entry `i`, checking the keys its kind needs and refusing the others.
    fn build(&self, i: usize) -> Result<Verifier, RewardKeyError> {
        let key = |k: &str| format!("reward.verifiers[{i}].{k}");
        let refuse = |k: &str, set: bool| match set {
            true => Err(key_error(
                key(k),
                format!("not a key of a {:?} verifier", self.kind),
            )),
            false => Ok(()),
        };
        let pattern = || {
            self.pattern
                .as_deref()
                .ok_or_else(|| key_error(key("pattern"), "missing: expected a regex"))
        };
        let bad_pattern =
            |e: oxalign_rlhf::reward::VerifierError| key_error(key("pattern"), e.to_string());
        if !self.weight.is_finite() {
            return Err(key_error(
                key("weight"),
                format!("{}: expected a finite number", self.weight),
            ));
        }
        if self.kind != VerifierKind::ExactMatch {
            refuse("extract", self.extract.is_some())?;
        }
        if self.kind != VerifierKind::LengthPenalty {
            refuse("target_tokens", self.target_tokens.is_some())?;
        }
        Ok(match self.kind {
            VerifierKind::ExactMatch => {
                let extract = match self.extract.unwrap_or_default().without_pattern() {
                    Some(fixed) => {
                        refuse("pattern", self.pattern.is_some())?;
                        fixed
                    }
                    None => Extract::regex(pattern()?).map_err(bad_pattern)?,
                };
                Verifier::ExactMatch(AnswerMatch { extract })
            }
            VerifierKind::Regex => {
                Verifier::Regex(RegexMatch::new(pattern()?).map_err(bad_pattern)?)
            }
            VerifierKind::LengthPenalty => {
                refuse("pattern", self.pattern.is_some())?;
                let target_tokens = self.target_tokens.ok_or_else(|| {
                    key_error(
                        key("target_tokens"),
                        "missing: expected the response tokens allowed",
                    )
                })?;
                Verifier::LengthPenalty(LengthPenalty { target_tokens })
            }
            VerifierKind::JsonValid => {
                refuse("pattern", self.pattern.is_some())?;
                Verifier::JsonValid(JsonValid)
            }
        })
    }
}

impl HttpRewardSection {
    /// The client settings, checked.
    pub fn config(&self) -> Result<HttpRewardConfig, RewardKeyError> {
        let key = |k: &str| format!("reward.http.{k}");
        if self.url.is_empty() {
            return Err(key_error(
                key("url"),
                "missing: expected the service's http:// or https:// URL",
            ));
        }
        check_url(&self.url).map_err(|m| key_error(key("url"), format!("{:?}: {m}", self.url)))?;
        let seconds = |k: &str, v: f64, zero_ok: bool| {
            if v.is_finite() && (v > 0.0 || (zero_ok && v == 0.0)) {
                Ok(Duration::from_secs_f64(v))
            } else {
                let want = if zero_ok { "0 or more" } else { "more than 0" };
                Err(key_error(key(k), format!("{v}: expected {want} seconds")))
            }
        };
        let at_least_one = |k: &str, v: usize| match v {
            0 => Err(key_error(key(k), "0: expected at least 1")),
            _ => Ok(v),
        };
        let min_backoff = seconds("backoff_min_s", self.backoff_min_s, true)?;
        let max_backoff = seconds("backoff_max_s", self.backoff_max_s, true)?;
        if max_backoff < min_backoff {
            return Err(key_error(
                key("backoff_max_s"),
                format!(
                    "{}: expected at least backoff_min_s ({})",
                    self.backoff_max_s, self.backoff_min_s
                ),
            ));
        }
        Ok(HttpRewardConfig {
            url: self.url.clone(),
            timeout: seconds("timeout_s", self.timeout_s, false)?,
            max_retries: self.max_retries,
            min_backoff,
            max_backoff,
            retry_budget: seconds("retry_budget_s", self.retry_budget_s, true)?,
            rows_per_request: at_least_one("rows_per_request", self.rows_per_request)?,
            concurrency: at_least_one("concurrency", self.concurrency)?,
            breaker_failures: at_least_one("breaker_failures", self.breaker_failures as usize)?
                as u32,
            breaker_cooldown: seconds("breaker_cooldown_s", self.breaker_cooldown_s, true)?,
        })
    }
}

/// Checks `[reward]` against the rest of the recipe; errors name the key.
pub(super) fn validate(
    r: &Recipe,
    bad: &impl Fn(&str, String) -> RecipeError,
) -> Result<(), RecipeError> {
    let w = &r.reward;
    let from = |e: RewardKeyError| bad(&e.key, e.message);
    for (k, v) in [
        ("reward.correct", w.correct),
        ("reward.incorrect", w.incorrect),
    ] {
        if !v.is_finite() {
            return Err(bad(k, format!("{v}: expected a finite number")));
        }
    }
    let kind = |k: &str| {
        format!(
            "set only with reward.kind = \"{k}\" (reward.kind is {:?})",
            w.kind
        )
    };
    if w.kind != RewardKind::Verifiers && !w.verifiers.is_empty() {
        return Err(bad("reward.verifiers", kind("verifiers")));
    }
    if !matches!(w.kind, RewardKind::Http | RewardKind::Python) && w.http.is_some() {
        return Err(bad("reward.http", kind("http")));
    }
    if w.kind != RewardKind::Python && w.python.is_some() {
        return Err(bad("reward.python", kind("python")));
    }
    match w.kind {
        RewardKind::ExactMatch | RewardKind::Model => return Ok(()),
        RewardKind::Verifiers => return w.build_verifiers().map(|_| ()).map_err(from),
        RewardKind::Http => {
            w.service_config().map_err(from)?;
        }
        RewardKind::Python => {
            let python = w.python.as_ref().ok_or_else(|| {
                bad(
                    "reward.python",
                    "reward.kind = \"python\" needs a [reward.python] table with file and functions".into(),
                )
            })?;
            python.check().map_err(from)?;
            w.service_config().map_err(from)?;
        }
    }
    match r.faults.iter().position(|f| f.role == "reward") {
        Some(i) => Err(bad(
            &format!("faults[{i}].role"),
            "\"reward\": a reward service runs no executor job to inject a fault into; test the service's failures with the service".into(),
        )),
        None => Ok(()),
    }
}

impl RewardSection {
    /// The HTTP client's settings of `kind = "http"` (its `[reward.http]`, required) or of
    /// `kind = "python"` (`[reward.http]` without `url`, optional; the URL is the child
    /// server's, known once it listens: a placeholder here).
    pub fn service_config(&self) -> Result<HttpRewardConfig, RewardKeyError> {
        match (self.kind, &self.http) {
            (RewardKind::Http, None) => Err(key_error(
                "reward.http",
                "reward.kind = \"http\" needs a [reward.http] table with a url",
            )),
            (RewardKind::Python, http) => {
                let mut section = http.clone().unwrap_or_default();
                if !section.url.is_empty() {
                    return Err(key_error(
                        "reward.http.url",
                        "set by reward.kind = \"python\" (the server it starts): leave it out",
                    ));
                }
                section.url = PYTHON_URL_PLACEHOLDER.into();
                section.config()
            }
            (_, http) => http.clone().unwrap_or_default().config(),
        }
    }
}

/// The URL a `kind = "python"` client is checked with before its server listens.
pub(crate) const PYTHON_URL_PLACEHOLDER: &str = "http://127.0.0.1:9/";

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(text: &str) -> Result<Recipe, RecipeError> {
        Recipe::parse(text, Path::new("r.toml"), &[])
    }

    /// The message of `--check` on `text`.
    fn refused(text: &str) -> String {
        let r = match parse(text) {
            Ok(r) => r,
            Err(e) => return e.to_string(),
        };
        super::super::validate(&r, Path::new("r.toml"))
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn the_default_reward_serializes_as_before() {
        let toml = Recipe::default().to_toml();
        let reward = &toml[toml.find("[reward]").unwrap()..];
        let reward = &reward[..reward.find("\n[").unwrap_or(reward.len())];
        assert_eq!(
            reward.trim(),
            "[reward]\nkind = \"exact_match\"\ncorrect = 1.0\nincorrect = 0.0"
        );
    }

    #[test]
    fn verifiers_and_http_parse_round_trip_and_build() {
        let text = r#"
[reward]
kind = "verifiers"

[[reward.verifiers]]
kind = "exact_match"
extract = "regex"
pattern = 'Answer: (\d+)'

[[reward.verifiers]]
kind = "length_penalty"
weight = 0.01
target_tokens = 32

[[reward.verifiers]]
kind = "json_valid"
weight = 0.5
"#;
        let r = parse(text).unwrap();
        assert_eq!(parse(&r.to_toml()).unwrap(), r);
        let v = r.reward.build_verifiers().unwrap();
        let check = r
            .reward
            .answer_check()
            .unwrap()
            .expect("an exact-match term");
        assert!(check.is_correct("so. Answer: 12", Some("12")));
        let s = oxalign_rlhf::reward::Sample {
            response: "Answer: 12",
            answer: Some("12"),
            response_tokens: 40,
        };
        assert!((v.score(&s) - (1.0 - 0.08)).abs() < 1e-12);

        let r = parse("[reward]\nkind = \"http\"\n[reward.http]\nurl = \"http://127.0.0.1:9/s\"\n")
            .unwrap();
        assert_eq!(parse(&r.to_toml()).unwrap(), r);
        let cfg = r.reward.http.as_ref().unwrap().config().unwrap();
        assert_eq!(cfg.timeout, Duration::from_secs(30));
        assert_eq!(
            (cfg.max_retries, cfg.concurrency, cfg.rows_per_request),
            (3, 4, 64)
        );
        assert!(
            r.reward.answer_check().unwrap().is_none(),
            "a service defines no accuracy"
        );
        super::super::validate(&r, Path::new("r.toml")).unwrap();
    }

    #[test]
    fn bad_reward_settings_name_their_key() {
        let http = |extra: &str| {
            format!("[reward]\nkind = \"http\"\n[reward.http]\nurl = \"http://h:1/s\"\n{extra}")
        };
        let verifier =
            |body: &str| format!("[reward]\nkind = \"verifiers\"\n[[reward.verifiers]]\n{body}");
        for (text, wants) in [
            (verifier("kind = \"judge\""), vec!["reward.verifiers", "judge", "exact_match"]),
            (
                verifier("kind = \"regex\"\npattern = \"(unclosed\""),
                vec!["reward.verifiers[0].pattern", "(unclosed", "unclosed group"],
            ),
            (
                verifier("kind = \"exact_match\"\nextract = \"regex\"\npattern = \"\\\\d+\""),
                vec!["reward.verifiers[0].pattern", "capture group"],
            ),
            (verifier("kind = \"regex\""), vec!["reward.verifiers[0].pattern", "missing"]),
            (verifier("kind = \"length_penalty\""), vec!["reward.verifiers[0].target_tokens"]),
            (
                verifier("kind = \"json_valid\"\ntarget_tokens = 3"),
                vec!["reward.verifiers[0].target_tokens", "not a key"],
            ),
            (
                verifier("kind = \"json_valid\"\nweight = 0.0"),
                vec!["reward.verifiers", "non-zero weight"],
            ),
            ("[reward]\nkind = \"verifiers\"\n".into(), vec!["reward.verifiers", "at least one"]),
            (
                "[[reward.verifiers]]\nkind = \"json_valid\"\n".into(),
                vec!["reward.verifiers", "reward.kind = \"verifiers\""],
            ),
            ("[reward]\nkind = \"http\"\n".into(), vec!["reward.http", "url"]),
            (
                "[reward]\nkind = \"http\"\n[reward.http]\nurl = \"ftp://h/s\"\n".into(),
                vec!["reward.http.url", "ftp://h/s", "http://"],
            ),
            (http("timeout_s = 0"), vec!["reward.http.timeout_s", "more than 0"]),
            (http("concurrency = 0"), vec!["reward.http.concurrency"]),
            (http("backoff_max_s = 0.1"), vec!["reward.http.backoff_max_s"]),
            (http("retries = 2"), vec!["reward.http", "retries", "max_retries"]),
            (
                format!("{}\n[[faults]]\nrole = \"reward\"\nphase = \"reward\"\nstep = 1\nkind = \"error\"\n", http("")),
                vec!["faults[0].role", "reward service"],
            ),
        ] {
            let e = refused(&text);
            for w in wants {
                assert!(e.contains(w), "{text}\nexpected {w:?} in: {e}");
            }
        }
    }
}
