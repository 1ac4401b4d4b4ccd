//! Writes a run directory as events arrive: `metrics.jsonl`, `timeline.jsonl` and
//! `samples.jsonl` (one line per record, flushed per line), `actors.json`, `recipe.toml`, `run.json`, and when asked
//! TensorBoard event files of the metrics (`tensorboard/`). It does not write
//! checkpoints (the checkpoint writer does) and never reads anything back (see `replay.rs`).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::actor_info::ActorInfo;
use super::error::MonitorError;
use super::event::{RunFinished, RunInfo};
use super::samples::StepSamples;
use super::span::Span;
use super::step_metrics::StepMetrics;
use super::tensorboard::TensorBoardLog;

/// File and folder names inside a run directory.
pub mod files {
    /// One [`StepMetrics`](crate::monitor::StepMetrics) JSON object per line.
    pub const METRICS: &str = "metrics.jsonl";
    /// One [`SampleRecord`](crate::monitor::SampleRecord) JSON object per line
    /// (`rl.log_samples` per RL step).
    pub const SAMPLES: &str = "samples.jsonl";
    /// One [`Span`](crate::monitor::Span) JSON object per line.
    pub const TIMELINE: &str = "timeline.jsonl";
    /// The resolved recipe (TOML), as received in `RunInfo::recipe_toml`.
    pub const RECIPE: &str = "recipe.toml";
    /// Last-known actor table: a JSON array of `ActorInfo`.
    pub const ACTORS: &str = "actors.json";
    /// Run name, start time and, once ended, how it ended (JSON `RunRecord`).
    pub const RUN: &str = "run.json";
    /// Folder holding one `step_<N>` folder per checkpoint.
    pub const CHECKPOINTS: &str = "checkpoints";
}

/// Contents of `run.json`: the run's identity and, once it ended, its outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Run name.
    pub name: String,
    /// Start, ms since the Unix epoch.
    pub started_unix_ms: u64,
    /// How it ended; `None` while running (or if it crashed before saying).
    #[serde(default)]
    pub finished: Option<RunFinished>,
}

/// Minimum time between two rewrites of `actors.json` caused by heartbeats alone, in ms.
const HEARTBEAT_WRITE_INTERVAL_MS: u64 = 1_000;

/// Appender for one run directory.
#[derive(Debug)]
pub struct RunLog {
    dir: PathBuf,
    metrics: File,
    timeline: File,
    samples: File,
    tensorboard: Option<TensorBoardLog>,
    run: Option<RunRecord>,
    last_actors_write_ms: u64,
}

pub(super) fn io_err(
    action: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> MonitorError {
    let path = path.to_path_buf();
    move |source| MonitorError::Io {
        action,
        path,
        source,
    }
}

fn open_append(path: &Path) -> Result<File, MonitorError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_err("cannot open for appending", path))
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a reader never sees
/// a half-written file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), MonitorError> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes).map_err(io_err("cannot write", &tmp))?;
    fs::rename(&tmp, path).map_err(io_err("cannot rename into", path))
}

impl RunLog {
    /// Opens (creating if needed) the run directory and its three logs for appending.
    pub fn open(dir: &Path) -> Result<Self, MonitorError> {
        fs::create_dir_all(dir).map_err(io_err("cannot create run directory", dir))?;
        Ok(RunLog {
            dir: dir.to_path_buf(),
            metrics: open_append(&dir.join(files::METRICS))?,
            timeline: open_append(&dir.join(files::TIMELINE))?,
            samples: open_append(&dir.join(files::SAMPLES))?,
            tensorboard: None,
            run: None,
            last_actors_write_ms: 0,
        })
    }

    /// Also writes every step's metrics to a new TensorBoard event file in
    /// `tensorboard/`.
    pub fn enable_tensorboard(&mut self) -> Result<(), MonitorError> {
        self.tensorboard = Some(TensorBoardLog::create(&self.dir)?);
        Ok(())
    }

    /// The run directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn append(file: &mut File, path: PathBuf, value: &impl Serialize) -> Result<(), MonitorError> {
        let mut line = serde_json::to_string(value).map_err(|e| MonitorError::Io {
            action: "cannot serialise a record for",
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        line.push('\n');
        // one write per line, then flush: a reader (or a crash) sees whole lines only
        file.write_all(line.as_bytes())
            .and_then(|_| file.flush())
            .map_err(io_err("cannot append to", &path))
    }

    /// Appends one line to `metrics.jsonl` (and one event to the TensorBoard file).
    pub fn append_metrics(&mut self, m: &StepMetrics) -> Result<(), MonitorError> {
        let path = self.dir.join(files::METRICS);
        let jsonl = Self::append(&mut self.metrics, path, m);
        let events = match self.tensorboard.as_mut() {
            Some(tb) => tb.append(m),
            None => Ok(()),
        };
        jsonl.and(events)
    }

    /// Appends one line to `timeline.jsonl`.
    pub fn append_span(&mut self, s: &Span) -> Result<(), MonitorError> {
        let path = self.dir.join(files::TIMELINE);
        Self::append(&mut self.timeline, path, s)
    }

    /// Appends one line per sample of `s` to `samples.jsonl`.
    pub fn append_samples(&mut self, s: &StepSamples) -> Result<(), MonitorError> {
        let path = self.dir.join(files::SAMPLES);
        for record in &s.samples {
            Self::append(&mut self.samples, path.clone(), record)?;
        }
        Ok(())
    }

    /// Flushes the logs to stable storage (`fsync`), so every line appended so far
    /// survives a crash.
    pub fn sync(&mut self) -> Result<(), MonitorError> {
        if let Some(tb) = self.tensorboard.as_mut() {
            tb.sync()?;
        }
        let metrics = self.dir.join(files::METRICS);
        self.metrics
            .sync_data()
            .map_err(io_err("cannot fsync", &metrics))?;
        let timeline = self.dir.join(files::TIMELINE);
        self.timeline
            .sync_data()
            .map_err(io_err("cannot fsync", &timeline))?;
        let samples = self.dir.join(files::SAMPLES);
        self.samples
            .sync_data()
            .map_err(io_err("cannot fsync", &samples))
    }

    /// Writes `recipe.toml` (unless it already holds exactly this text) and `run.json`.
    pub fn write_run(&mut self, run: &RunInfo) -> Result<(), MonitorError> {
        let recipe = self.dir.join(files::RECIPE);
        if fs::read_to_string(&recipe).ok().as_deref() != Some(run.recipe_toml.as_str()) {
            write_atomic(&recipe, run.recipe_toml.as_bytes())?;
        }
        self.run = Some(RunRecord {
            name: run.name.clone(),
            started_unix_ms: run.started_unix_ms,
            finished: None,
        });
        self.write_run_record()
    }

    /// Records the outcome in `run.json`.
    pub fn write_finished(&mut self, finished: &RunFinished) -> Result<(), MonitorError> {
        let name_from_dir = || {
            self.dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let record = self.run.get_or_insert_with(|| RunRecord {
            name: name_from_dir(),
            started_unix_ms: 0,
            finished: None,
        });
        record.finished = Some(finished.clone());
        self.write_run_record()
    }

    fn write_run_record(&self) -> Result<(), MonitorError> {
        if let Some(record) = &self.run {
            let path = self.dir.join(files::RUN);
            let bytes = serde_json::to_vec_pretty(record).map_err(|e| MonitorError::Io {
                action: "cannot serialise",
                path: path.clone(),
                source: std::io::Error::other(e),
            })?;
            write_atomic(&path, &bytes)?;
        }
        Ok(())
    }

    /// Rewrites `actors.json`. With `force == false` (a heartbeat-only change) it writes at
    /// most once per second; `now_ms` is the current time in ms since the Unix epoch.
    pub fn write_actors(
        &mut self,
        actors: &[ActorInfo],
        force: bool,
        now_ms: u64,
    ) -> Result<(), MonitorError> {
        if !force && now_ms.saturating_sub(self.last_actors_write_ms) < HEARTBEAT_WRITE_INTERVAL_MS
        {
            return Ok(());
        }
        let path = self.dir.join(files::ACTORS);
        let bytes = serde_json::to_vec_pretty(actors).map_err(|e| MonitorError::Io {
            action: "cannot serialise",
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(&path, &bytes)?;
        self.last_actors_write_ms = now_ms;
        Ok(())
    }
}
