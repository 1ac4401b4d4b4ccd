//! Appends a run's step metrics to a TensorBoard event file, one record per step, written
//! whole so that a reader (or a crash) sees whole records only.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use prost::Message;

use super::proto::{Event, SessionLog, Summary, SummaryValue};
use super::record::frame;
use crate::monitor::error::MonitorError;
use crate::monitor::run_log::io_err;
use crate::monitor::step_metrics::StepMetrics;

/// The run directory's folder of event files (`tensorboard --logdir <run>/tensorboard`).
pub const TENSORBOARD_DIR: &str = "tensorboard";

/// One process's event file.
#[derive(Debug)]
pub struct TensorBoardLog {
    path: PathBuf,
    file: File,
    /// Whether this file has logged a step yet (its first step opens a session).
    started: bool,
}

impl TensorBoardLog {
    /// Creates a new event file in `<run_dir>/tensorboard/` (a resumed run adds a file;
    /// TensorBoard reads the folder's files in name order, which is time order).
    pub fn create(run_dir: &Path) -> Result<Self, MonitorError> {
        let dir = run_dir.join(TENSORBOARD_DIR);
        fs::create_dir_all(&dir).map_err(io_err("cannot create", &dir))?;
        let now_ms = crate::monitor::clock::unix_ms_now();
        let name = format!(
            "events.out.tfevents.{:010}.{:03}.oxalign.{}",
            now_ms / 1000,
            now_ms % 1000,
            std::process::id()
        );
        let path = dir.join(name);
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(io_err("cannot create", &path))?;
        let mut log = TensorBoardLog {
            path,
            file,
            started: false,
        };
        log.write(&Event {
            wall_time: now_ms as f64 / 1000.0,
            file_version: Some("brain.Event:2".into()),
            ..Event::default()
        })?;
        Ok(log)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one step's metrics; the first step of this file is preceded by a session
    /// start at that step, so a resumed run's replayed steps replace the older file's.
    pub fn append(&mut self, m: &StepMetrics) -> Result<(), MonitorError> {
        let wall_time = m.unix_ms as f64 / 1000.0;
        let step = i64::try_from(m.step).unwrap_or(i64::MAX);
        if !self.started {
            self.write(&Event {
                wall_time,
                step,
                session_log: Some(SessionLog {
                    status: SessionLog::START,
                }),
                ..Event::default()
            })?;
            self.started = true;
        }
        let value = m
            .values
            .iter()
            .map(|(tag, v)| SummaryValue {
                tag: tag.clone(),
                simple_value: Some(*v as f32),
            })
            .collect();
        self.write(&Event {
            wall_time,
            step,
            summary: Some(Summary { value }),
            ..Event::default()
        })
    }

    /// Flushes the file to stable storage.
    pub fn sync(&mut self) -> Result<(), MonitorError> {
        self.file
            .sync_data()
            .map_err(io_err("cannot fsync", &self.path))
    }

    fn write(&mut self, event: &Event) -> Result<(), MonitorError> {
        let record = frame(&event.encode_to_vec());
        self.file
            .write_all(&record)
            .map_err(io_err("cannot append to", &self.path))
    }
}
