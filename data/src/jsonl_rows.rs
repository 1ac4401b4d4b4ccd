//! Random access to the rows of a JSONL file: one pass records where each non-empty line
//! starts (24 bytes per row), then a row is read from disk when asked for. Memory does not
//! grow with the size of the rows, only with their number. It does not interpret the JSON.

use crate::error::{DataError, RowAt};
use crate::RowError;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Longest line read (bytes); a longer one is a malformed row, never read whole.
pub const MAX_LINE_BYTES: u64 = 10 << 20;

/// Where one non-empty line is.
#[derive(Debug, Clone, Copy)]
struct LineRef {
    offset: u64,
    len: u64,
    line: u64,
}

/// An indexed JSONL file.
pub(crate) struct JsonlRows {
    path: PathBuf,
    file: File,
    lines: Vec<LineRef>,
}

impl JsonlRows {
    /// Indexes `path` (one streaming pass; nothing is kept but the offsets).
    pub fn open(path: &Path) -> Result<Self, DataError> {
        let io = |source| DataError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let mut reader = BufReader::with_capacity(1 << 16, file.try_clone().map_err(io)?);
        let mut lines = Vec::new();
        let (mut offset, mut start, mut line) = (0u64, 0u64, 1u64);
        let mut blank = true;
        loop {
            let buf = reader.fill_buf().map_err(io)?;
            if buf.is_empty() {
                break;
            }
            let n = buf.len();
            for (i, &b) in buf.iter().enumerate() {
                if b == b'\n' {
                    let end = offset + i as u64;
                    if !blank {
                        lines.push(LineRef {
                            offset: start,
                            len: end - start,
                            line,
                        });
                    }
                    start = end + 1;
                    line += 1;
                    blank = true;
                } else if !b.is_ascii_whitespace() {
                    blank = false;
                }
            }
            offset += n as u64;
            reader.consume(n);
        }
        if !blank {
            lines.push(LineRef {
                offset: start,
                len: offset - start,
                line,
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            lines,
        })
    }

    /// Number of non-empty lines.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Where row `i` is.
    pub fn at(&self, i: usize) -> RowAt {
        RowAt::Line(self.lines[i].line)
    }

    /// Row `i` as JSON; a line that is not JSON (or too long) is `Err(message)`.
    pub fn read(&mut self, i: usize) -> Result<Result<serde_json::Value, RowError>, DataError> {
        let l = self.lines[i];
        if l.len > MAX_LINE_BYTES {
            return Ok(Err(RowError::TooLong {
                bytes: l.len,
                limit_mib: MAX_LINE_BYTES >> 20,
            }));
        }
        let io = |source| DataError::Io {
            path: self.path.clone(),
            source,
        };
        self.file.seek(SeekFrom::Start(l.offset)).map_err(io)?;
        let mut buf = vec![0u8; l.len as usize];
        self.file.read_exact(&mut buf).map_err(io)?;
        Ok(serde_json::from_slice(&buf).map_err(RowError::NotJson))
    }
}
