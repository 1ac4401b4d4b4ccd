//! Continuous-batching scheduler: per-sequence state and block tables, the waiting queue and
//! running batch, chunked prefill under a token budget, batched decode, prefix sharing of a
//! prompt between its samples (fork + copy-on-write), the prefix cache's matches on admission
//! and its full blocks as they fill, and preemption by recompute when blocks run out. It
//! decides what runs each step; the math is in `forward.rs`.

use crate::engine::block_pool::BlockPool;
use crate::engine::error::{EngineError, EngineResult};
use crate::engine::prefix_cache::{NodeId, ROOT};
use crate::engine::sampler::Sampler;
use std::collections::VecDeque;

/// Where a sequence is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SeqState {
    /// Queued (new, or preempted and waiting to recompute).
    Waiting,
    /// Shares a prompt with a leader; waits for the leader's prefill to fork from it.
    AwaitFork,
    /// In the running batch.
    Running,
    /// Done; holds no blocks.
    Finished,
}

/// One sequence being generated.
#[derive(Debug)]
pub(crate) struct Sequence {
    /// Index of the request it answers.
    pub req: usize,
    /// Prompt followed by the tokens generated so far.
    pub tokens: Vec<u32>,
    /// Prompt length.
    pub prompt_len: usize,
    /// Tokens whose K/V are in the pool.
    pub computed: usize,
    /// Block table: block `i` holds positions `i*block_size..(i+1)*block_size`.
    pub blocks: Vec<usize>,
    /// The request's sampler; its RNG state survives preemption, so a recomputed sequence
    /// continues exactly where it stopped.
    pub sampler: Sampler,
    /// Sequences with the same prompt that fork from this one after its prefill.
    pub followers: Vec<usize>,
    /// Life-cycle state.
    pub state: SeqState,
    /// Leading blocks that are in the prefix cache, and the cache node of the last of them
    /// (`None` once one of its blocks was found cached already: it caches no more).
    pub cached: (usize, Option<NodeId>),
}

impl Sequence {
    /// A waiting sequence for request `req` with prompt `prompt`.
    pub fn new(req: usize, prompt: &[u32], sampler: Sampler, state: SeqState) -> Sequence {
        Sequence {
            req,
            tokens: prompt.to_vec(),
            prompt_len: prompt.len(),
            computed: 0,
            blocks: vec![],
            sampler,
            followers: vec![],
            state,
            cached: (0, Some(ROOT)),
        }
    }
}

/// One scheduled item: `chunk` new tokens of sequence `seq` starting at its `computed`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Planned {
    pub seq: usize,
    pub chunk: usize,
}

/// The scheduler of one `generate` call.
pub(crate) struct Scheduler {
    pub seqs: Vec<Sequence>,
    waiting: VecDeque<usize>,
    running: Vec<usize>,
    max_batched_tokens: usize,
    max_running: usize,
    /// Look admitted sequences up in the pool's prefix cache.
    match_cache: bool,
    pub preemptions: u64,
    pub cow_copies: u64,
    /// Tokens whose K/V an admitted sequence found in the prefix cache.
    pub cache_hit_tokens: u64,
}

impl Scheduler {
    /// A scheduler over `seqs`; sequences in state `Waiting` are queued in order. With
    /// `match_cache`, an admitted sequence starts after the longest prefix the pool's cache
    /// holds.
    pub fn new(
        seqs: Vec<Sequence>,
        max_batched_tokens: usize,
        max_running: usize,
        match_cache: bool,
    ) -> Scheduler {
        let waiting = seqs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.state == SeqState::Waiting)
            .map(|(i, _)| i)
            .collect();
        Scheduler {
            seqs,
            waiting,
            running: vec![],
            max_batched_tokens,
            max_running,
            match_cache,
            preemptions: 0,
            cow_copies: 0,
            cache_hit_tokens: 0,
        }
    }

    /// Whether every sequence has finished (or waits for nothing).
    pub fn is_done(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Picks this step's work: running sequences first (oldest first; a decode takes one
    /// token, an unfinished prefill a chunk), preempting the newest running sequences when
    /// blocks run out, then admits waiting sequences while the token budget, `max_running`
    /// and free blocks allow. Allocates (and copy-on-writes) the blocks the step writes.
    pub fn schedule(&mut self, pool: &mut BlockPool) -> EngineResult<Vec<Planned>> {
        let mut plan = vec![];
        let mut budget = self.max_batched_tokens;
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let idx = self.running[i];
            let s = &self.seqs[idx];
            let chunk = (s.tokens.len() - s.computed).min(budget);
            loop {
                if self.ensure_blocks(idx, chunk, pool)? {
                    plan.push(Planned { seq: idx, chunk });
                    budget -= chunk;
                    i += 1;
                    break;
                }
                let victim = self.running.pop().ok_or_else(|| {
                    EngineError::Stalled("no running sequence left to preempt".into())
                })?;
                self.preempt(victim, pool);
                preempted = true;
                if victim == idx {
                    break;
                }
            }
        }
        while budget > 0 && !preempted {
            let Some(&idx) = self.waiting.front() else {
                break;
            };
            let group = 1 + self.seqs[idx].followers.len();
            if !self.running.is_empty() && self.running.len() + group > self.max_running {
                break;
            }
            let hit = self.match_cached_prefix(idx, pool);
            let s = &self.seqs[idx];
            let chunk = (s.tokens.len() - s.computed).min(budget);
            if !self.ensure_blocks(idx, chunk, pool)? {
                self.drop_blocks(idx, pool);
                break;
            }
            self.cache_hit_tokens += hit as u64;
            self.waiting.pop_front();
            self.seqs[idx].state = SeqState::Running;
            self.running.push(idx);
            plan.push(Planned { seq: idx, chunk });
            budget -= chunk;
        }
        Ok(plan)
    }

    /// Makes sure sequence `idx` owns writable blocks for positions
    /// `computed..computed + chunk`: new blocks past its table, private copies of shared
    /// ones (copy-on-write). Returns `false`, changing nothing, when the pool is short.
    fn ensure_blocks(
        &mut self,
        idx: usize,
        chunk: usize,
        pool: &mut BlockPool,
    ) -> EngineResult<bool> {
        let bs = pool.block_size();
        let s = &mut self.seqs[idx];
        let first = s.computed / bs;
        let last = (s.computed + chunk - 1) / bs;
        let need = (first..=last)
            .filter(|&b| b >= s.blocks.len() || pool.refcount(s.blocks[b]) > 1)
            .count();
        if need > pool.num_free() {
            return Ok(false);
        }
        let short =
            || EngineError::Stalled("KV pool ran out after its free count was checked".into());
        for b in first..=last {
            if b >= s.blocks.len() {
                s.blocks.push(pool.allocate().ok_or_else(short)?);
            } else if pool.refcount(s.blocks[b]) > 1 {
                s.blocks[b] = pool.copy_on_write(s.blocks[b]).ok_or_else(short)?;
                self.cow_copies += 1;
            }
        }
        Ok(true)
    }

    /// Starts sequence `idx` (holding no blocks) after the longest cached prefix of its
    /// tokens, leaving at least one token to compute (its logits are needed). Returns the
    /// tokens found.
    fn match_cached_prefix(&mut self, idx: usize, pool: &mut BlockPool) -> usize {
        let s = &mut self.seqs[idx];
        if !self.match_cache || s.computed > 0 {
            return 0;
        }
        let bs = pool.block_size();
        let found = pool.match_prefix(&s.tokens, (s.tokens.len() - 1) / bs);
        let n = found.blocks.len();
        s.blocks = found.blocks;
        s.computed = n * bs;
        s.cached = (n, Some(found.node));
        n * bs
    }

    /// Caches the blocks of sequence `idx` that its computed tokens have filled since the
    /// last call, each under the one before it.
    pub fn cache_full_blocks(&mut self, idx: usize, pool: &mut BlockPool) {
        let bs = pool.block_size();
        let s = &mut self.seqs[idx];
        while let (n, Some(parent)) = s.cached {
            if (n + 1) * bs > s.computed {
                break;
            }
            let node = pool.cache_block(parent, &s.tokens[n * bs..(n + 1) * bs], s.blocks[n]);
            s.cached = (n + 1, node);
        }
    }

    /// Releases every block of `idx`: it computes from scratch (or the cache) when next
    /// admitted.
    fn drop_blocks(&mut self, idx: usize, pool: &mut BlockPool) {
        let s = &mut self.seqs[idx];
        for b in s.blocks.drain(..) {
            pool.release(b);
        }
        s.computed = 0;
        s.cached = (0, Some(ROOT));
    }

    /// Preemption by recompute: frees the blocks of `idx` and queues it first; its tokens
    /// (prompt + generated) are prefilled again (or found in the prefix cache) when it is
    /// readmitted.
    fn preempt(&mut self, idx: usize, pool: &mut BlockPool) {
        self.drop_blocks(idx, pool);
        let s = &mut self.seqs[idx];
        s.state = SeqState::Waiting;
        self.waiting.push_front(idx);
        self.preemptions += 1;
    }

    /// Forks the followers of `leader` after its prompt prefill: they share its block table
    /// (reference counts up) and have computed the whole prompt. Returns them, in order, and
    /// the number of block references shared.
    pub fn fork_followers(&mut self, leader: usize, pool: &mut BlockPool) -> (Vec<usize>, u64) {
        let followers = std::mem::take(&mut self.seqs[leader].followers);
        let blocks = self.seqs[leader].blocks.clone();
        let computed = self.seqs[leader].computed;
        let cached = self.seqs[leader].cached;
        let mut shared = 0;
        for &f in &followers {
            for &b in &blocks {
                pool.share(b);
                shared += 1;
            }
            let s = &mut self.seqs[f];
            s.blocks = blocks.clone();
            s.computed = computed;
            s.cached = cached;
            s.state = SeqState::Running;
            self.running.push(f);
        }
        (followers, shared)
    }

    /// Marks `idx` finished, frees its blocks and drops it from the running batch.
    pub fn finish(&mut self, idx: usize, pool: &mut BlockPool) {
        self.drop_blocks(idx, pool);
        self.seqs[idx].state = SeqState::Finished;
        self.running.retain(|&r| r != idx);
    }
}
