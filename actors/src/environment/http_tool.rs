//! A tool served over HTTP (`[[env.http_tools]]`): each call is `POST <url>` with
//! `{"name", "arguments"}`; the server answers `{"result": "..."}` (the text the model sees)
//! or `{"error": "..."}` (a refused call: the model is told and the episode goes on). A server
//! that is down, answers an error status or does not answer in time fails the episode
//! (through the shared transport: retries, breaker, bounded answers).

use super::http::post_json;
use super::tools::{Tool, ToolError};
use super::EnvError;
use crate::service::{self, Persistence, SetupError};
use async_trait::async_trait;
use reqwest_middleware::ClientWithMiddleware;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// A tool whose calls a server answers.
pub struct HttpTool {
    name: String,
    description: String,
    parameters: Value,
    url: String,
    client: ClientWithMiddleware,
    timeout: Duration,
}

impl HttpTool {
    /// The tool `name` (described to the model by `description` and the JSON schema
    /// `parameters`) served at `url`; refuses a URL that is not `http(s)://host…`.
    pub(crate) fn new(
        name: &str,
        description: &str,
        parameters: Value,
        url: &str,
        persistence: &Persistence,
    ) -> Result<Self, SetupError> {
        let url = service::checked_url(url)?;
        Ok(Self {
            name: name.into(),
            description: description.into(),
            parameters,
            url: url.into(),
            client: service::client(persistence)?,
            timeout: persistence.timeout,
        })
    }
}

#[async_trait]
impl Tool for HttpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }

    async fn call(&self, arguments: &Map<String, Value>) -> Result<String, ToolError> {
        let body = json!({"name": self.name, "arguments": arguments});
        let who = format!("tool {:?}", self.name);
        let answer = post_json(&self.client, &self.url, &body, self.timeout, &who)
            .await
            .map_err(ToolError::Failed)?;
        match (answer.get("result"), answer.get("error")) {
            (Some(Value::String(r)), None) => Ok(r.clone()),
            (Some(r), None) if !r.is_null() => Ok(r.to_string()),
            (None, Some(Value::String(e))) => Err(ToolError::Refused(e.clone())),
            _ => Err(ToolError::Failed(EnvError::Failed {
                what: format!("{who} {}", self.url),
                message: format!(
                    "expected {{\"result\": ...}} or {{\"error\": \"...\"}}, got {}",
                    cut(&answer.to_string())
                ),
            })),
        }
    }
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::environment::{Environment, EpisodeRow, ToolRunner};
    use axum::routing::post;
    use axum::{Json, Router};
    use oxalign_models::text::tool_call::ToolCallFormat;

    fn persistence(timeout: Duration) -> Persistence {
        Persistence {
            timeout,
            max_retries: 0,
            min_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(10),
            retry_budget: Duration::from_secs(1),
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(1),
            timeouts_trip_breaker: false,
        }
    }

    /// A lookup service on 127.0.0.1: `{"key": "a"}` → `"alpha"`, other keys refused, the key
    /// `"slow"` answered after a minute, and anything else a malformed answer.
    async fn lookup_service() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/call", listener.local_addr().unwrap());
        let app = Router::new().route(
            "/call",
            post(|Json(body): Json<Value>| async move {
                assert_eq!(body["name"], "lookup");
                match body["arguments"]["key"].as_str() {
                    Some("a") => Json(json!({"result": "alpha"})),
                    Some("slow") => {
                        tokio::time::sleep(Duration::from_secs(60)).await;
                        Json(json!({}))
                    }
                    Some(k) => Json(json!({"error": format!("no key {k:?}")})),
                    None => Json(json!({"unexpected": true})),
                }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    async fn step(url: &str, args: &str) -> Result<super::super::Transition, EnvError> {
        let schema = json!({"type": "object", "properties": {"key": {"type": "string"}}});
        let p = persistence(Duration::from_millis(500));
        let tool = HttpTool::new("lookup", "Look a key up.", schema, url, &p).unwrap();
        assert_eq!(
            tool.schema()["function"]["parameters"]["properties"]["key"]["type"],
            "string"
        );
        let runner = ToolRunner::new(
            vec![Box::new(tool)],
            ToolCallFormat::Hermes,
            Duration::from_secs(5),
        );
        let row = EpisodeRow {
            prompt: "",
            answer: None,
            columns: None,
        };
        let turn =
            format!("<tool_call>{{\"name\": \"lookup\", \"arguments\": {args}}}</tool_call>");
        runner.reset(row).await?.step(0, &turn).await
    }

    #[tokio::test]
    async fn results_and_refusals_reach_the_model_and_failures_end_the_episode() {
        let url = lookup_service().await;
        let t = step(&url, "{\"key\": \"a\"}").await.unwrap();
        assert_eq!((t.reply[0].content.as_str(), t.tool_errors), ("alpha", 0));
        let t = step(&url, "{\"key\": \"b\"}").await.unwrap();
        assert_eq!(
            (t.reply[0].content.as_str(), t.tool_errors),
            ("error: no key \"b\"", 1)
        );
        let bad = step(&url, "{}").await.unwrap_err();
        assert!(bad.to_string().contains("expected {\"result\""), "{bad}");
        let slow = step(&url, "{\"key\": \"slow\"}").await.unwrap_err();
        assert!(matches!(slow, EnvError::TimedOut { .. }), "{slow}");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let down = step(&format!("http://127.0.0.1:{port}/call"), "{\"key\": \"a\"}").await;
        let down = down.unwrap_err().to_string();
        assert!(
            down.contains(&format!("tool \"lookup\" http://127.0.0.1:{port}/call")),
            "{down}"
        );
    }
}
