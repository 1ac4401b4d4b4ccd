//! Counters the engine reports to the monitor: KV pool occupancy, preemptions, prefix sharing,
//! copy-on-write copies, tokens processed and the weight version. Plain data, no logic.

/// A snapshot of the engine's counters (cumulative since the engine was made, unless noted).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// Weight version currently served (0 = the weights given to `Engine::new`).
    pub version: u64,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Blocks in use now (0 between `generate` calls).
    pub blocks_used: usize,
    /// Blocks free now.
    pub blocks_free: usize,
    /// Most blocks in use at once.
    pub peak_blocks_used: usize,
    /// Bytes of one KV block (K and V, all layers, f32).
    pub block_bytes: usize,
    /// Sequences preempted (and later recomputed) because blocks ran out.
    pub preemptions: u64,
    /// Block references shared instead of recomputed (prompt blocks of forked samples).
    pub prefix_shared_blocks: u64,
    /// Samples that reused another request's prompt KV instead of prefilling it.
    pub forked_sequences: u64,
    /// Copy-on-write block copies.
    pub cow_copies: u64,
    /// Prompt (and recomputed) tokens whose K/V were found in the prefix cache instead of
    /// prefilled.
    pub prefix_cache_hit_tokens: u64,
    /// Blocks in the prefix cache now (full blocks kept at the served weights).
    pub cached_blocks: usize,
    /// Forward steps run.
    pub steps: u64,
    /// Prompt (and recomputed) tokens processed.
    pub prefill_tokens: u64,
    /// Decode tokens processed.
    pub decode_tokens: u64,
    /// Bytes of rollout weights read per decode step (linear layers + norms).
    pub weight_bytes: usize,
}
