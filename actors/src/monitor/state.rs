//! The monitor's in-memory picture of a run, built by applying `MonitorEvent`s, and the
//! serialisable `MonitorSnapshot` the dashboard reads. No I/O and no actor here.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::actor_info::{ActorInfo, ActorUpdate};
use super::checkpoint_info::CheckpointInfo;
use super::event::{MonitorEvent, RunFinished, RunInfo};
use super::samples::StepSamples;
use super::span::Span;
use super::step_metrics::StepMetrics;

/// How much history the monitor keeps in memory (the log files keep everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonitorLimits {
    /// Keep metrics of the last this many steps. Default 10 000.
    pub metric_steps: usize,
    /// Keep spans of the last this many steps (by highest step seen). Default 8.
    pub span_steps: usize,
    /// Hard cap on the number of spans kept, oldest dropped first. Default 20 000.
    pub max_spans: usize,
}

impl Default for MonitorLimits {
    fn default() -> Self {
        MonitorLimits {
            metric_steps: 10_000,
            span_steps: 8,
            max_spans: 20_000,
        }
    }
}

/// What an applied event changed in the actor table; the run log uses it to decide when
/// to rewrite `actors.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActorChange {
    /// The actor table did not change.
    None,
    /// Only heartbeat times, throughput or queue depths changed.
    Heartbeat,
    /// An actor was added, or its status, work, restarts, role or devices changed.
    Record,
}

/// A copy of the monitor's state at one moment, as served by `/api/state`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct MonitorSnapshot {
    /// The run, once the controller reported it.
    pub run: Option<RunInfo>,
    /// How the run ended, once it has.
    pub finished: Option<RunFinished>,
    /// Actors in registration order.
    pub actors: Vec<ActorInfo>,
    /// Metrics of the last `limits.metric_steps` steps, ascending by step.
    pub metrics: Vec<StepMetrics>,
    /// Spans of the last `limits.span_steps` steps, in arrival order.
    pub spans: Vec<Span>,
    /// Checkpoints written, ascending by step.
    pub checkpoints: Vec<CheckpointInfo>,
    /// The rollout samples of the latest step that logged some (`rl.log_samples`).
    #[serde(default)]
    pub samples: Option<StepSamples>,
    /// The retention limits that produced this snapshot.
    pub limits: MonitorLimits,
}

impl MonitorSnapshot {
    /// The actor named `name`, if registered.
    pub fn actor(&self, name: &str) -> Option<&ActorInfo> {
        self.actors.iter().find(|a| a.name == name)
    }

    /// Metrics of the highest step reported, if any.
    pub fn latest_metrics(&self) -> Option<&StepMetrics> {
        self.metrics.last()
    }

    /// Latest wall-clock stamp anywhere in the snapshot (ms since the Unix epoch), used as
    /// "now" when replaying a finished run. 0 for an empty snapshot.
    pub fn latest_unix_ms(&self) -> u64 {
        let mut t = 0;
        if let Some(r) = &self.run {
            t = t.max(r.started_unix_ms);
        }
        if let Some(f) = &self.finished {
            t = t.max(f.finished_unix_ms);
        }
        for a in &self.actors {
            t = t.max(a.last_heartbeat_unix_ms);
        }
        for m in &self.metrics {
            t = t.max(m.unix_ms);
        }
        for s in &self.spans {
            t = t.max(s.end_unix_ms);
        }
        for c in &self.checkpoints {
            t = t.max(c.unix_ms);
        }
        t
    }
}

/// The live state: events go in through [`MonitorState::apply`], snapshots come out.
#[derive(Debug, Clone, Default)]
pub struct MonitorState {
    limits: MonitorLimits,
    run: Option<RunInfo>,
    finished: Option<RunFinished>,
    actors: Vec<ActorInfo>,
    metrics: BTreeMap<u64, StepMetrics>,
    spans: VecDeque<Span>,
    max_span_step: Option<u64>,
    checkpoints: Vec<CheckpointInfo>,
    samples: Option<StepSamples>,
}

impl MonitorState {
    /// An empty state keeping history within `limits`.
    pub fn new(limits: MonitorLimits) -> Self {
        MonitorState {
            limits,
            ..Default::default()
        }
    }

    /// A state holding what `snapshot` holds (e.g. a run directory loaded to resume),
    /// trimmed to `limits`.
    pub fn from_snapshot(snapshot: &MonitorSnapshot, limits: MonitorLimits) -> Self {
        let mut state = MonitorState::new(limits);
        if let Some(run) = &snapshot.run {
            state.apply(&MonitorEvent::Run(run.clone()));
        }
        for a in &snapshot.actors {
            state.apply(&MonitorEvent::Actor(a.clone()));
        }
        for m in &snapshot.metrics {
            state.push_metrics(m);
        }
        for s in &snapshot.spans {
            state.push_span(s.clone());
        }
        for c in &snapshot.checkpoints {
            state.push_checkpoint(c.clone());
        }
        state.samples = snapshot.samples.clone();
        state.finished = snapshot.finished.clone();
        state
    }

    /// The retention limits.
    pub fn limits(&self) -> MonitorLimits {
        self.limits
    }

    /// Applies one event and says what it changed in the actor table.
    pub fn apply(&mut self, event: &MonitorEvent) -> ActorChange {
        match event {
            MonitorEvent::Run(run) => {
                self.run = Some(run.clone());
                ActorChange::None
            }
            MonitorEvent::Actor(info) => self.upsert_actor(info),
            MonitorEvent::ActorUpdate(update) => self.update_actor(update),
            MonitorEvent::Span(span) => {
                self.push_span(span.clone());
                ActorChange::None
            }
            MonitorEvent::Metrics(m) => {
                self.push_metrics(m);
                ActorChange::None
            }
            MonitorEvent::Samples(s) => {
                self.samples = Some(s.clone());
                ActorChange::None
            }
            MonitorEvent::Checkpoint(c) => {
                self.push_checkpoint(c.clone());
                ActorChange::None
            }
            MonitorEvent::Finished(f) => {
                self.finished = Some(f.clone());
                ActorChange::None
            }
        }
    }

    /// A copy of the whole state.
    pub fn snapshot(&self) -> MonitorSnapshot {
        MonitorSnapshot {
            run: self.run.clone(),
            finished: self.finished.clone(),
            actors: self.actors.clone(),
            metrics: self.metrics.values().cloned().collect(),
            spans: self.spans.iter().cloned().collect(),
            checkpoints: self.checkpoints.clone(),
            samples: self.samples.clone(),
            limits: self.limits,
        }
    }

    /// The actor table, in registration order.
    pub fn actors(&self) -> &[ActorInfo] {
        &self.actors
    }

    fn upsert_actor(&mut self, info: &ActorInfo) -> ActorChange {
        match self.actors.iter_mut().find(|a| a.name == info.name) {
            Some(existing) => {
                // An actor its supervisor respawned registers again: the count carries over.
                let mut info = info.clone();
                info.restarts = info.restarts.max(existing.restarts);
                if *existing == info {
                    return ActorChange::None;
                }
                let record_changed = existing.role != info.role
                    || existing.devices != info.devices
                    || existing.status != info.status
                    || existing.current_work != info.current_work
                    || existing.restarts != info.restarts;
                *existing = info;
                if record_changed {
                    ActorChange::Record
                } else {
                    ActorChange::Heartbeat
                }
            }
            None => {
                self.actors.push(info.clone());
                ActorChange::Record
            }
        }
    }

    fn update_actor(&mut self, update: &ActorUpdate) -> ActorChange {
        let (actor, is_new) = match self.actors.iter().position(|a| a.name == update.actor) {
            Some(i) => (&mut self.actors[i], false),
            None => {
                self.actors
                    .push(ActorInfo::new(&update.actor, &update.actor, Vec::new()));
                let last = self.actors.len() - 1;
                (&mut self.actors[last], true)
            }
        };
        let before = (
            actor.status,
            actor.current_work.clone(),
            actor.restarts,
            actor.last_heartbeat_unix_ms,
            actor.queue_depth,
            actor.items_per_sec,
        );
        actor.apply(update);
        if is_new
            || before.0 != actor.status
            || before.1 != actor.current_work
            || before.2 != actor.restarts
        {
            ActorChange::Record
        } else if before.3 != actor.last_heartbeat_unix_ms
            || before.4 != actor.queue_depth
            || before.5.to_bits() != actor.items_per_sec.to_bits()
        {
            ActorChange::Heartbeat
        } else {
            ActorChange::None
        }
    }

    fn push_span(&mut self, span: Span) {
        let max = self.max_span_step.map_or(span.step, |m| m.max(span.step));
        let keep_from = (max + 1).saturating_sub(self.limits.span_steps as u64);
        if span.step < keep_from {
            return; // older than the window: nothing to show
        }
        if self.max_span_step != Some(max) {
            self.max_span_step = Some(max);
            self.spans.retain(|s| s.step >= keep_from);
        }
        self.spans.push_back(span);
        while self.spans.len() > self.limits.max_spans.max(1) {
            self.spans.pop_front();
        }
    }

    fn push_metrics(&mut self, m: &StepMetrics) {
        match self.metrics.get_mut(&m.step) {
            Some(existing) => existing.merge(m),
            None => {
                self.metrics.insert(m.step, m.clone());
            }
        }
        while self.metrics.len() > self.limits.metric_steps.max(1) {
            self.metrics.pop_first();
        }
    }

    fn push_checkpoint(&mut self, c: CheckpointInfo) {
        match self.checkpoints.iter_mut().find(|x| x.step == c.step) {
            Some(existing) => *existing = c,
            None => {
                let at = self.checkpoints.partition_point(|x| x.step < c.step);
                self.checkpoints.insert(at, c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::{ActorStatus, RunOutcome};

    fn span(actor: &str, step: u64) -> MonitorEvent {
        MonitorEvent::Span(Span::new(
            actor,
            "generate",
            step,
            step * 100,
            step * 100 + 50,
        ))
    }

    #[test]
    fn actors_register_update_and_report_changes() {
        let mut s = MonitorState::new(MonitorLimits::default());
        let info = ActorInfo::new("policy", "policy", vec!["cpu:0".into()]);
        assert_eq!(
            s.apply(&MonitorEvent::Actor(info.clone())),
            ActorChange::Record
        );
        assert_eq!(s.apply(&MonitorEvent::Actor(info)), ActorChange::None);

        let mut hb = ActorUpdate::heartbeat("policy");
        hb.unix_ms = 1_000;
        assert_eq!(s.apply(&hb.clone().into()), ActorChange::Heartbeat);
        assert_eq!(s.apply(&hb.into()), ActorChange::None);

        let work = ActorUpdate::working("policy", "generate step 1").with_queue_depth(2);
        assert_eq!(s.apply(&work.into()), ActorChange::Record);
        let p = &s.snapshot().actors[0];
        assert_eq!(p.status, ActorStatus::Working);
        assert_eq!(p.current_work.as_deref(), Some("generate step 1"));
        assert_eq!(p.queue_depth, 2);
        assert_eq!(p.devices, vec!["cpu:0".to_string()]);

        // a bare heartbeat leaves status and work alone
        let mut hb = ActorUpdate::heartbeat("policy");
        hb.unix_ms += 10;
        s.apply(&hb.into());
        assert_eq!(s.snapshot().actors[0].status, ActorStatus::Working);

        s.apply(&ActorUpdate::restarting("policy").into());
        s.apply(&ActorUpdate::idle("policy").into());
        let p = &s.snapshot().actors[0];
        assert_eq!(
            (p.status, p.restarts, p.current_work.clone()),
            (ActorStatus::Idle, 1, None)
        );
        // a respawned actor registers again and keeps its restart count
        s.apply(&ActorInfo::new("policy", "policy", vec!["cpu:0".into()]).into());
        assert_eq!(s.snapshot().actors[0].restarts, 1);

        // an update for an unknown actor registers it
        assert_eq!(
            s.apply(&ActorUpdate::heartbeat("critic").into()),
            ActorChange::Record
        );
        let names: Vec<_> = s.actors().iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["policy", "critic"]);
    }

    #[test]
    fn spans_keep_only_the_last_steps() {
        let mut s = MonitorState::new(MonitorLimits {
            span_steps: 2,
            ..Default::default()
        });
        for step in 0..5 {
            s.apply(&span("policy", step));
            s.apply(&span("reward", step));
        }
        s.apply(&span("policy", 1)); // late arrival outside the window is dropped
        let steps: Vec<u64> = s.snapshot().spans.iter().map(|x| x.step).collect();
        assert_eq!(steps, [3, 3, 4, 4]);
    }

    #[test]
    fn metrics_are_sorted_merged_and_capped() {
        let mut s = MonitorState::new(MonitorLimits {
            metric_steps: 3,
            ..Default::default()
        });
        for step in [2u64, 0, 1, 3] {
            s.apply(&StepMetrics::new(step).with("kl", step as f64).into());
        }
        s.apply(&StepMetrics::new(3).with("entropy", 1.5).into());
        let snap = s.snapshot();
        let steps: Vec<u64> = snap.metrics.iter().map(|m| m.step).collect();
        assert_eq!(steps, [1, 2, 3]);
        let last = snap.latest_metrics().unwrap();
        assert_eq!(
            (last.get("kl"), last.get("entropy")),
            (Some(3.0), Some(1.5))
        );
    }

    #[test]
    fn checkpoints_sorted_and_run_recorded() {
        let mut s = MonitorState::new(MonitorLimits::default());
        for step in [20u64, 10, 20] {
            s.apply(
                &CheckpointInfo {
                    step,
                    path: format!("ckpt/step_{step}"),
                    unix_ms: step,
                }
                .into(),
            );
        }
        s.apply(
            &RunFinished {
                outcome: RunOutcome::Completed,
                steps_completed: 20,
                finished_unix_ms: 99,
                message: None,
            }
            .into(),
        );
        let snap = s.snapshot();
        let steps: Vec<u64> = snap.checkpoints.iter().map(|c| c.step).collect();
        assert_eq!(steps, [10, 20]);
        assert_eq!(snap.finished.as_ref().unwrap().steps_completed, 20);
        assert_eq!(snap.latest_unix_ms(), 99);
    }
}
