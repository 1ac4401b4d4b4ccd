//! How CPU work is spread over threads: one rayon pool for everything heavy (the `gemm`
//! matmuls, our fused kernels, the engine), and candle's composed element-wise ops run inline
//! on the calling thread. Not a scheduler: placement and executors live in `oxalign-actors`.
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
