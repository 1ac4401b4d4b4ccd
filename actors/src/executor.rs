//! Device executors: one OS thread per device that runs heavy tensor work.
//!
//! Role actors are async facades on tokio; they hand closures to the executor of each
//! device they own and await the answer through a oneshot, so tensor math never blocks a
//! tokio worker. A panic inside a job is caught and returned as an error (the supervisor
//! decides what to do), and the thread keeps serving. A retired executor (one whose role is
//! being rebuilt, perhaps with a job still hung on it) is detached, never joined. This file
//! knows nothing about roles.

use crate::collective_groups::GroupSettings;
use crate::faults::FaultPlan;
use crossbeam_channel::{unbounded, Sender};
use oxalign_kernels::device::{DeviceKind, DeviceSpec};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Why a job gave no result.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecutorError {
    /// The job panicked; the message is the panic payload.
    #[error("job on {device} panicked: {message}")]
    Panicked {
        /// The executor's device.
        device: String,
        /// The panic message.
        message: String,
    },
    /// The executor thread is gone.
    #[error("executor for {0} has stopped")]
    Stopped(String),
}

/// One device's work thread, fed by a FIFO channel.
pub struct DeviceExecutor {
    name: String,
    tx: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// Set when retired: dropping it then detaches the thread instead of joining it.
    detached: AtomicBool,
}

impl DeviceExecutor {
    /// Starts the thread for `name` (e.g. `cpu:0`).
    pub fn spawn(name: &str) -> Self {
        let (tx, rx) = unbounded::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("oxalign-{name}"))
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("spawning an OS thread");
        Self {
            name: name.to_string(),
            tx: Some(tx),
            thread: Some(thread),
            detached: AtomicBool::new(false),
        }
    }

    /// Takes no more jobs after the queued ones, and lets the thread end on its own: dropping
    /// this executor no longer waits for it (a job may be hung on it).
    pub fn detach(&self) {
        self.detached.store(true, Ordering::SeqCst);
    }

    /// The device name this executor serves.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Queues `f` and returns a receiver for its result. Jobs run in submission order.
    pub fn submit<R, F>(&self, f: F) -> tokio::sync::oneshot::Receiver<Result<R, ExecutorError>>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let device = self.name.clone();
        let job: Job = Box::new(move || {
            let out =
                catch_unwind(AssertUnwindSafe(f)).map_err(|payload| ExecutorError::Panicked {
                    device,
                    message: panic_message(payload.as_ref()),
                });
            let _ = reply.send(out);
        });
        if let Some(tx) = &self.tx {
            // A send error drops the job and its reply sender; the caller sees `Stopped`.
            let _ = tx.send(job);
        }
        rx
    }

    /// Runs `f` on this device and waits for it without blocking the async runtime.
    pub async fn run<R, F>(&self, f: F) -> Result<R, ExecutorError>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let rx = self.submit(f);
        rx.await
            .map_err(|_| ExecutorError::Stopped(self.name.clone()))?
    }
}

impl Drop for DeviceExecutor {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            if !self.detached.load(Ordering::SeqCst) {
                let _ = t.join();
            }
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".into()
    }
}

/// All device executors of a process.
///
/// * A GPU has one executor, shared by the roles placed on it (one ordered stream of work
///   per device).
/// * On the CPU each role has its own executor thread per spec (`cpu:0/critic`), so roles the
///   step runs concurrently (the policy and critic updates; reference and critic scoring)
///   really run at once, over the one shared rayon pool. With one thread per spec for all
///   roles, the critic's update waited in line behind the policy's, and its timeline span
///   (the wait included) read as a critic twice as slow as the policy.
///
/// Jobs that must run together on several devices (data-parallel replicas that meet in a
/// collective) are queued on all of them under one lock, so every executor sees group jobs
/// in the same order and two groups can never wait on each other.
///
/// The pool also carries the run's [`FaultPlan`], which role jobs consult where they run,
/// and how the roles on its devices build their collective groups ([`GroupSettings`]).
#[derive(Clone, Default)]
pub struct ExecutorPool {
    inner: Arc<Mutex<HashMap<ExecutorKey, Arc<DeviceExecutor>>>>,
    group_lock: Arc<Mutex<()>>,
    faults: FaultPlan,
    groups: GroupSettings,
}

/// A device, and the role that owns the executor on the CPU (`None`: a GPU's shared one).
type ExecutorKey = (DeviceSpec, Option<String>);

impl ExecutorPool {
    /// An empty pool; executors start on first use.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty pool whose jobs inject the faults of `faults`.
    pub fn with_faults(faults: FaultPlan) -> Self {
        Self {
            faults,
            ..Self::default()
        }
    }

    /// The run's fault plan (empty unless the recipe has `[[faults]]`).
    pub fn faults(&self) -> &FaultPlan {
        &self.faults
    }

    /// The same pool with collective groups built by `groups` (e.g. with the NCCL ids the
    /// controller handed to this worker).
    pub fn with_groups(mut self, groups: GroupSettings) -> Self {
        self.groups = groups;
        self
    }

    /// How the roles on this pool build their collective groups.
    pub fn groups(&self) -> &GroupSettings {
        &self.groups
    }

    fn key(spec: DeviceSpec, role: &str) -> ExecutorKey {
        (
            spec,
            (spec.kind == DeviceKind::Cpu).then(|| role.to_string()),
        )
    }

    /// Retires the executors `role` runs on for `specs` (detached: a hung job does not
    /// block anyone); the next job of any role on those devices starts a fresh thread.
    pub fn retire(&self, role: &str, specs: &[DeviceSpec]) {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for spec in specs {
            if let Some(old) = map.remove(&Self::key(*spec, role)) {
                old.detach();
            }
        }
    }

    /// The executor that runs `role`'s jobs on `spec`, started on first use: the device's
    /// own on a GPU, the role's own on the CPU.
    pub fn get(&self, spec: DeviceSpec, role: &str) -> Arc<DeviceExecutor> {
        let key = Self::key(spec, role);
        let name = match &key.1 {
            Some(r) => format!("{spec}/{r}"),
            None => spec.to_string(),
        };
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key)
            .or_insert_with(|| Arc::new(DeviceExecutor::spawn(&name)))
            .clone()
    }

    /// Runs one job per device of `specs` (job `i` on device `i`), queued atomically, and
    /// waits for all of them. Results come back in device order.
    pub async fn run_group<R, F>(
        &self,
        role: &str,
        specs: &[DeviceSpec],
        jobs: Vec<F>,
    ) -> Vec<Result<R, ExecutorError>>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        assert_eq!(specs.len(), jobs.len(), "one job per device");
        let executors: Vec<_> = specs.iter().map(|s| self.get(*s, role)).collect();
        let receivers: Vec<_> = {
            let _order = self.group_lock.lock().unwrap_or_else(|p| p.into_inner());
            executors
                .iter()
                .zip(jobs)
                .map(|(e, j)| (e.name().to_string(), e.submit(j)))
                .collect()
        };
        let mut out = Vec::with_capacity(receivers.len());
        for (name, rx) in receivers {
            out.push(
                rx.await
                    .unwrap_or_else(|_| Err(ExecutorError::Stopped(name))),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_off_the_runtime_and_catches_panics() {
        let pool = ExecutorPool::new();
        let ex = pool.get(DeviceSpec::cpu(0), "policy");
        let here = std::thread::current().id();
        let there = ex.run(|| std::thread::current().id()).await.unwrap();
        assert_ne!(here, there);
        let err = ex.run(|| -> u32 { panic!("boom") }).await.unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        assert_eq!(ex.run(|| 7).await.unwrap(), 7, "executor survives a panic");
    }

    #[tokio::test]
    async fn a_retired_executor_is_replaced_without_waiting_for_its_hung_job() {
        let pool = ExecutorPool::new();
        let spec = DeviceSpec::cpu(0);
        let old = pool.get(spec, "reference");
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let hung = old.submit(move || rx.recv().is_ok());
        pool.retire("reference", &[spec]);
        drop(old); // detached: does not join the blocked thread
        let new = pool.get(spec, "reference");
        assert_eq!(new.run(|| 3).await.unwrap(), 3, "a fresh thread serves");
        drop(tx);
        assert!(!hung.await.unwrap().unwrap());
    }

    #[tokio::test]
    async fn cpu_roles_get_their_own_threads() {
        let pool = ExecutorPool::new();
        let spec = DeviceSpec::cpu(0);
        let (p, c) = (pool.get(spec, "policy"), pool.get(spec, "critic"));
        assert!(
            Arc::ptr_eq(&p, &pool.get(spec, "policy")),
            "one executor per role"
        );
        assert_eq!((p.name(), c.name()), ("cpu:0/policy", "cpu:0/critic"));
        // The critic's job runs while the policy's is still running.
        let (tx, rx) = crossbeam_channel::bounded::<()>(0);
        let blocked = p.submit(move || rx.recv().is_ok());
        assert!(c.run(move || tx.send(()).is_ok()).await.unwrap());
        assert!(blocked.await.unwrap().unwrap());
    }

    #[tokio::test]
    async fn group_jobs_meet_without_deadlock() {
        let pool = ExecutorPool::new();
        let specs = [DeviceSpec::cpu(0), DeviceSpec::cpu(1)];
        for round in 0..20 {
            let barrier = Arc::new(std::sync::Barrier::new(2));
            let jobs: Vec<_> = (0..2)
                .map(|i| {
                    let b = barrier.clone();
                    move || {
                        b.wait();
                        i * round
                    }
                })
                .collect();
            let order = if round % 2 == 0 {
                specs
            } else {
                [specs[1], specs[0]]
            };
            let out = pool.run_group("policy", &order, jobs).await;
            assert_eq!(
                out.into_iter().map(|r| r.unwrap()).collect::<Vec<_>>(),
                vec![0, round]
            );
        }
    }
}
