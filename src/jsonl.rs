//! JSON Lines input and output for the CLI: read a file into `(line number, JSON value)` pairs
//! with errors that name the file and line, and write one JSON document per line to a file or
//! stdout. What a line must contain is the caller's business.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

use crate::user_error::UserError;

/// One non-blank line of a JSONL file.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonlLine {
    /// 1-based line number in the file.
    pub line: usize,
    /// The parsed JSON document.
    pub value: Value,
}

/// A [`UserError`] about `path` line `line`: `"{path}:{line}: {message}"`.
pub fn line_error(path: &Path, line: usize, message: impl std::fmt::Display) -> anyhow::Error {
    UserError::new(format!("{}:{line}: {message}", path.display())).into()
}

/// Longest input line accepted, in bytes (10 MiB). A longer line is refused before it is
/// read whole, so a huge record cannot make a command allocate gigabytes.
pub const MAX_LINE_BYTES: usize = 10 << 20;

/// Reads the next line of `reader` (without its `\n`), at most [`MAX_LINE_BYTES`] of it;
/// `Ok(None)` at the end of the file, `Err(None)` for a line over the limit.
fn next_line(reader: &mut impl BufRead) -> Result<Option<String>, Option<std::io::Error>> {
    let mut buf = Vec::new();
    let n = reader
        .by_ref()
        .take(MAX_LINE_BYTES as u64 + 1)
        .read_until(b'\n', &mut buf)
        .map_err(Some)?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
    } else if buf.len() > MAX_LINE_BYTES {
        return Err(None);
    }
    String::from_utf8(buf)
        .map(Some)
        .map_err(|e| Some(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))
}

/// The input path that means standard input.
pub const STDIN: &str = "-";

/// Reads every non-blank line of `path` as JSON; `-` ([`STDIN`]) reads standard input. A
/// missing file, a line over [`MAX_LINE_BYTES`] or a line that is not valid JSON is a
/// [`UserError`] naming the file (`-` for stdin) and line.
pub fn read_jsonl(path: &Path) -> anyhow::Result<Vec<JsonlLine>> {
    if path == Path::new(STDIN) {
        return read_lines(path, &mut std::io::stdin().lock());
    }
    let file = File::open(path)
        .map_err(|e| UserError::new(format!("cannot read input file {}: {e}", path.display())))?;
    read_lines(path, &mut BufReader::new(file))
}

/// Every non-blank line of `reader` as JSON; `path` names it in errors.
fn read_lines(path: &Path, reader: &mut impl BufRead) -> anyhow::Result<Vec<JsonlLine>> {
    let mut out = Vec::new();
    for line_no in 1.. {
        let text = match next_line(reader) {
            Ok(Some(t)) => t,
            Ok(None) => break,
            Err(None) => {
                return Err(line_error(
                    path,
                    line_no,
                    format!(
                        "the line is longer than {} MiB, the limit for one input record; split the input or pass token ids",
                        MAX_LINE_BYTES >> 20
                    ),
                ))
            }
            Err(Some(e)) => {
                return Err(line_error(path, line_no, format!("cannot read line: {e}")))
            }
        };
        if text.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&text).map_err(|e| {
            line_error(
                path,
                line_no,
                format!("not valid JSON ({e}); expected one JSON object per line"),
            )
        })?;
        out.push(JsonlLine {
            line: line_no,
            value,
        });
    }
    Ok(out)
}

/// Writes one JSON document per line to a file or to stdout.
pub struct JsonlWriter {
    out: Box<dyn Write>,
    target: String,
}

impl JsonlWriter {
    /// Writes to `path` (created or truncated), or to stdout when `path` is `None`.
    pub fn create(path: Option<&Path>) -> anyhow::Result<Self> {
        match path {
            Some(p) => {
                let file = File::create(p).map_err(|e| {
                    UserError::new(format!("cannot create output file {}: {e}", p.display()))
                })?;
                Ok(Self {
                    out: Box::new(BufWriter::new(file)),
                    target: p.display().to_string(),
                })
            }
            None => Ok(Self {
                out: Box::new(BufWriter::new(std::io::stdout())),
                target: "stdout".into(),
            }),
        }
    }

    /// Appends `record` as one line.
    pub fn write<T: Serialize>(&mut self, record: &T) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.out, record)
            .with_context(|| format!("cannot write to {}", self.target))?;
        self.out
            .write_all(b"\n")
            .with_context(|| format!("cannot write to {}", self.target))
    }

    /// Flushes buffered lines.
    pub fn finish(mut self) -> anyhow::Result<()> {
        self.out
            .flush()
            .with_context(|| format!("cannot write to {}", self.target))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::user_error::{exit_code, USER_ERROR_EXIT};

    #[test]
    fn reads_lines_with_numbers_and_skips_blanks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("in.jsonl");
        std::fs::write(&p, "{\"a\": 1}\n\n  \n[2]\n").unwrap();
        let lines = read_jsonl(&p).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!((lines[0].line, lines[1].line), (1, 4));
        assert_eq!(lines[1].value, serde_json::json!([2]));
    }

    #[test]
    fn bad_json_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("in.jsonl");
        std::fs::write(&p, "{\"a\": 1}\n{oops\n").unwrap();
        let err = read_jsonl(&p).unwrap_err();
        assert_eq!(exit_code(&err), USER_ERROR_EXIT);
        let msg = err.to_string();
        assert!(
            msg.contains("in.jsonl:2:") && msg.contains("not valid JSON"),
            "{msg}"
        );
        let err = read_jsonl(&dir.path().join("missing.jsonl")).unwrap_err();
        assert!(err.to_string().contains("missing.jsonl"), "{err}");
    }

    #[test]
    fn writer_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        let mut w = JsonlWriter::create(Some(&p)).unwrap();
        w.write(&serde_json::json!({"x": [1, 2]})).unwrap();
        w.write(&serde_json::json!({"x": []})).unwrap();
        w.finish().unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "{\"x\":[1,2]}\n{\"x\":[]}\n"
        );
    }
}
