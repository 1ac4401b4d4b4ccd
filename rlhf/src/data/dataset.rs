//! [`Dataset`]: the rows of a JSONL or Parquet file in one of the schemas of `schema.rs`,
//! streamed. Loading makes one pass that checks every row (a malformed row fails the load
//! or, with [`OnBadRow::Skip`], is skipped and counted in the [`DataReport`]) and keeps only
//! the row numbers of the good ones; a training item is read from disk when asked for. The
//! training order is a seeded permutation per epoch, computed once per epoch. The held-out
//! rows (a second file, or a seeded fraction of the first) are kept in memory.

use super::error::DataError;
use super::row_file::RowFile;
use super::schema::RowSchema;
use super::splitmix64;
use oxalign_models::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// What to do with a malformed row (`data.on_bad_row`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBadRow {
    /// Stop with an error naming the file, the row and what was expected (the default).
    #[default]
    Fail,
    /// Skip the row, count it and report it.
    Skip,
}

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
}

/// Rows seen and skipped while loading (training and held-out files together).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DataReport {
    /// Rows read.
    pub rows: u64,
    /// Rows skipped as malformed.
    pub skipped: u64,
    /// The first few skipped rows, `file: where: what`.
    pub first_skipped: Vec<String>,
}

/// How many skipped rows the report spells out.
const REPORTED_SKIPS: usize = 5;

/// A streamed dataset of rows of type `T`.
pub struct Dataset<T> {
    path: PathBuf,
    file: Mutex<RowFile>,
    tok: Option<Tokenizer>,
    train: Vec<u32>,
    eval: Vec<T>,
    seed: u64,
    order: Mutex<Option<(u64, Arc<Vec<u32>>)>>,
    report: DataReport,
}

impl<T: RowSchema> Dataset<T> {
    /// Opens and checks `spec`'s files. `tok` renders chat messages (rows with message lists
    /// are malformed without one).
    pub fn load(spec: &DataSpec, tok: Option<&Tokenizer>) -> Result<Self, DataError> {
        let mut report = DataReport::default();
        let mut file = RowFile::open(&spec.path)?;
        let good = scan::<T>(&mut file, &spec.path, tok, spec.on_bad_row, &mut report)?;
        let (train, eval) = match &spec.eval_path {
            Some(p) => {
                let mut ef = RowFile::open(p)?;
                let rows = scan::<T>(&mut ef, p, tok, spec.on_bad_row, &mut report)?;
                (good, read_all::<T>(&mut ef, p, tok, &rows)?)
            }
            None => {
                let (train, held) = split(&good, spec.eval_fraction, spec.seed, &spec.path)?;
                let eval = read_all::<T>(&mut file, &spec.path, tok, &held)?;
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
            train,
            eval,
            seed: spec.seed,
            order: Mutex::new(None),
            report,
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

    /// Training item `index` (any `u64`): epoch `index / n` visits every row once, in a
    /// seeded order of its own.
    pub fn train_item(&self, index: u64) -> Result<T, DataError> {
        let n = self.train.len() as u64;
        let (epoch, pos) = (index / n, index % n);
        let order = self.epoch_order(epoch);
        let row = self.train[order[pos as usize] as usize] as usize;
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        read_one::<T>(&mut file, &self.path, self.tok.as_ref(), row)
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

/// Checks every row of `file`; returns the good rows' numbers.
fn scan<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    tok: Option<&Tokenizer>,
    policy: OnBadRow,
    report: &mut DataReport,
) -> Result<Vec<u32>, DataError> {
    let mut good = Vec::with_capacity(file.len());
    for i in 0..file.len() {
        report.rows += 1;
        match parse::<T>(file, path, tok, i)? {
            Ok(_) => good.push(i as u32),
            Err(e) if policy == OnBadRow::Skip => {
                report.skipped += 1;
                if report.first_skipped.len() < REPORTED_SKIPS {
                    report.first_skipped.push(short(&e));
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(good)
}

/// `file: where: what` of a row error, without the hint about skipping.
fn short(e: &DataError) -> String {
    match e {
        DataError::Row {
            path, at, message, ..
        } => format!("{}: {at}: {message}", path.display()),
        other => other.to_string(),
    }
}

/// Row `i`, parsed: the outer error is I/O, the inner one a malformed row.
fn parse<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    tok: Option<&Tokenizer>,
    i: usize,
) -> Result<Result<T, DataError>, DataError> {
    let parsed = file.read(i)?.and_then(|v| T::from_row(&v, tok));
    Ok(parsed.map_err(|message| DataError::Row {
        path: path.to_path_buf(),
        at: file.at(i),
        message: Box::new(message),
        expected: T::EXPECTED,
    }))
}

fn read_one<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    tok: Option<&Tokenizer>,
    i: usize,
) -> Result<T, DataError> {
    parse::<T>(file, path, tok, i)?
}

fn read_all<T: RowSchema>(
    file: &mut RowFile,
    path: &Path,
    tok: Option<&Tokenizer>,
    rows: &[u32],
) -> Result<Vec<T>, DataError> {
    rows.iter()
        .map(|&i| read_one::<T>(file, path, tok, i as usize))
        .collect()
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
