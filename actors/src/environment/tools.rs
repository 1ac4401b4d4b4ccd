//! The built-in tool runner: an [`Environment`] whose episodes answer each tool call of the
//! model's turn with the tool's result (one `tool` message per call, in order) and end at
//! the first turn without a call. A call that does not parse, names an unknown tool or fails
//! is answered with an `error: …` message (the model sees it and can retry); a tool that does
//! not answer within the time limit fails the episode.

use super::{EnvError, Environment, Episode, EpisodeRow, Transition};
use async_trait::async_trait;
use oxalign_models::text::chat_template::ChatMessage;
use oxalign_models::text::tool_call::ToolCallFormat;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// Why a tool call gave no result.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolError {
    /// The call is wrong (bad arguments, a failing computation): the model is told, with
    /// this message, and the episode goes on.
    Refused(String),
    /// The tool itself failed (its server is down or does not answer): the episode fails.
    Failed(EnvError),
}

/// A tool the model may call.
#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &str;
    /// Its JSON schema as chat templates take it (`{"type": "function", "function": …}`).
    fn schema(&self) -> Value;
    /// The result of a call.
    async fn call(&self, arguments: &Map<String, Value>) -> Result<String, ToolError>;
}

/// Runs the declared tools for the model.
#[derive(Clone)]
pub struct ToolRunner {
    tools: Arc<Vec<Box<dyn Tool>>>,
    format: ToolCallFormat,
    timeout: Duration,
}

impl ToolRunner {
    /// A runner of `tools`, reading calls in `format`, each call limited to `timeout`.
    pub fn new(tools: Vec<Box<dyn Tool>>, format: ToolCallFormat, timeout: Duration) -> Self {
        Self {
            tools: Arc::new(tools),
            format,
            timeout,
        }
    }

    /// The tools' schemas, for the chat template's `tools=`.
    pub fn schemas(&self) -> Value {
        Value::Array(self.tools.iter().map(|t| t.schema()).collect())
    }

    /// The result message of one call.
    async fn answer(
        &self,
        name: &str,
        args: &Map<String, Value>,
    ) -> Result<(String, bool), EnvError> {
        let Some(tool) = self.tools.iter().find(|t| t.name() == name) else {
            let known: Vec<&str> = self.tools.iter().map(|t| t.name()).collect();
            return Ok((
                format!("error: unknown tool {name:?} (tools: {})", known.join(", ")),
                false,
            ));
        };
        match tokio::time::timeout(self.timeout, tool.call(args)).await {
            Ok(Ok(result)) => Ok((result, true)),
            Ok(Err(ToolError::Refused(message))) => Ok((format!("error: {message}"), false)),
            Ok(Err(ToolError::Failed(e))) => Err(e),
            Err(_) => Err(EnvError::TimedOut {
                what: format!("tool {name:?}"),
                secs: self.timeout.as_secs_f64(),
            }),
        }
    }
}

#[async_trait]
impl Environment for ToolRunner {
    async fn reset(&self, _row: EpisodeRow<'_>) -> Result<Box<dyn Episode>, EnvError> {
        Ok(Box::new(ToolEpisode {
            runner: self.clone(),
        }))
    }
}

struct ToolEpisode {
    runner: ToolRunner,
}

#[async_trait]
impl Episode for ToolEpisode {
    async fn step(&mut self, _index: usize, turn: &str) -> Result<Transition, EnvError> {
        let calls = self.runner.format.parse(turn);
        if calls.is_empty() {
            return Ok(Transition {
                done: true,
                ..Transition::default()
            });
        }
        let mut out = Transition {
            tool_calls: calls.len(),
            ..Transition::default()
        };
        for call in calls {
            let (text, ok) = match call {
                Ok(c) => self.runner.answer(&c.name, &c.arguments).await?,
                Err(e) => (format!("error: {e}"), false),
            };
            out.tool_errors += usize::from(!ok);
            out.reply.push(ChatMessage::new("tool", text));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::environment::Calculator;

    struct Sleeper;

    #[async_trait]
    impl Tool for Sleeper {
        fn name(&self) -> &str {
            "sleep"
        }
        fn schema(&self) -> Value {
            Value::Null
        }
        async fn call(&self, _: &Map<String, Value>) -> Result<String, ToolError> {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(String::new())
        }
    }

    fn runner() -> ToolRunner {
        let tools: Vec<Box<dyn Tool>> = vec![Box::new(Calculator), Box::new(Sleeper)];
        ToolRunner::new(tools, ToolCallFormat::Hermes, Duration::from_millis(200))
    }

    async fn step(turn: &str) -> Result<Transition, EnvError> {
        let row = EpisodeRow {
            prompt: "",
            answer: None,
            columns: None,
        };
        runner().reset(row).await?.step(0, turn).await
    }

    #[tokio::test]
    async fn answers_each_call_in_order_and_ends_on_a_plain_turn() {
        let turn = "<tool_call>{\"name\": \"calculator\", \"arguments\": {\"expression\": \"6*7\"}}</tool_call>\
                    <tool_call>{\"name\": \"nope\"}</tool_call><tool_call>oops</tool_call>";
        let t = step(turn).await.unwrap();
        assert!(!t.done);
        assert_eq!((t.tool_calls, t.tool_errors), (3, 2));
        assert_eq!(t.reply[0], ChatMessage::new("tool", "42"));
        assert!(t.reply[1]
            .content
            .starts_with("error: unknown tool \"nope\""));
        assert!(t.reply[2].content.starts_with("error: malformed tool call"));
        assert!(step("The answer is 42.").await.unwrap().done);
        assert_eq!(runner().schemas().as_array().unwrap().len(), 2);
    }

    #[tokio::test]
    async fn a_tool_that_hangs_fails_the_episode_in_time() {
        let t = step("<tool_call>{\"name\": \"sleep\"}</tool_call>").await;
        assert!(matches!(t, Err(EnvError::TimedOut { .. })), "{t:?}");
    }
}
