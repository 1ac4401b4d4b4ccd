//! The data-parallel replicas of one role: one state per device of its group, each used
//! only on that device's executor thread, joined by a `Collective` when there are several.
//!
//! Roles call [`Replicas::each`] with a job; it runs on every replica at once and returns
//! the results in rank order. A replica whose job panicked is poisoned and refuses all later
//! work (the supervisor rebuilds the role); rank 0's job is where an injected fault fires.
//! Splitting a batch into shards is [`shard_ranges`].

use crate::error::Cause;
pub use crate::error::RoleError;
use crate::executor::ExecutorPool;
use oxalign_kernels::collective::Collective;
use oxalign_kernels::device::DeviceSpec;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// One replica's context inside a job.
pub struct ReplicaCtx<'a> {
    /// This replica's rank.
    pub rank: usize,
    /// Number of replicas.
    pub world: usize,
    /// Gradient averaging across replicas (`None` with one replica).
    pub collective: Option<&'a dyn Collective>,
}

type Shared<T> = Arc<Mutex<T>>;

/// States of a role's replicas and the devices they live on.
pub struct Replicas<T> {
    role: String,
    /// The executor lane the jobs run on: the role's own by default; a second lane
    /// ([`Replicas::on_lane`]) gives a role two kinds of state that work at once on the CPU
    /// (the policy's trainer and its engine).
    lane: String,
    specs: Vec<DeviceSpec>,
    states: Vec<Shared<T>>,
    collectives: Vec<Option<Arc<dyn Collective>>>,
    pool: ExecutorPool,
}

impl<T: Send + 'static> Replicas<T> {
    /// Replicas of `role` with one state per device of `specs`, joined (when there are
    /// several) by a collective group of the kind their devices call for (NCCL on CUDA GPUs,
    /// threads on the CPU; `crate::collective_groups`). Fails when that group cannot be built.
    pub fn new(
        role: &str,
        specs: Vec<DeviceSpec>,
        states: Vec<T>,
        pool: ExecutorPool,
    ) -> Result<Self, Cause> {
        let group = match specs.len() > 1 {
            true => Some(collective_group(&specs, &pool)?),
            false => None,
        };
        Ok(Self::with_group(role, specs, states, pool, group))
    }

    /// [`Replicas::new`] over the collective group `group` (one handle per device, rank
    /// order; `None` for one replica): a failed job aborts it, releasing peers waiting in
    /// any exchange over it.
    pub fn with_group(
        role: &str,
        specs: Vec<DeviceSpec>,
        states: Vec<T>,
        pool: ExecutorPool,
        group: Option<Vec<Arc<dyn Collective>>>,
    ) -> Self {
        assert_eq!(specs.len(), states.len(), "one state per device");
        let collectives = match group {
            Some(g) => {
                assert_eq!(g.len(), specs.len(), "one collective handle per device");
                g.into_iter().map(Some).collect()
            }
            None => vec![None; specs.len()],
        };
        Self {
            role: role.to_string(),
            lane: role.to_string(),
            specs,
            states: states
                .into_iter()
                .map(|s| Arc::new(Mutex::new(s)))
                .collect(),
            collectives,
            pool,
        }
    }

    /// The same replicas with their jobs on executor lane `lane` (on the CPU, threads of
    /// their own, `cpu:0/<lane>`; a GPU has one executor, whatever the lane). Errors and
    /// injected faults still name the role.
    pub fn on_lane(mut self, lane: &str) -> Self {
        self.lane = lane.to_string();
        self
    }

    /// The executor lane the jobs run on.
    pub fn lane(&self) -> &str {
        &self.lane
    }

    /// Number of replicas.
    pub fn world(&self) -> usize {
        self.specs.len()
    }

    /// Device names, e.g. `["cpu:0", "cpu:1"]`.
    pub fn device_names(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.to_string()).collect()
    }

    /// Runs `job` (the work of `phase`) on every replica at once, each on its device's
    /// executor, and returns the results in rank order, or the first error as a
    /// [`RoleError`] naming the role, the phase and the replica.
    pub async fn each<R, F>(&self, phase: &'static str, job: F) -> Result<Vec<R>, RoleError>
    where
        R: Send + 'static,
        F: Fn(&ReplicaCtx<'_>, &mut T) -> Result<R, Cause> + Send + Sync + 'static,
    {
        let job = Arc::new(job);
        let world = self.world();
        let in_pool = self.runs_in_compute_pool();
        let jobs: Vec<_> = (0..world)
            .map(|rank| {
                let job = job.clone();
                let state = self.states[rank].clone();
                let coll = self.collectives[rank].clone();
                let faults = self.pool.faults().clone();
                let role = self.role.clone();
                move || {
                    // Peers may be waiting in a collective for this rank: release them when
                    // it fails or panics.
                    let abort = AbortPeers(coll.as_deref());
                    // A replica a panic left half-updated is never used again.
                    let Ok(mut guard) = state.lock() else {
                        return Err(Cause::Poisoned);
                    };
                    if rank == 0 {
                        faults.inject(&role, phase)?;
                    }
                    let ctx = ReplicaCtx {
                        rank,
                        world,
                        collective: coll.as_deref(),
                    };
                    let out = match in_pool {
                        true => {
                            let state: &mut T = &mut guard;
                            oxalign_kernels::cpu_threads::with_workers_awake(|| job(&ctx, state))
                        }
                        false => job(&ctx, &mut guard),
                    };
                    if out.is_ok() {
                        std::mem::forget(abort);
                    }
                    out
                }
            })
            .collect();
        let results = self.pool.run_group(&self.lane, &self.specs, jobs).await;
        let mut out = Vec::with_capacity(world);
        for (rank, r) in results.into_iter().enumerate() {
            match r.map_err(Cause::from).and_then(|r| r) {
                Ok(v) => out.push(v),
                Err(cause) => return Err(RoleError::new(&self.role, phase, cause).on_rank(rank)),
            }
        }
        Ok(out)
    }
}

impl<T> Replicas<T> {
    /// Whether jobs run inside the process's compute pool (rayon's global pool) rather than
    /// on the executor thread: for one CPU replica without a collective. The kernels'
    /// parallel loops then split among the pool's threads directly; called from the executor
    /// thread, each of them (hundreds per update of a small model) would be handed to the
    /// pool and waited for, a futex wake and sleep per operation (on 2 cores the PPO update
    /// of the quickstart spent a quarter of its time in the scheduler). Replicas that wait
    /// on each other in a collective keep their own threads: blocked pool threads would
    /// starve the peers they wait for. GPU jobs keep theirs: a CUDA context is bound to the
    /// thread that uses it. The hang a fault plan injects fires on the executor thread.
    fn runs_in_compute_pool(&self) -> bool {
        self.specs.len() == 1 && self.collectives[0].is_none() && !self.specs[0].is_cuda()
    }
}

impl<T> Clone for Replicas<T> {
    /// Another handle on the same replicas (their states are shared, not copied).
    fn clone(&self) -> Self {
        Self {
            role: self.role.clone(),
            lane: self.lane.clone(),
            specs: self.specs.clone(),
            states: self.states.clone(),
            collectives: self.collectives.clone(),
            pool: self.pool.clone(),
        }
    }
}

/// A fresh collective group over `specs` built as `pool` says (NCCL for CUDA devices, threads
/// otherwise), for [`Replicas::with_group`] when the states themselves hold a handle on it
/// (expert-parallel models exchange rows over it).
pub fn collective_group(
    specs: &[DeviceSpec],
    pool: &ExecutorPool,
) -> Result<Vec<Arc<dyn Collective>>, Cause> {
    crate::collective_groups::collective_group(specs, pool.groups())
}

/// Aborts a replica's collective when dropped: on an error return or while a panic unwinds
/// (a successful job forgets it).
struct AbortPeers<'a>(Option<&'a dyn Collective>);

impl Drop for AbortPeers<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.0 {
            c.abort("a peer replica failed");
        }
    }
}

/// Splits `rows` into `world` contiguous, balanced ranges (earlier ranks get the extra row).
pub(crate) fn shard_ranges(rows: usize, world: usize) -> Vec<Range<usize>> {
    let base = rows / world;
    let extra = rows % world;
    let mut start = 0;
    (0..world)
        .map(|r| {
            let len = base + usize::from(r < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_replica_a_panic_poisoned_is_never_used_again() {
        let specs = vec![DeviceSpec::cpu(0)];
        let r = Replicas::new("reward", specs, vec![0u32], ExecutorPool::new()).unwrap();
        let bump = |_: &ReplicaCtx<'_>, n: &mut u32| -> Result<u32, Cause> {
            *n += 1;
            Ok(*n)
        };
        assert_eq!(r.each("reward", bump).await.unwrap(), [1]);
        let half = |_: &ReplicaCtx<'_>, n: &mut u32| -> Result<u32, Cause> {
            *n += 100;
            panic!("half-way")
        };
        let e = r.each("reward", half).await.unwrap_err();
        assert!(matches!(*e.cause, Cause::Executor(_)), "{e}");
        let e = r.each("reward", bump).await.unwrap_err();
        assert!(matches!(*e.cause, Cause::Poisoned), "{e}");
    }

    #[tokio::test]
    async fn a_panicking_replica_releases_its_peers_at_once() {
        let specs = vec![DeviceSpec::cpu(0), DeviceSpec::cpu(1)];
        let r = Replicas::new("policy", specs, vec![(), ()], ExecutorPool::new()).unwrap();
        let started = std::time::Instant::now();
        let e = r
            .each("policy_train", |ctx: &ReplicaCtx<'_>, _: &mut ()| {
                if ctx.rank == 0 {
                    panic!("rank 0 fails before the collective");
                }
                let c = ctx.collective.expect("two replicas");
                c.barrier().map_err(|e| Cause::Unreachable(e.to_string()))
            })
            .await
            .unwrap_err();
        assert!(matches!(*e.cause, Cause::Executor(_)), "{e}");
        assert!(
            started.elapsed().as_secs() < 10,
            "rank 1 waited for the timeout"
        );
    }

    #[tokio::test]
    async fn one_cpu_replica_runs_in_the_compute_pool_and_collective_peers_do_not() {
        let on_pool = |_: &ReplicaCtx<'_>, _: &mut ()| -> Result<bool, Cause> {
            Ok(rayon::current_thread_index().is_some())
        };
        let one = vec![DeviceSpec::cpu(0)];
        let r = Replicas::new("reward", one, vec![()], ExecutorPool::new()).unwrap();
        assert_eq!(r.each("reward", on_pool).await.unwrap(), [true]);
        let two = vec![DeviceSpec::cpu(0), DeviceSpec::cpu(1)];
        let r = Replicas::new("policy", two, vec![(), ()], ExecutorPool::new()).unwrap();
        assert_eq!(r.each("policy", on_pool).await.unwrap(), [false, false]);
    }

    #[test]
    fn shards_cover_rows_in_order() {
        assert_eq!(shard_ranges(5, 2), vec![0..3, 3..5]);
        assert_eq!(shard_ranges(4, 4), vec![0..1, 1..2, 2..3, 3..4]);
        assert_eq!(shard_ranges(7, 1), vec![0..7]);
    }
}
