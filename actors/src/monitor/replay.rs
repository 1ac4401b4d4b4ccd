//! Rebuilds a `MonitorSnapshot` from a run directory written by `RunLog` (for replaying a
//! finished run on the dashboard, or resuming a run). It only reads; it never repairs files.

use std::fs;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::actor_info::ActorInfo;
use super::checkpoint_info::CheckpointInfo;
use super::error::MonitorError;
use super::event::{MonitorEvent, RunInfo};
use super::run_log::{files, RunRecord};
use super::samples::{SampleRecord, StepSamples};
use super::span::Span;
use super::state::{MonitorLimits, MonitorSnapshot, MonitorState};
use super::step_metrics::StepMetrics;

/// Loads the state of the run in `dir`:
/// * `metrics.jsonl`, `timeline.jsonl`: every line applied in order (a last line without
///   its newline, cut by a crash mid-write, is skipped; any other bad line is an error
///   naming the file and line);
/// * `samples.jsonl`: optional; the last step's samples are kept;
/// * `recipe.toml` and `run.json` (name, start, outcome): optional; without `run.json`
///   the run is named after the folder and starts at its earliest record;
/// * `actors.json`: optional; without it every actor seen on the timeline is listed as
///   idle with its role guessed from its name (`policy-1` -> `policy`);
/// * `checkpoints/step_<N>/` folders: one checkpoint each, stamped with the folder's
///   modification time.
///
/// `limits` bounds the history kept, as for the live monitor.
pub fn load_run_dir(dir: &Path, limits: MonitorLimits) -> Result<MonitorSnapshot, MonitorError> {
    check_run_dir(dir)?;
    let metrics: Vec<StepMetrics> = read_jsonl(
        &dir.join(files::METRICS),
        "StepMetrics object (with a \"step\" key)",
    )?;
    let spans: Vec<Span> = read_jsonl(&dir.join(files::TIMELINE), "Span object")?;
    let samples: Vec<SampleRecord> = read_jsonl(&dir.join(files::SAMPLES), "sample record")?;
    let recipe = read_optional_text(&dir.join(files::RECIPE))?;
    let record: Option<RunRecord> = read_optional_json(&dir.join(files::RUN), "a run record")?;
    let actors: Option<Vec<ActorInfo>> =
        read_optional_json(&dir.join(files::ACTORS), "a JSON array of actor records")?;
    let checkpoints = list_checkpoints(&dir.join(files::CHECKPOINTS))?;

    let mut state = MonitorState::new(limits);
    let earliest = spans
        .iter()
        .map(|s| s.start_unix_ms)
        .chain(metrics.iter().map(|m| m.unix_ms).filter(|&t| t > 0))
        .min()
        .unwrap_or(0);
    state.apply(&MonitorEvent::Run(run_info(
        dir,
        record.as_ref(),
        recipe,
        earliest,
    )));
    let actors = actors.unwrap_or_else(|| actors_on_timeline(&spans));
    for a in actors {
        state.apply(&MonitorEvent::Actor(a));
    }
    for m in metrics {
        state.apply(&MonitorEvent::Metrics(m));
    }
    for s in spans {
        state.apply(&MonitorEvent::Span(s));
    }
    for c in checkpoints {
        state.apply(&MonitorEvent::Checkpoint(c));
    }
    if let Some(s) = StepSamples::latest_of(samples) {
        state.apply(&MonitorEvent::Samples(s));
    }
    if let Some(f) = record.and_then(|r| r.finished) {
        state.apply(&MonitorEvent::Finished(f));
    }
    Ok(state.snapshot())
}

/// Refuses a path that is not a folder, or a folder holding none of a run's files.
fn check_run_dir(dir: &Path) -> Result<(), MonitorError> {
    let meta = fs::metadata(dir).map_err(|source| MonitorError::Io {
        action: "cannot open run directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let known = [
        files::METRICS,
        files::TIMELINE,
        files::RECIPE,
        files::RUN,
        files::ACTORS,
    ];
    if !meta.is_dir() || !known.iter().any(|f| dir.join(f).is_file()) {
        return Err(MonitorError::NotARunDir {
            path: dir.to_path_buf(),
        });
    }
    Ok(())
}

/// The run's name and start: from `run.json` when there is one, else the folder's name and
/// the `earliest` record.
fn run_info(
    dir: &Path,
    record: Option<&RunRecord>,
    recipe: Option<String>,
    earliest: u64,
) -> RunInfo {
    let name = record.map(|r| r.name.clone()).unwrap_or_else(|| {
        dir.canonicalize()
            .unwrap_or_else(|_| dir.to_path_buf())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    RunInfo {
        name,
        recipe_toml: recipe.unwrap_or_default(),
        started_unix_ms: record
            .map(|r| r.started_unix_ms)
            .filter(|&t| t > 0)
            .unwrap_or(earliest),
    }
}

/// Every actor seen on the timeline, in order of first appearance, idle, with its role
/// guessed from its name.
fn actors_on_timeline(spans: &[Span]) -> Vec<ActorInfo> {
    let mut names: Vec<&str> = Vec::new();
    for s in spans {
        if !names.contains(&s.actor.as_str()) {
            names.push(&s.actor);
        }
    }
    names
        .into_iter()
        .map(|n| ActorInfo::new(n, guess_role(n), Vec::new()))
        .collect()
}

/// `policy-1` / `policy_1` -> `policy`; other names are their own role.
fn guess_role(name: &str) -> String {
    let trimmed = name.trim_end_matches(|c: char| c.is_ascii_digit());
    match trimmed.strip_suffix(['-', '_']) {
        Some(base) if trimmed.len() < name.len() && !base.is_empty() => base.to_string(),
        _ => name.to_string(),
    }
}

fn read_optional_text(path: &Path) -> Result<Option<String>, MonitorError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(MonitorError::Io {
            action: "cannot read",
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn read_optional_json<T: DeserializeOwned>(
    path: &Path,
    expected: &'static str,
) -> Result<Option<T>, MonitorError> {
    match read_optional_text(path)? {
        None => Ok(None),
        Some(text) => {
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|source| MonitorError::BadFile {
                    path: path.to_path_buf(),
                    expected,
                    source,
                })
        }
    }
}

fn read_jsonl<T: DeserializeOwned>(
    path: &Path,
    expected: &'static str,
) -> Result<Vec<T>, MonitorError> {
    let Some(text) = read_optional_text(path)? else {
        return Ok(Vec::new());
    };
    let complete = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if !complete && i + 1 == lines.len() => {
                tracing::warn!(path = %path.display(), line = i + 1, "skipping a partially written last line");
            }
            Err(source) => {
                return Err(MonitorError::BadLine {
                    path: path.to_path_buf(),
                    line: i + 1,
                    expected,
                    source,
                })
            }
        }
    }
    Ok(out)
}

/// Lists `step_<N>` folders (any zero padding) under `dir`, ascending by step.
fn list_checkpoints(dir: &Path) -> Result<Vec<CheckpointInfo>, MonitorError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(MonitorError::Io {
                action: "cannot list",
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path: PathBuf = entry.path();
        if !path.is_dir() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(step) = name
            .strip_prefix("step_")
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let unix_ms = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        out.push(CheckpointInfo {
            step,
            path: path.to_string_lossy().into_owned(),
            unix_ms,
        });
    }
    out.sort_by_key(|c| c.step);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_is_guessed_from_replica_names() {
        assert_eq!(guess_role("policy-1"), "policy");
        assert_eq!(guess_role("reward_12"), "reward");
        assert_eq!(guess_role("critic"), "critic");
        assert_eq!(guess_role("gpu0"), "gpu0");
        assert_eq!(guess_role("-1"), "-1");
    }
}
