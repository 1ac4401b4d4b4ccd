//! A run's files: the run folder claimed by one process ([`folder`]), checkpoints and the loop
//! state they carry ([`checkpoint`]), their checksums ([`checksums`]) and the run files they
//! keep copies of ([`copies`]), writing them ([`saving`], retried on I/O errors by [`retry`])
//! and choosing the one to resume from ([`resume_point`]).
//!
//! `runs/<name>/` holds:
//! * `recipe.toml` (the resolved recipe), `run.json` and `actors.json` (written by the monitor,
//!   `monitor/run_log.rs`);
//! * `metrics.jsonl` (one line per RL step, exactly once across resumes) and `timeline.jsonl`;
//! * `checkpoints/sft_N/` and `checkpoints/step_N/`, each with `checksums.json` over every
//!   file, `state.json` (the loop state, written last) included, and copies of `recipe.toml`
//!   and (RL) of the metrics of its steps and of the reference's checksums ([`copies`]); with
//!   batches generated ahead waiting, their `rollouts_ahead.json`. The monitor's logs are
//!   synced before a checkpoint commits (`MonitorHandle::sync`). A checkpoint a resume rejects
//!   is moved to `checkpoints/rejected/`;
//! * `reference/` (the frozen reference, with its own `checksums.json`) and `summary.json`;
//! * `init/` (the fresh model of a recipe without `model.path`) and `final/` (the model an
//!   `sft`, `rm` or `dpo` run saves);
//! * `.oxalign.lock`, flocked by the process training in the folder (`folder::RunLock`).
//!
//! The README describes resume, fallback to the newest valid checkpoint, and the divergence
//! guards.

pub mod checkpoint;
pub(crate) mod checksums;
pub mod copies;
pub mod folder;
pub mod resume_point;
pub(crate) mod retry;
pub(crate) mod saving;
