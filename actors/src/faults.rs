//! Fault injection: the recipe's `[[faults]]` as a plan shared by the controller and the
//! role jobs. The controller says which RL step is running; a role's job consults the plan
//! on its executor thread, right before its own work, so an injected panic takes the real
//! panic path (caught by the executor, the replica's state poisoned). Each fault fires once.
//! It decides nothing about recovery (see `controller/supervisor.rs`).

use crate::error::Cause;
use crate::recipe::{FaultKind, FaultSpec};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an injected hang blocks its thread at most when nobody releases it.
const HANG_LIMIT: Duration = Duration::from_secs(3600);

/// A fault of the recipe and whether it has fired.
#[derive(Debug)]
struct Armed {
    spec: FaultSpec,
    fired: AtomicBool,
}

#[derive(Debug, Default)]
struct Inner {
    faults: Vec<Armed>,
    /// The RL step now running; 0 outside RL steps (setup, SFT, evaluation).
    step: AtomicU64,
    /// Bumped by [`FaultPlan::release_hangs`]; a hung job waits for it to change.
    release: AtomicU64,
}

/// The faults to inject into a run; cheap to clone (shared). The default plan is empty.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    inner: Arc<Inner>,
}

impl FaultPlan {
    /// A plan over the recipe's `[[faults]]`, none fired yet.
    pub fn new(specs: &[FaultSpec]) -> Self {
        let faults = specs
            .iter()
            .map(|spec| Armed {
                spec: spec.clone(),
                fired: AtomicBool::new(false),
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                faults,
                ..Inner::default()
            }),
        }
    }

    /// Sets the RL step now running (0: none).
    pub fn set_step(&self, step: u64) {
        self.inner.step.store(step, Ordering::SeqCst);
    }

    /// Ends every injected hang now blocking a thread (its job then fails). The supervisor
    /// calls it before rebuilding a role, so no retired thread stays blocked.
    pub fn release_hangs(&self) {
        self.inner.release.fetch_add(1, Ordering::SeqCst);
    }

    /// The fault due for `role`'s job of `phase` at the current step, marked fired.
    fn take(&self, role: &str, phase: &str) -> Option<FaultKind> {
        let step = self.inner.step.load(Ordering::SeqCst);
        if step == 0 {
            return None;
        }
        self.inner
            .faults
            .iter()
            .find(|f| {
                f.spec.role == role
                    && f.spec.phase == phase
                    && f.spec.step == step
                    && !f.fired.swap(true, Ordering::SeqCst)
            })
            .map(|f| f.spec.kind)
    }

    /// Runs inside `role`'s job of `phase`, on its executor thread: panics, fails or hangs
    /// when a fault is due, and returns `Ok` otherwise.
    pub fn inject(&self, role: &str, phase: &str) -> Result<(), Cause> {
        let Some(kind) = self.take(role, phase) else {
            return Ok(());
        };
        let what = format!("{kind:?} in {role}, {phase}").to_lowercase();
        match kind {
            FaultKind::Panic => panic!("injected fault: {what}"),
            FaultKind::Error => Err(Cause::Injected(what)),
            FaultKind::Hang => {
                self.hang();
                Err(Cause::Injected(format!("{what} (released)")))
            }
        }
    }

    /// Blocks until [`Self::release_hangs`] or [`HANG_LIMIT`].
    fn hang(&self) {
        let seen = self.inner.release.load(Ordering::SeqCst);
        let start = Instant::now();
        while self.inner.release.load(Ordering::SeqCst) == seen && start.elapsed() < HANG_LIMIT {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: FaultKind) -> FaultSpec {
        FaultSpec {
            role: "reward".into(),
            phase: "reward".into(),
            step: 2,
            kind,
        }
    }

    #[test]
    fn a_fault_fires_once_at_its_step_and_phase() {
        let plan = FaultPlan::new(&[spec(FaultKind::Error)]);
        assert!(plan.inject("reward", "reward").is_ok(), "outside RL steps");
        plan.set_step(1);
        assert!(plan.inject("reward", "reward").is_ok(), "another step");
        plan.set_step(2);
        assert!(plan.inject("critic", "reward").is_ok(), "another role");
        let err = plan.inject("reward", "reward").unwrap_err();
        assert!(err.to_string().contains("error in reward, reward"), "{err}");
        assert!(plan.inject("reward", "reward").is_ok(), "fired once");
    }

    #[test]
    fn a_hang_ends_when_released() {
        let plan = FaultPlan::new(&[spec(FaultKind::Hang)]);
        plan.set_step(2);
        let hung = {
            let plan = plan.clone();
            std::thread::spawn(move || plan.inject("reward", "reward"))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(!hung.is_finished());
        plan.release_hangs();
        assert!(hung.join().unwrap().is_err());
    }
}
