//! `--set key.path=value` overrides applied to a recipe's TOML tree before typing.
//!
//! The value is parsed as a TOML value (`3`, `1e-4`, `true`, `"x"`, `[1, 2]`); anything
//! that does not parse is taken as a bare string. Type checking happens later, with the
//! recipe's own error messages.

use super::RecipeError;

/// Sets `key.path` in `tree` to the value in `spec` (`key.path=value`), creating tables.
pub(crate) fn apply_override(tree: &mut toml::Table, spec: &str) -> Result<(), RecipeError> {
    let err = |message: &str| RecipeError::Override {
        spec: spec.to_string(),
        message: message.to_string(),
    };
    let (key, raw) = spec
        .split_once('=')
        .ok_or_else(|| err("expected key.path=value, e.g. rl.lr=1e-5"))?;
    let parts: Vec<&str> = key.trim().split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(err("the key path has an empty part"));
    }
    let value = parse_value(raw.trim());
    let (last, tables) = parts.split_last().expect("split yields at least one part");
    let mut cur = tree;
    for (i, part) in tables.iter().enumerate() {
        let entry = cur
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry.as_table_mut().ok_or_else(|| {
            err(&format!(
                "`{}` is a value, not a table",
                parts[..=i].join(".")
            ))
        })?;
    }
    cur.insert(last.to_string(), value);
    Ok(())
}

fn parse_value(raw: &str) -> toml::Value {
    let doc = format!("v = {raw}");
    match doc.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.into())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}
