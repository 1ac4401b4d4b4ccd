//! Helpers shared by the collective tests.

use oxalign_kernels::collective::ThreadCollective;
use std::sync::Arc;
use std::thread;

/// Runs `f(handle)` on one thread per rank and returns the results in rank order.
pub fn run_group<R: Send + 'static>(
    group: Vec<ThreadCollective>,
    f: impl Fn(ThreadCollective) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let handles: Vec<_> = group
        .into_iter()
        .map(|c| {
            let f = f.clone();
            thread::spawn(move || f(c))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}
