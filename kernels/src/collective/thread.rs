//! [`ThreadCollective`]: the in-process implementation of [`Collective`] for N replicas on N
//! threads of one process. Ranks deposit their buffers in a shared slot table; the last to
//! arrive combines them (sums in rank order) and wakes the others. A rank that leaves,
//! aborts, times out or disagrees on the call fails the whole group.

use super::{Collective, CollectiveError};
use rayon::prelude::*;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Default time a rank waits for the others before failing the group.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// What a rank contributed to the operation in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    AllReduceMean,
    Broadcast { root: usize },
    Barrier,
    AllGather,
    ReduceScatterMean,
    AllToAll,
}

impl OpKind {
    fn name(self) -> &'static str {
        match self {
            OpKind::AllReduceMean => "all_reduce_mean",
            OpKind::Broadcast { .. } => "broadcast",
            OpKind::Barrier => "barrier",
            OpKind::AllGather => "all_gather",
            OpKind::ReduceScatterMean => "reduce_scatter_mean",
            OpKind::AllToAll => "all_to_all",
        }
    }
}

struct Contribution {
    kind: OpKind,
    buffers: Vec<Vec<f32>>,
}

/// Shared state of one thread group, guarded by the mutex.
struct State {
    /// Number of completed operations; a waiting rank watches it change.
    generation: u64,
    /// Contributions to the operation in progress, by rank.
    slots: Vec<Option<Contribution>>,
    /// The last completed operation's result (kept until the next one completes).
    result: Arc<Vec<Vec<f32>>>,
    /// Set once the group fails; every later call returns it.
    aborted: Option<String>,
}

struct Shared {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    cond: Condvar,
}

/// One replica's handle on an in-process group of `world_size` threads.
///
/// Create the group with [`ThreadCollective::group`] and move one handle into each replica
/// thread. Dropping a handle (normally or while a thread panics) aborts the group, so ranks
/// still waiting get [`CollectiveError::Aborted`] instead of hanging; a rank that waits
/// longer than the timeout fails the group with [`CollectiveError::Timeout`].
pub struct ThreadCollective {
    rank: usize,
    shared: Arc<Shared>,
}

impl ThreadCollective {
    /// `n` handles (ranks `0..n`) sharing one group, with [`DEFAULT_TIMEOUT`].
    pub fn group(n: usize) -> Vec<ThreadCollective> {
        Self::group_with_timeout(n, DEFAULT_TIMEOUT)
    }

    /// `n` handles sharing one group; a rank gives up after waiting `timeout` for the others.
    pub fn group_with_timeout(n: usize, timeout: Duration) -> Vec<ThreadCollective> {
        let shared = Arc::new(Shared {
            world: n,
            timeout,
            state: Mutex::new(State {
                generation: 0,
                slots: (0..n).map(|_| None).collect(),
                result: Arc::new(Vec::new()),
                aborted: None,
            }),
            cond: Condvar::new(),
        });
        (0..n)
            .map(|rank| ThreadCollective {
                rank,
                shared: shared.clone(),
            })
            .collect()
    }

    /// Fails the group on purpose (e.g. this replica hit an error): every rank's pending and
    /// future calls return [`CollectiveError::Aborted`] with `reason`.
    pub fn abort(&self, reason: &str) {
        let mut st = self.lock();
        if st.aborted.is_none() {
            st.aborted = Some(format!("rank {} aborted: {reason}", self.rank));
        }
        drop(st);
        self.shared.cond.notify_all();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the state half-written in a way that
        // matters: every path that could fail sets `aborted` first. Recover the guard.
        self.shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn aborted(reason: &str) -> CollectiveError {
        CollectiveError::Aborted {
            reason: reason.to_string(),
        }
    }

    /// Deposits this rank's contribution, waits for all ranks, returns the combined result.
    fn exchange(
        &self,
        kind: OpKind,
        buffers: Vec<Vec<f32>>,
    ) -> Result<Arc<Vec<Vec<f32>>>, CollectiveError> {
        let mut st = self.lock();
        if let Some(reason) = &st.aborted {
            return Err(Self::aborted(reason));
        }
        self.check_entry(&mut st, kind, &buffers)?;
        let my_generation = st.generation;
        st.slots[self.rank] = Some(Contribution { kind, buffers });
        if st.slots.iter().all(Option::is_some) {
            return Ok(self.complete(st, kind));
        }
        self.wait_for_others(st, kind, my_generation)
    }

    /// Checks that this rank may deposit `kind`/`buffers`: its slot is empty (the handle is
    /// not in use on another thread) and the call agrees with every contribution already
    /// deposited. On failure the group is aborted (everyone woken) and the mismatch returned.
    fn check_entry(
        &self,
        st: &mut State,
        kind: OpKind,
        buffers: &[Vec<f32>],
    ) -> Result<(), CollectiveError> {
        if st.slots[self.rank].is_some() {
            // Only possible if the same handle is used from two threads at once.
            let detail = format!(
                "rank {} entered {} twice concurrently (a handle must be used by one thread)",
                self.rank,
                kind.name()
            );
            st.aborted = Some(detail.clone());
            self.shared.cond.notify_all();
            return Err(CollectiveError::Mismatch {
                rank: self.rank,
                detail,
            });
        }
        // Every deposited contribution must agree with the ones already there.
        if let Some(other) = st.slots.iter().flatten().next() {
            if let Some(detail) = mismatch(other, kind, buffers) {
                let detail = format!("rank {}: {detail}", self.rank);
                st.aborted = Some(detail.clone());
                self.shared.cond.notify_all();
                return Err(CollectiveError::Mismatch {
                    rank: self.rank,
                    detail,
                });
            }
        }
        Ok(())
    }

    /// Run by the last rank to arrive (every slot full): takes all contributions, combines
    /// them, publishes the result as a new generation, unlocks and wakes the waiting ranks.
    fn complete(&self, mut st: MutexGuard<'_, State>, kind: OpKind) -> Arc<Vec<Vec<f32>>> {
        let contributions: Vec<Contribution> = st
            .slots
            .iter_mut()
            .map(|s| s.take().expect("all present"))
            .collect();
        let result = Arc::new(combine(kind, contributions, self.shared.world));
        st.result = result.clone();
        st.generation += 1;
        drop(st);
        self.shared.cond.notify_all();
        result
    }

    /// Waits (releasing the lock) until the generation moves past `my_generation` and returns
    /// that operation's result, or fails: the group aborted, or the timeout ran out (then this
    /// rank aborts the group with [`CollectiveError::Timeout`] naming the missing ranks).
    fn wait_for_others(
        &self,
        mut st: MutexGuard<'_, State>,
        kind: OpKind,
        my_generation: u64,
    ) -> Result<Arc<Vec<Vec<f32>>>, CollectiveError> {
        let start = Instant::now();
        loop {
            if st.generation != my_generation {
                return Ok(st.result.clone());
            }
            if let Some(reason) = &st.aborted {
                return Err(Self::aborted(reason));
            }
            let waited = start.elapsed();
            if waited >= self.shared.timeout {
                let missing: Vec<usize> = st
                    .slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(r, _)| r)
                    .collect();
                let err = CollectiveError::Timeout {
                    rank: self.rank,
                    op: kind.name(),
                    waited,
                    missing,
                };
                st.aborted = Some(err.to_string());
                drop(st);
                self.shared.cond.notify_all();
                return Err(err);
            }
            let (guard, _) = self
                .shared
                .cond
                .wait_timeout(st, self.shared.timeout - waited)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            st = guard;
        }
    }
}

/// Describes how `kind`/`buffers` differ from another rank's contribution, if they do.
fn mismatch(other: &Contribution, kind: OpKind, buffers: &[Vec<f32>]) -> Option<String> {
    if other.kind != kind {
        return Some(format!(
            "called {:?} while another rank called {:?}",
            kind, other.kind
        ));
    }
    let mine: Vec<usize> = buffers.iter().map(Vec::len).collect();
    let theirs: Vec<usize> = other.buffers.iter().map(Vec::len).collect();
    if kind == OpKind::AllToAll {
        // Lengths differ by design; each rank checked it sends one buffer per rank.
        return None;
    }
    (mine != theirs).then(|| {
        format!(
            "{} buffer lengths {mine:?} differ from another rank's {theirs:?}",
            kind.name()
        )
    })
}

/// The combined result: rank-order sums divided by `world` (mean; reduce-scatter takes its
/// chunk of it), root's copy (broadcast), the rank-order concatenation (all-gather), every
/// rank's buffers source-major (all-to-all: entry `s · world + d` is what `s` sent to `d`).
fn combine(kind: OpKind, mut contributions: Vec<Contribution>, world: usize) -> Vec<Vec<f32>> {
    match kind {
        OpKind::Barrier => Vec::new(),
        OpKind::AllToAll => contributions.into_iter().flat_map(|c| c.buffers).collect(),
        OpKind::Broadcast { root } => std::mem::take(&mut contributions[root].buffers),
        OpKind::AllGather => {
            let n_buffers = contributions[0].buffers.len();
            (0..n_buffers)
                .map(|b| {
                    let mut all = Vec::with_capacity(contributions[0].buffers[b].len() * world);
                    for c in &contributions {
                        all.extend_from_slice(&c.buffers[b]);
                    }
                    all
                })
                .collect()
        }
        OpKind::AllReduceMean | OpKind::ReduceScatterMean => {
            let n_buffers = contributions[0].buffers.len();
            let n = world as f32;
            (0..n_buffers)
                .map(|b| {
                    let mut acc = std::mem::take(&mut contributions[0].buffers[b]);
                    const CHUNK: usize = 1 << 14;
                    acc.par_chunks_mut(CHUNK).enumerate().for_each(|(c, acc)| {
                        let start = c * CHUNK;
                        // Rank order per element: deterministic whatever the thread count.
                        for other in &contributions[1..] {
                            let src = &other.buffers[b][start..start + acc.len()];
                            for (a, &v) in acc.iter_mut().zip(src) {
                                *a += v;
                            }
                        }
                        for a in acc.iter_mut() {
                            *a /= n;
                        }
                    });
                    acc
                })
                .collect()
        }
    }
}

impl Collective for ThreadCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn abort(&self, reason: &str) {
        ThreadCollective::abort(self, reason);
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_mean_f32(&self, buffers: &mut [&mut [f32]]) -> Result<(), CollectiveError> {
        let owned = buffers.iter().map(|b| b.to_vec()).collect();
        let result = self.exchange(OpKind::AllReduceMean, owned)?;
        copy_results(buffers, &result);
        Ok(())
    }

    fn broadcast_f32(
        &self,
        buffers: &mut [&mut [f32]],
        root: usize,
    ) -> Result<(), CollectiveError> {
        if root >= self.shared.world {
            return Err(CollectiveError::Mismatch {
                rank: self.rank,
                detail: format!(
                    "broadcast root {root} is not a rank of a group of {}",
                    self.shared.world
                ),
            });
        }
        let owned = buffers.iter().map(|b| b.to_vec()).collect();
        let result = self.exchange(OpKind::Broadcast { root }, owned)?;
        copy_results(buffers, &result);
        Ok(())
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        self.exchange(OpKind::Barrier, Vec::new()).map(|_| ())
    }

    fn all_gather_f32(
        &self,
        shards: &[&[f32]],
        out: &mut [&mut [f32]],
    ) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        self.check_outputs("all_gather", shards, out, |len| len * world)?;
        let owned = shards.iter().map(|b| b.to_vec()).collect();
        let result = self.exchange(OpKind::AllGather, owned)?;
        copy_results(out, &result);
        Ok(())
    }

    fn reduce_scatter_mean_f32(
        &self,
        inputs: &[&[f32]],
        out: &mut [&mut [f32]],
    ) -> Result<(), CollectiveError> {
        let world = self.shared.world;
        if let Some((i, b)) = inputs
            .iter()
            .enumerate()
            .find(|(_, b)| b.len() % world != 0)
        {
            return Err(self.fail_local(format!(
                "reduce_scatter_mean: buffer {i} has {} elements, not a multiple of the group \
                 size {world}",
                b.len()
            )));
        }
        self.check_outputs("reduce_scatter_mean", inputs, out, |len| len / world)?;
        let owned = inputs.iter().map(|b| b.to_vec()).collect();
        let result = self.exchange(OpKind::ReduceScatterMean, owned)?;
        for (dst, src) in out.iter_mut().zip(result.iter()) {
            let n = dst.len();
            dst.copy_from_slice(&src[self.rank * n..(self.rank + 1) * n]);
        }
        Ok(())
    }

    fn all_to_all_f32(&self, send: Vec<Vec<f32>>) -> Result<Vec<Vec<f32>>, CollectiveError> {
        let world = self.shared.world;
        if send.len() != world {
            return Err(self.fail_local(format!(
                "all_to_all: {} send buffers in a group of {world} (one per rank is needed)",
                send.len()
            )));
        }
        let result = self.exchange(OpKind::AllToAll, send)?;
        Ok((0..world)
            .map(|s| result[s * world + self.rank].clone())
            .collect())
    }
}

/// Copies each exchanged buffer of `result` into its caller's buffer in `out` (same lengths).
fn copy_results(out: &mut [&mut [f32]], result: &[Vec<f32>]) {
    for (dst, src) in out.iter_mut().zip(result) {
        dst.copy_from_slice(src);
    }
}

impl ThreadCollective {
    /// Errors (before any exchange) unless there is one output per input and output `i` has
    /// `expected(inputs[i].len())` elements.
    fn check_outputs(
        &self,
        op: &'static str,
        inputs: &[&[f32]],
        out: &[&mut [f32]],
        expected: impl Fn(usize) -> usize,
    ) -> Result<(), CollectiveError> {
        let bad = inputs.len() != out.len()
            || inputs
                .iter()
                .zip(out)
                .any(|(i, o)| o.len() != expected(i.len()));
        if !bad {
            return Ok(());
        }
        let ins: Vec<usize> = inputs.iter().map(|b| b.len()).collect();
        let outs: Vec<usize> = out.iter().map(|b| b.len()).collect();
        Err(self.fail_local(format!(
            "{op}: output lengths {outs:?} do not fit input lengths {ins:?} in a group of {}",
            self.shared.world
        )))
    }

    /// A call this rank cannot make: fails the group (so peers already waiting are released
    /// at once, as for a mismatch between ranks) and returns the error.
    fn fail_local(&self, detail: String) -> CollectiveError {
        let detail = format!("rank {}: {detail}", self.rank);
        self.abort(&detail);
        CollectiveError::Mismatch {
            rank: self.rank,
            detail,
        }
    }
}

impl Drop for ThreadCollective {
    fn drop(&mut self) {
        let mut st = self.lock();
        if st.aborted.is_none() && self.shared.world > 1 {
            let why = if std::thread::panicking() {
                "panicked"
            } else {
                "dropped its handle"
            };
            st.aborted = Some(format!("rank {} left the group ({why})", self.rank));
        }
        drop(st);
        self.shared.cond.notify_all();
    }
}

impl std::fmt::Debug for ThreadCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadCollective")
            .field("rank", &self.rank)
            .field("world_size", &self.shared.world)
            .finish()
    }
}
