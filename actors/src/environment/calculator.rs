//! The built-in `calculator` tool: evaluates an arithmetic expression (`+ - * / ^`,
//! parentheses, decimals and the usual functions, by the exmex crate) and answers with the
//! number, integers without a fraction.

use super::tools::{Tool, ToolError};
use async_trait::async_trait;
use serde_json::{json, Map, Value};

/// Longest expression the calculator takes.
const MAX_EXPRESSION_CHARS: usize = 256;

/// The calculator tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct Calculator;

#[async_trait]
impl Tool for Calculator {
    fn name(&self) -> &str {
        "calculator"
    }

    fn schema(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": "calculator",
                "description": "Evaluate an arithmetic expression.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "expression": {
                            "type": "string",
                            "description": "e.g. 12*(3+4)"
                        }
                    },
                    "required": ["expression"]
                }
            }
        })
    }

    async fn call(&self, arguments: &Map<String, Value>) -> Result<String, ToolError> {
        evaluate(arguments).map_err(|e| ToolError::Refused(e.to_string()))
    }
}

/// Why the calculator gives no number (the model is told).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
enum CalcError {
    #[error("expected a string argument \"expression\"")]
    NoExpression,
    #[error("the expression is longer than {MAX_EXPRESSION_CHARS} characters")]
    TooLong,
    #[error("{0}")]
    Syntax(String),
    #[error("the result is not a finite number")]
    NotFinite,
}

/// The value of the call's `expression`, or what is wrong with it.
fn evaluate(arguments: &Map<String, Value>) -> Result<String, CalcError> {
    let expr = match arguments.get("expression") {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Number(n)) => return Ok(n.to_string()),
        _ => return Err(CalcError::NoExpression),
    };
    if expr.chars().count() > MAX_EXPRESSION_CHARS {
        return Err(CalcError::TooLong);
    }
    let value = exmex::eval_str::<f64>(expr).map_err(|e| CalcError::Syntax(e.to_string()))?;
    format_number(value)
}

/// `value` as the calculator prints it: an integer without a fraction when it is one (up to
/// 2^53), else the shortest decimal that reads back.
fn format_number(value: f64) -> Result<String, CalcError> {
    if !value.is_finite() {
        return Err(CalcError::NotFinite);
    }
    if value.fract() == 0.0 && value.abs() < 9_007_199_254_740_992.0 {
        return Ok(format!("{}", value as i64));
    }
    Ok(format!("{value}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calculator's answer as the tool runner gets it: the number, or the message
    /// the model is told.
    async fn eval(args: Value) -> Result<String, ToolError> {
        let Value::Object(m) = args else { panic!() };
        Calculator.call(&m).await
    }

    fn told(e: ToolError) -> String {
        match e {
            ToolError::Refused(m) => m,
            ToolError::Failed(e) => panic!("the calculator never fails: {e}"),
        }
    }

    #[tokio::test]
    async fn evaluates_and_prints_integers_exactly() {
        assert_eq!(
            eval(json!({"expression": "123*45+678"})).await.unwrap(),
            "6213"
        );
        assert_eq!(eval(json!({"expression": "7/2"})).await.unwrap(), "3.5");
        assert_eq!(
            eval(json!({"expression": "-(2^10)"})).await.unwrap(),
            "-1024"
        );
        assert!(eval(json!({"expression": "1/0"}))
            .await
            .map_err(told)
            .unwrap_err()
            .contains("finite"));
        assert!(eval(json!({"expression": "((1)"})).await.is_err());
        assert!(eval(json!({"x": "1"}))
            .await
            .map_err(told)
            .unwrap_err()
            .contains("expression"));
        let long = "1+".repeat(200) + "1";
        assert!(eval(json!({ "expression": long }))
            .await
            .map_err(told)
            .unwrap_err()
            .contains("longer"));
    }
}
