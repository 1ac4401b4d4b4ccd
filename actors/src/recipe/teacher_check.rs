//! The teacher of on-policy distillation must speak the policy's vocabulary: its log-prob of
//! a token id is compared with the student's for the same id, so the two models need the
//! same vocabulary size and the same tokenizer (every token string mapped to the same id).
//! Checked by `--check` when the policy is a folder, and at the start of every distillation
//! run (a freshly initialised policy only has its tokenizer then).

use oxalign_models::text::tokenizer::Tokenizer;
use oxalign_models::ModelConfig;
use std::path::{Path, PathBuf};

/// Why a teacher cannot teach this policy.
#[derive(Debug, thiserror::Error)]
pub enum TeacherError {
    /// A config or tokenizer could not be read.
    #[error("{}: cannot read its {what}: {message}", dir.display())]
    Read {
        /// The model folder.
        dir: PathBuf,
        /// `config.json` or `tokenizer`.
        what: &'static str,
        /// The reader's message.
        message: String,
    },
    /// The models' vocabulary sizes differ.
    #[error(
        "the teacher's vocab_size is {teacher}, the policy's {policy}: distillation compares \
         log-probs token id by token id, so both need the same vocabulary"
    )]
    VocabSize {
        /// The teacher's `vocab_size`.
        teacher: usize,
        /// The policy's `vocab_size`.
        policy: usize,
    },
    /// The tokenizers map some token to different ids.
    #[error(
        "the teacher's tokenizer differs from the policy's ({count} token(s), e.g. {example}): \
         distillation compares log-probs token id by token id, so both need the same tokenizer"
    )]
    Tokenizer {
        /// Tokens mapped differently (or present in one only).
        count: usize,
        /// One of them, described.
        example: String,
    },
}

fn config(dir: &Path) -> Result<ModelConfig, TeacherError> {
    ModelConfig::from_file(&dir.join("config.json")).map_err(|e| TeacherError::Read {
        dir: dir.to_path_buf(),
        what: "config.json",
        message: e.to_string(),
    })
}

fn tokenizer(dir: &Path) -> Result<Tokenizer, TeacherError> {
    Tokenizer::from_dir(dir).map_err(|e| TeacherError::Read {
        dir: dir.to_path_buf(),
        what: "tokenizer",
        message: e.to_string(),
    })
}

/// Checks that the model folder `teacher` has the vocabulary of the policy folder `policy`:
/// the same `vocab_size` and a tokenizer mapping every token to the same id.
pub(crate) fn same_vocabulary(policy: &Path, teacher: &Path) -> Result<(), TeacherError> {
    let (p, t) = (config(policy)?.vocab_size, config(teacher)?.vocab_size);
    if p != t {
        return Err(TeacherError::VocabSize {
            teacher: t,
            policy: p,
        });
    }
    let pv = tokenizer(policy)?.inner().get_vocab(true);
    let tv = tokenizer(teacher)?.inner().get_vocab(true);
    let mut differ: Vec<String> = pv
        .iter()
        .filter(|(tok, id)| tv.get(*tok) != Some(id))
        .map(|(tok, id)| {
            format!(
                "{tok:?} is {id} for the policy, {:?} for the teacher",
                tv.get(tok)
            )
        })
        .chain(
            tv.keys()
                .filter(|tok| !pv.contains_key(*tok))
                .map(|tok| format!("{tok:?} is only in the teacher's")),
        )
        .collect();
    differ.sort();
    match differ.first() {
        None => Ok(()),
        Some(example) => Err(TeacherError::Tokenizer {
            count: differ.len(),
            example: example.clone(),
        }),
    }
}
