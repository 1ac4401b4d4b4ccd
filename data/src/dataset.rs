//! [`Dataset`]: the rows of a JSONL or Parquet file in one of the schemas of `schema.rs`,
//! streamed. Loading makes one pass that checks every row (`row_scan.rs`: a malformed row
//! fails the load or, with [`OnBadRow::Skip`], is skipped and counted in the [`DataReport`])
//! and keeps only the row numbers of the good ones and how many lack a reference answer
//! ([`AnswerCoverage`]); a training item is read from disk when asked for. The
//! training order is a seeded permutation per epoch, computed once per epoch. The held-out
//! rows (a second file, or a seeded fraction of the first) are kept in memory.

use crate::answer_coverage::{first_columns, AnswerCoverage};
use crate::error::DataError;
use crate::row_file::RowFile;
use crate::row_scan::{read_all, read_one, scan, DataReport, OnBadRow};
use crate::schema::{RowContext, RowSchema, DEFAULT_ANSWER_FIELD};
use crate::splitmix64;
use oxalign_models::text::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Where a dataset comes from and how it is split.
#[derive(Debug, Clone)]
pub struct DataSpec {
    /// The training file.
    pub path: PathBuf,
    /// A held-out file; when absent, `eval_fraction` of the training file is held out.
    pub eval_path: Option<PathBuf>,
    /// Fraction of the training file's rows held out when there is no `eval_path`, in `[0, 1)`.
    pub eval_fraction: f64,
    /// Seed of the split and of the training order.
    pub seed: u64,
    /// Malformed rows: fail or skip.
    pub on_bad_row: OnBadRow,
    /// The reference-answer column of prompt rows (`data.answer_field`).
    pub answer_field: String,
}

impl DataSpec {
    /// `path` alone: no held-out rows, seed 0, failing on a bad row, answers in `answer`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            eval_path: None,
            eval_fraction: 0.0,
            seed: 0,
            on_bad_row: OnBadRow::Fail,
            answer_field: DEFAULT_ANSWER_FIELD.into(),
        }
    }

    /// What rows are parsed with: `tok` and this spec's answer column.
    pub fn row_context<'a>(&'a self, tok: Option<&'a Tokenizer>) -> RowContext<'a> {
        RowContext {
            tok,
            answer_field: &self.answer_field,
        }
    }
}

/// A streamed dataset of rows of type `T`.
pub struct Dataset<T> {
    path: PathBuf,
    file: Mutex<RowFile>,
    tok: Option<Tokenizer>,
    answer_field: String,
    train: Vec<u32>,
    eval: Vec<T>,
    seed: u64,
    order: Mutex<Option<(u64, Arc<Vec<u32>>)>>,
    report: DataReport,
    answers: AnswerCoverage,
}

impl<T: RowSchema> Dataset<T> {
    /// Opens and checks `spec`'s files. `tok` renders chat messages (rows with message lists
    /// are malformed without one).
    pub fn load(spec: &DataSpec, tok: Option<&Tokenizer>) -> Result<Self, DataError> {
        let cx = spec.row_context(tok);
        let mut report = DataReport::default();
        let mut file = RowFile::open(&spec.path)?;
        let all = usize::MAX;
        let scanned = scan::<T>(
            &mut file,
            &spec.path,
            &cx,
            spec.on_bad_row,
            all,
            &mut report,
        )?;
        let answers = AnswerCoverage {
            rows: scanned.good.len() as u64,
            lacking: scanned.lacking_answer,
            whole_file: true,
            first_columns: first_columns(&mut file)?,
        };
        let (train, eval) = match &spec.eval_path {
            Some(p) => {
                let mut ef = RowFile::open(p)?;
                let rows = scan::<T>(&mut ef, p, &cx, spec.on_bad_row, all, &mut report)?.good;
                (scanned.good, read_all::<T>(&mut ef, p, &cx, &rows)?)
            }
            None => {
                let (train, held) =
                    split(&scanned.good, spec.eval_fraction, spec.seed, &spec.path)?;
                let eval = read_all::<T>(&mut file, &spec.path, &cx, &held)?;
                (train, eval)
            }
        };
        if train.is_empty() {
            return Err(DataError::Empty {
                path: spec.path.clone(),
                skipped: report.skipped,
                expected: T::EXPECTED,
            });
        }
        Ok(Self {
            path: spec.path.clone(),
            file: Mutex::new(file),
            tok: tok.cloned(),
            answer_field: spec.answer_field.clone(),
            train,
            eval,
            seed: spec.seed,
            order: Mutex::new(None),
            report,
            answers,
        })
    }

    /// Number of training rows.
    pub fn train_len(&self) -> usize {
        self.train.len()
    }

    /// The held-out rows.
    pub fn eval_items(&self) -> &[T] {
        &self.eval
    }

    /// Rows read and skipped.
    pub fn report(&self) -> &DataReport {
        &self.report
    }

    /// The reference answers in the training file's good rows.
    pub fn answers(&self) -> &AnswerCoverage {
        &self.answers
    }

    /// Training item `index` (any `u64`): epoch `index / n` visits every row once, in a
    /// seeded order of its own.
    pub fn train_item(&self, index: u64) -> Result<T, DataError> {
        let n = self.train.len() as u64;
        let (epoch, pos) = (index / n, index % n);
        let order = self.epoch_order(epoch);
        let row = self.train[order[pos as usize] as usize] as usize;
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let cx = RowContext {
            tok: self.tok.as_ref(),
            answer_field: &self.answer_field,
        };
        read_one::<T>(&mut file, &self.path, &cx, row)
    }

    /// The permutation of epoch `epoch` (positions sorted by a per-epoch hash), cached.
    fn epoch_order(&self, epoch: u64) -> Arc<Vec<u32>> {
        let mut cached = self.order.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((e, order)) = cached.as_ref() {
            if *e == epoch {
                return order.clone();
            }
        }
        let key = |j: u32| {
            splitmix64(self.seed ^ splitmix64(epoch) ^ splitmix64((j as u64).wrapping_add(0x51)))
        };
        let mut order: Vec<u32> = (0..self.train.len() as u32).collect();
        order.sort_by_cached_key(|&j| key(j));
        let order = Arc::new(order);
        *cached = Some((epoch, order.clone()));
        order
    }
}

/// Splits the good rows into (train, held out): the `fraction` of rows with the smallest
/// seeded hash are held out; both keep file order.
fn split(
    good: &[u32],
    fraction: f64,
    seed: u64,
    path: &Path,
) -> Result<(Vec<u32>, Vec<u32>), DataError> {
    if !(0.0..1.0).contains(&fraction) {
        return Err(DataError::Split {
            path: path.to_path_buf(),
            message: format!("data.eval_fraction = {fraction}: expected a number in [0, 1)"),
        });
    }
    let k = (good.len() as f64 * fraction).round() as usize;
    if k == 0 {
        return Ok((good.to_vec(), Vec::new()));
    }
    let mut ranked = good.to_vec();
    ranked.sort_by_cached_key(|&i| splitmix64(seed ^ 0xE7A1 ^ splitmix64(i as u64)));
    let mut held = ranked[..k].to_vec();
    let mut train = ranked[k..].to_vec();
    held.sort_unstable();
    train.sort_unstable();
    Ok((train, held))
}
