//! Per-file SHA-256 checksums of a checkpoint folder (`checksums.json`): written when a
//! checkpoint is sealed, verified before a run resumes from it. It does not decide which
//! checkpoint to resume from (`resume_point.rs` does).

use crate::controller::error::CheckpointError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The manifest file inside a checkpoint folder.
pub(crate) const CHECKSUMS_FILE: &str = "checksums.json";
/// Value of the manifest's `format` key.
const FORMAT: &str = "oxalign-checksums-v1";

/// Contents of [`CHECKSUMS_FILE`]: every file of the checkpoint (paths relative to the
/// checkpoint folder, `/`-separated) and its SHA-256 in lowercase hex.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    sha256: BTreeMap<String, String>,
}

/// SHA-256 of a file, in lowercase hex (streamed: a checkpoint may be large).
pub(crate) fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Every regular file under `dir`, as `/`-separated paths relative to it, sorted; `skip`
/// names top-level files to leave out.
fn files_under(dir: &Path, skip: &[&str]) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let child = rel.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                stack.push(child);
            } else {
                let name = child
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                if !skip.contains(&name.as_str()) {
                    out.push(name);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Hashes every file of the staged checkpoint `dir` except `skip` (top-level names) and
/// writes [`CHECKSUMS_FILE`].
pub(crate) fn write_manifest(dir: &Path, skip: &[&str]) -> std::io::Result<()> {
    let mut skip = skip.to_vec();
    skip.push(CHECKSUMS_FILE);
    let mut sha256 = BTreeMap::new();
    for rel in files_under(dir, &skip)? {
        sha256.insert(rel.clone(), sha256_file(&dir.join(&rel))?);
    }
    let manifest = Manifest {
        format: FORMAT.into(),
        sha256,
    };
    let text = serde_json::to_string_pretty(&manifest).map_err(std::io::Error::other)?;
    std::fs::write(dir.join(CHECKSUMS_FILE), text)
}

/// Checks every file listed in `dir`'s [`CHECKSUMS_FILE`] against its SHA-256, and that
/// each of `required` (relative paths) is listed.
pub fn verify(dir: &Path, required: &[String]) -> Result<(), CheckpointError> {
    verify_against(&dir.join(CHECKSUMS_FILE), dir, required)
}

/// Checks the files of `dir` against the manifest at `path` (which may live elsewhere,
/// e.g. a checkpoint's record of the reference): every listed file matches its SHA-256 and
/// each of `required` is listed.
pub(crate) fn verify_against(
    path: &Path,
    dir: &Path,
    required: &[String],
) -> Result<(), CheckpointError> {
    let path = path.to_path_buf();
    let text = std::fs::read_to_string(&path).map_err(|source| CheckpointError::Unreadable {
        path: path.clone(),
        source,
    })?;
    let manifest: Manifest =
        serde_json::from_str(&text).map_err(|source| CheckpointError::BadJson {
            path: path.clone(),
            source,
        })?;
    for r in required {
        if !manifest.sha256.contains_key(r) {
            return Err(CheckpointError::MissingFile {
                checkpoint: dir.to_path_buf(),
                file: r.clone(),
            });
        }
    }
    for (rel, want) in &manifest.sha256 {
        let file = dir.join(rel);
        if !file.is_file() {
            return Err(CheckpointError::MissingFile {
                checkpoint: dir.to_path_buf(),
                file: rel.clone(),
            });
        }
        let got = sha256_file(&file).map_err(|source| CheckpointError::Unreadable {
            path: file.clone(),
            source,
        })?;
        if &got != want {
            return Err(CheckpointError::ChecksumMismatch {
                checkpoint: dir.to_path_buf(),
                file: rel.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flipped_byte_or_a_missing_file_fails_verification() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("policy/optimizer")).unwrap();
        std::fs::write(d.join("policy/model.safetensors"), b"weights").unwrap();
        std::fs::write(d.join("policy/optimizer/optimizer.json"), b"{}").unwrap();
        std::fs::write(d.join("state.json"), b"{}").unwrap();
        write_manifest(d, &["state.json"]).unwrap();
        let required = vec!["policy/optimizer/optimizer.json".to_string()];
        verify(d, &required).unwrap();
        let missing = vec!["critic/model.safetensors".to_string()];
        assert!(matches!(
            verify(d, &missing),
            Err(CheckpointError::MissingFile { .. })
        ));

        std::fs::write(d.join("policy/model.safetensors"), b"weightz").unwrap();
        let err = verify(d, &required).unwrap_err();
        assert!(
            err.to_string().contains("policy/model.safetensors"),
            "{err}"
        );
        std::fs::write(d.join("policy/model.safetensors"), b"weights").unwrap();
        std::fs::remove_file(d.join("policy/optimizer/optimizer.json")).unwrap();
        assert!(matches!(
            verify(d, &[]),
            Err(CheckpointError::MissingFile { .. })
        ));
    }
}
