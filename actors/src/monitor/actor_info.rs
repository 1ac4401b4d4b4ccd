//! Health of one actor as the monitor sees it: the full record (`ActorInfo`) and the
//! partial update (`ActorUpdate`) a role actor sends as heartbeat. No supervision logic here.

use serde::{Deserialize, Serialize};

/// Life-cycle state of an actor, shown as the card colour on the dashboard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorStatus {
    /// Alive, waiting for work.
    Idle,
    /// Processing a batch (see `ActorInfo::current_work`).
    Working,
    /// Stopped on an error; the supervisor decides what happens next.
    Failed,
    /// Being restarted by its supervisor from its last good state.
    Restarting,
}

impl ActorStatus {
    /// Every status, in display order (used for one-hot Prometheus series).
    pub const ALL: [ActorStatus; 4] = [
        ActorStatus::Idle,
        ActorStatus::Working,
        ActorStatus::Failed,
        ActorStatus::Restarting,
    ];

    /// The lower-case wire name (`"idle"`, `"working"`, `"failed"`, `"restarting"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ActorStatus::Idle => "idle",
            ActorStatus::Working => "working",
            ActorStatus::Failed => "failed",
            ActorStatus::Restarting => "restarting",
        }
    }
}

impl std::fmt::Display for ActorStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything the dashboard shows about one actor (one card).
///
/// `name` is unique per actor (`"policy"`, or `"policy-1"` for a second replica);
/// `role` is the role it plays (`"controller"`, `"policy"`, `"reference"`, `"reward"`,
/// `"critic"`, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorInfo {
    /// Unique actor name; the key of the monitor's actor table.
    pub name: String,
    /// Role the actor plays; several replicas may share one role.
    pub role: String,
    /// Devices the actor owns, as device specs (`"cpu"`, `"cuda:0"`).
    #[serde(default)]
    pub devices: Vec<String>,
    /// Current life-cycle state.
    pub status: ActorStatus,
    /// What it is doing now, e.g. `"generate step 12"`; `None` when idle.
    #[serde(default)]
    pub current_work: Option<String>,
    /// Number of requests waiting in its inbound queue (batches, not tokens).
    #[serde(default)]
    pub queue_depth: u64,
    /// Throughput of its current kind of work, in items per second (sequences for the
    /// engine and scorers, samples for trainers).
    #[serde(default)]
    pub items_per_sec: f64,
    /// Wall-clock time of its last heartbeat, ms since the Unix epoch.
    #[serde(default)]
    pub last_heartbeat_unix_ms: u64,
    /// How many times its supervisor restarted it.
    #[serde(default)]
    pub restarts: u32,
}

impl ActorInfo {
    /// A fresh idle actor with no heartbeat yet.
    pub fn new(name: impl Into<String>, role: impl Into<String>, devices: Vec<String>) -> Self {
        ActorInfo {
            name: name.into(),
            role: role.into(),
            devices,
            status: ActorStatus::Idle,
            current_work: None,
            queue_depth: 0,
            items_per_sec: 0.0,
            last_heartbeat_unix_ms: 0,
            restarts: 0,
        }
    }

    /// Applies a partial update (see [`ActorUpdate`] for the exact rules).
    pub fn apply(&mut self, update: &ActorUpdate) {
        self.last_heartbeat_unix_ms = self.last_heartbeat_unix_ms.max(update.unix_ms);
        if let Some(status) = update.status {
            self.status = status;
            self.current_work = update.current_work.clone();
        }
        if let Some(depth) = update.queue_depth {
            self.queue_depth = depth;
        }
        if let Some(rate) = update.items_per_sec {
            self.items_per_sec = rate;
        }
        if update.restarted {
            self.restarts = self.restarts.saturating_add(1);
        }
    }
}

/// A partial update of one actor's record: a heartbeat, optionally with a new status.
///
/// Rules the monitor applies:
/// * `unix_ms` becomes `last_heartbeat_unix_ms` (it never moves backwards);
/// * when `status` is `Some`, both `status` and `current_work` are replaced (so
///   `status: Some(Idle), current_work: None` clears the work); when `status` is `None`
///   (a bare heartbeat) both are left as they were;
/// * `queue_depth` / `items_per_sec` replace the old values when `Some`;
/// * `restarted: true` adds one to `restarts`.
///
/// An update for an actor the monitor does not know yet registers it with
/// `role = name` and no devices; send a full [`ActorInfo`] first to set those.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorUpdate {
    /// Name of the actor (key in the actor table).
    pub actor: String,
    /// Time of this heartbeat, ms since the Unix epoch.
    pub unix_ms: u64,
    /// New status, or `None` for a bare heartbeat.
    #[serde(default)]
    pub status: Option<ActorStatus>,
    /// New current work; only read when `status` is `Some`.
    #[serde(default)]
    pub current_work: Option<String>,
    /// New inbound queue depth (batches).
    #[serde(default)]
    pub queue_depth: Option<u64>,
    /// New throughput, items per second.
    #[serde(default)]
    pub items_per_sec: Option<f64>,
    /// `true` when the supervisor has just restarted the actor.
    #[serde(default)]
    pub restarted: bool,
}

impl ActorUpdate {
    fn at_now(actor: impl Into<String>) -> Self {
        ActorUpdate {
            actor: actor.into(),
            unix_ms: super::clock::unix_ms_now(),
            status: None,
            current_work: None,
            queue_depth: None,
            items_per_sec: None,
            restarted: false,
        }
    }

    /// A bare heartbeat stamped now: status and work unchanged.
    pub fn heartbeat(actor: impl Into<String>) -> Self {
        Self::at_now(actor)
    }

    /// The actor started `work` (e.g. `"generate step 3"`), stamped now.
    pub fn working(actor: impl Into<String>, work: impl Into<String>) -> Self {
        ActorUpdate {
            status: Some(ActorStatus::Working),
            current_work: Some(work.into()),
            ..Self::at_now(actor)
        }
    }

    /// The actor finished its work and waits, stamped now.
    pub fn idle(actor: impl Into<String>) -> Self {
        ActorUpdate {
            status: Some(ActorStatus::Idle),
            ..Self::at_now(actor)
        }
    }

    /// The actor failed with `error` (shown as its current work), stamped now.
    pub fn failed(actor: impl Into<String>, error: impl Into<String>) -> Self {
        ActorUpdate {
            status: Some(ActorStatus::Failed),
            current_work: Some(error.into()),
            ..Self::at_now(actor)
        }
    }

    /// The supervisor is restarting the actor (counts one restart), stamped now.
    pub fn restarting(actor: impl Into<String>) -> Self {
        ActorUpdate {
            status: Some(ActorStatus::Restarting),
            restarted: true,
            ..Self::at_now(actor)
        }
    }

    /// Sets the queue depth (batches waiting).
    pub fn with_queue_depth(mut self, depth: u64) -> Self {
        self.queue_depth = Some(depth);
        self
    }

    /// Sets the throughput (items per second).
    pub fn with_items_per_sec(mut self, rate: f64) -> Self {
        self.items_per_sec = Some(rate);
        self
    }
}
