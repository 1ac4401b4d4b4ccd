//! How CPU work is spread over threads: one rayon pool for everything heavy (the `gemm`
//! matmuls, our fused kernels, the engine), whose workers a step's tensor work keeps awake
//! ([`with_workers_awake`]), and candle's composed element-wise ops run inline on the calling
//! thread. Not a scheduler: placement and executors live in `oxalign-actors`.
//!
//! candle 0.11 runs large element-wise ops on a second pool of its own (its "barrier pool",
//! `CANDLE_NUM_THREADS` threads), whose caller and workers spin while they wait. Next to the
//! rayon pool, on a machine with few cores, they spin against each other and against the
//! other role executors: in a `perf` profile of the quickstart, 69% of the samples were
//! those spin loops. With one candle thread that pool has no workers and nothing spins.

/// The environment variable candle reads for its element-wise pool size.
pub(crate) const CANDLE_THREADS_VAR: &str = "CANDLE_NUM_THREADS";

/// Sets `CANDLE_NUM_THREADS=1` unless the user set it. Returns the value in effect.
///
/// Call it first thing in `main`, before any thread is spawned and before any candle op runs
/// (candle reads the variable once, when its pool starts).
pub fn configure_cpu_threads() -> String {
    match std::env::var(CANDLE_THREADS_VAR) {
        Ok(v) => v,
        Err(_) => {
            // Only sound while no other thread reads the environment: hence "first thing".
            std::env::set_var(CANDLE_THREADS_VAR, "1");
            "1".to_string()
        }
    }
}

/// Runs `f` on rayon's pool with the pool's other workers kept awake until it returns.
///
/// Between two parallel loops a rayon worker that finds nothing to do goes to sleep within
/// tens of microseconds, and the next loop wakes it with a futex call. On a virtual machine
/// that wake-up can take longer than a small model's whole loop: the first worker then does
/// all the work alone. A step of the quickstart-sized model (hundreds of small loops) ran at
/// the speed of one thread in such spells. So while `f` runs, each other worker holds a
/// job that takes every piece of work the pool has as soon as it appears (rayon's
/// `yield_now`) and otherwise spins politely, as OpenMP's workers spin for a while between
/// parallel regions (`KMP_BLOCKTIME`). Call it around a whole step of tensor work, not
/// around I/O: the other workers burn their cores until `f` returns.
pub fn with_workers_awake<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let stop = std::sync::atomic::AtomicBool::new(false);
    rayon::scope(|s| {
        let owner = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            let stop = &stop;
            s.spawn(move |_| stay_awake(stop, owner));
        }
        let _stop = StopOnDrop(&stop);
        f()
    })
}

/// Sets the flag when dropped, so the workers kept awake stop even when `f` panics.
struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// One worker's wait: run any work the pool has, else spin, until `stop`. The thread that
/// runs `f` may pick this job up itself while it waits inside `f`; it must return at once
/// there, or it would spin over the `f` that is to stop it.
fn stay_awake(stop: &std::sync::atomic::AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner {
        return;
    }
    let mut idle = 0u32;
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            Some(rayon::Yield::Idle) if idle < 200 => {
                idle += 1;
                std::hint::spin_loop();
            }
            Some(rayon::Yield::Idle) => std::thread::yield_now(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::with_workers_awake;
    use rayon::prelude::*;

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
    }

    #[test]
    fn parallel_work_inside_gives_the_serial_answer() {
        for threads in [1, 2, 4] {
            let sum = pool(threads).install(|| {
                with_workers_awake(|| {
                    (0..200)
                        .map(|round| {
                            (0..10_000u64)
                                .into_par_iter()
                                .map(|x| x * round)
                                .sum::<u64>()
                        })
                        .sum::<u64>()
                })
            });
            assert_eq!(sum, (0..200u64).sum::<u64>() * (0..10_000u64).sum::<u64>());
        }
    }

    #[test]
    fn nested_joins_and_nested_calls_finish() {
        fn depth(n: u32) -> u64 {
            match n {
                0 => 1,
                _ => {
                    let (a, b) = rayon::join(|| depth(n - 1), || depth(n - 1));
                    a + b
                }
            }
        }
        let got = pool(4).install(|| {
            with_workers_awake(|| {
                (0..20)
                    .map(|_| with_workers_awake(|| depth(12)))
                    .sum::<u64>()
            })
        });
        assert_eq!(got, 20 * 4096);
    }

    #[test]
    fn called_from_outside_the_pool_it_runs_inside() {
        let inside = with_workers_awake(|| rayon::current_thread_index().is_some());
        assert!(inside);
    }

    #[test]
    fn a_panic_in_the_work_reaches_the_caller_and_releases_the_workers() {
        let p = pool(2);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.install(|| with_workers_awake(|| -> u32 { panic!("inside") }))
        }));
        assert!(caught.is_err());
        // The pool still serves work: no worker is left spinning on the failed call.
        assert_eq!(p.install(|| with_workers_awake(|| 7)), 7);
    }
}
