//! Refit buckets off the control plane. The controller writes each bucket of an update for
//! an engine role on a worker to the run folder's `refit-spool/` (written to a temporary name,
//! then renamed, so a reader never sees half a file) and sends only its name, length and
//! CRC32C over the node session; the worker reads it from the shared filesystem (the run
//! folder must already be on one both see), checks the length and the checksum, and hands
//! the bytes to its engine role, which checks every piece again against the bucket's own
//! checksums. The controller removes the file once the worker answered. A worker reads only
//! files named like the spool's, in a folder named `refit-spool`, at most the size the
//! controller announced, and deletes nothing.

use crate::batch::WeightBucket;
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};

/// The spool folder's name inside the run folder.
pub const SPOOL_DIR: &str = "refit-spool";
/// Every spooled bucket's name starts so.
const PREFIX: &str = "refit-";
/// ... and ends so.
const SUFFIX: &str = ".bucket";

/// Where a bucket waits, and what the worker must find there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpooledBucket {
    /// Its file (absolute).
    pub path: PathBuf,
    /// Index of the bucket in the update, from 0.
    pub index: usize,
    /// How many buckets the update has.
    pub count: usize,
    /// Its length, bytes.
    pub len: u64,
    /// CRC32C of its bytes.
    pub crc32c: u32,
}

/// A bucket could not be spooled or read back.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// Writing or reading the file failed.
    #[error("refit spool {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The path is not one the spool writes.
    #[error("refit spool: {0} is not a spooled bucket (expected {SPOOL_DIR}/{PREFIX}*{SUFFIX})")]
    NotSpooled(PathBuf),
    /// The file's length or checksum is not what was announced.
    #[error("refit spool {path}: {what}: the file is not the bucket the controller wrote")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        what: String,
    },
}

/// A run's spool: `<run folder>/refit-spool/`.
#[derive(Debug, Clone)]
pub(crate) struct Spool {
    dir: PathBuf,
}

impl Spool {
    /// The spool of the run folder `run_dir` (made absolute, for a worker elsewhere).
    pub fn new(run_dir: &Path) -> Self {
        let run_dir = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
        Self {
            dir: run_dir.join(SPOOL_DIR),
        }
    }

    /// Writes `bucket` of update `version` for the role in `slot`.
    pub fn write(
        &self,
        slot: u64,
        version: u64,
        bucket: &WeightBucket,
    ) -> Result<SpooledBucket, SpoolError> {
        let name = format!("{PREFIX}{slot}-{version}-{}{SUFFIX}", bucket.index);
        let path = self.dir.join(name);
        let io = |source| SpoolError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let partial = path.with_extension("partial");
        std::fs::write(&partial, &bucket.bytes).map_err(io)?;
        std::fs::rename(&partial, &path).map_err(io)?;
        Ok(SpooledBucket {
            path,
            index: bucket.index,
            count: bucket.count,
            len: bucket.bytes.len() as u64,
            crc32c: crc32c::crc32c(&bucket.bytes),
        })
    }
}

/// Removes a spooled bucket's file (already gone is fine).
pub(crate) fn remove(spooled: &SpooledBucket) {
    if let Err(e) = std::fs::remove_file(&spooled.path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!("cannot remove {}: {e}", spooled.path.display());
        }
    }
}

/// Reads a spooled bucket back, refusing a path the spool does not write, a file over
/// `max_len` bytes, and one whose length or checksum differs from what was announced.
pub(crate) fn read(spooled: &SpooledBucket, max_len: u64) -> Result<WeightBucket, SpoolError> {
    let path = &spooled.path;
    let named = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        n.starts_with(PREFIX) && n.ends_with(SUFFIX) && !n.contains(std::path::MAIN_SEPARATOR)
    });
    let in_spool = path.parent().and_then(Path::file_name) == Some(SPOOL_DIR.as_ref());
    if !named || !in_spool || !path.is_absolute() {
        return Err(SpoolError::NotSpooled(path.clone()));
    }
    let mismatch = |what: String| SpoolError::Mismatch {
        path: path.clone(),
        what,
    };
    if spooled.len > max_len {
        return Err(mismatch(format!(
            "{} bytes announced, at most {max_len}",
            spooled.len
        )));
    }
    let io = |source| SpoolError::Io {
        path: path.clone(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::with_capacity(spooled.len as usize);
    file.take(spooled.len + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 != spooled.len {
        return Err(mismatch(format!(
            "{} bytes, {} announced",
            bytes.len(),
            spooled.len
        )));
    }
    let crc = crc32c::crc32c(&bytes);
    if crc != spooled.crc32c {
        return Err(mismatch(format!(
            "CRC32C {crc:08x}, {:08x} announced",
            spooled.crc32c
        )));
    }
    Ok(WeightBucket {
        index: spooled.index,
        count: spooled.count,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket() -> WeightBucket {
        WeightBucket {
            index: 1,
            count: 3,
            bytes: (0..=255u8).cycle().take(10_000).collect(),
        }
    }

    #[test]
    fn a_spooled_bucket_reads_back_whole() {
        let run = tempfile::tempdir().unwrap();
        let spooled = Spool::new(run.path()).write(7, 42, &bucket()).unwrap();
        assert!(spooled.path.starts_with(run.path().join(SPOOL_DIR)));
        assert_eq!(read(&spooled, 1 << 20).unwrap(), bucket());
        remove(&spooled);
        assert!(!spooled.path.exists());
    }

    #[test]
    fn a_changed_file_or_a_foreign_path_is_refused() {
        let run = tempfile::tempdir().unwrap();
        let spooled = Spool::new(run.path()).write(7, 42, &bucket()).unwrap();
        let mut bytes = std::fs::read(&spooled.path).unwrap();
        bytes[5000] ^= 1;
        std::fs::write(&spooled.path, &bytes).unwrap();
        let err = read(&spooled, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("CRC32C"), "{err}");
        bytes.pop();
        std::fs::write(&spooled.path, &bytes).unwrap();
        let err = read(&spooled, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("9999 bytes, 10000 announced"), "{err}");
        let err = read(&spooled, 100).unwrap_err().to_string();
        assert!(err.contains("at most 100"), "{err}");
        for foreign in [
            "/etc/passwd",
            "/tmp/refit-spool/other.txt",
            "/tmp/x/refit-1.bucket",
        ] {
            let probe = SpooledBucket {
                path: foreign.into(),
                ..spooled.clone()
            };
            assert!(matches!(
                read(&probe, 1 << 20),
                Err(SpoolError::NotSpooled(_))
            ));
        }
    }
}
