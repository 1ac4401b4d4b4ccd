//! The paged KV cache: a pool of fixed-size K/V blocks per layer in host f32 buffers, with a
//! free list and reference counts (prefix sharing, copy-on-write copies), and optionally the
//! prefix cache of full blocks left by finished sequences (`prefix_cache.rs`). It knows
//! nothing about sequences or scheduling; block tables are held by the scheduler's sequences.

use crate::engine::prefix_cache::{NodeId, PrefixCache, ROOT};

/// Pool of KV blocks. Layout of each layer's buffers (f32, keys after RoPE):
/// keys `[num_blocks, kv_heads, head_dim, block_size]` (a block's positions are contiguous
/// for each channel, so attention scores a whole block with vertical multiply-adds) and
/// values `[num_blocks, kv_heads, block_size, head_dim]` (a position's channels contiguous).
#[derive(Debug)]
pub(crate) struct BlockPool {
    block_size: usize,
    kv_heads: usize,
    head_dim: usize,
    num_blocks: usize,
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    refcount: Vec<u32>,
    free: Vec<usize>,
    peak_used: usize,
    cache: Option<Box<PrefixCache>>,
}

/// What a prefix match found: the cached blocks of the prefix, in order, and the trie node of
/// the last one (where the sequence's next full block is cached).
#[derive(Debug)]
pub(crate) struct PrefixMatch {
    pub blocks: Vec<usize>,
    pub node: NodeId,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens for `layers` layers. Buffers are
    /// zero-initialised lazily by the OS (untouched blocks cost no resident memory).
    pub fn new(
        layers: usize,
        num_blocks: usize,
        block_size: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> BlockPool {
        let len = num_blocks * block_size * kv_heads * head_dim;
        BlockPool {
            block_size,
            kv_heads,
            head_dim,
            num_blocks,
            keys: (0..layers).map(|_| vec![0.0; len]).collect(),
            values: (0..layers).map(|_| vec![0.0; len]).collect(),
            refcount: vec![0; num_blocks],
            // Popped from the back: hand out low block ids first.
            free: (0..num_blocks).rev().collect(),
            peak_used: 0,
            cache: None,
        }
    }

    /// Keeps full blocks of finished sequences for later requests with the same prefix.
    pub fn with_prefix_cache(mut self) -> BlockPool {
        self.cache = Some(Box::new(PrefixCache::new(self.num_blocks)));
        self
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks not referenced by any sequence (free, or cached and idle).
    pub fn num_free(&self) -> usize {
        self.free.len() + self.cache.as_ref().map_or(0, |c| c.num_idle())
    }

    /// Blocks in the prefix cache (in use or idle).
    pub fn num_cached(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.len())
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_used(&self) -> usize {
        self.num_blocks - self.num_free()
    }

    /// Most blocks in use at once since the pool was made.
    pub fn peak_used(&self) -> usize {
        self.peak_used
    }

    /// Reference count of `block`.
    pub fn refcount(&self, block: usize) -> u32 {
        self.refcount[block]
    }

    /// Takes a free block (refcount 1), evicting the least recently used cached prefix when
    /// none is free, or `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<usize> {
        if self.free.is_empty() {
            if let Some(freed) = self.cache.as_mut().map(|c| c.evict_oldest()) {
                self.take_back(freed);
            }
        }
        let b = self.free.pop()?;
        self.refcount[b] = 1;
        self.peak_used = self.peak_used.max(self.num_used());
        Some(b)
    }

    /// One more sequence references `block` (prefix sharing).
    pub fn share(&mut self, block: usize) {
        debug_assert!(self.refcount[block] > 0, "sharing a free block");
        self.refcount[block] += 1;
    }

    /// Drops one reference; the block returns to the free list at zero.
    pub fn release(&mut self, block: usize) {
        debug_assert!(self.refcount[block] > 0, "releasing a free block");
        self.refcount[block] -= 1;
        if self.refcount[block] > 0 {
            return;
        }
        match &mut self.cache {
            Some(cache) if cache.holds(block) => cache.park(block),
            _ => self.free.push(block),
        }
    }

    /// The longest cached prefix of `tokens` in whole blocks, at most `max_blocks` of them;
    /// each block found gains a reference (the caller's sequence now holds it).
    pub fn match_prefix(&mut self, tokens: &[u32], max_blocks: usize) -> PrefixMatch {
        let mut found = PrefixMatch {
            blocks: vec![],
            node: ROOT,
        };
        let Some(cache) = &mut self.cache else {
            return found;
        };
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let Some((node, block)) = cache.child(found.node, chunk) else {
                break;
            };
            if self.refcount[block] == 0 {
                cache.unpark(block);
            }
            self.refcount[block] += 1;
            cache.touch(node);
            found.blocks.push(block);
            found.node = node;
        }
        self.peak_used = self.peak_used.max(self.num_used());
        found
    }

    /// Caches `block`, full with `tokens`, under the prefix ending at `parent`. Returns its
    /// node, or `None` when the same tokens are cached already under `parent` (or there is no
    /// cache): then the block stays private and the sequence caches no further blocks.
    pub fn cache_block(&mut self, parent: NodeId, tokens: &[u32], block: usize) -> Option<NodeId> {
        debug_assert_eq!(tokens.len(), self.block_size);
        self.cache.as_mut()?.insert(parent, tokens, block)
    }

    /// Empties the prefix cache (the weights changed): its idle blocks become free.
    pub fn clear_prefix_cache(&mut self) {
        if let Some(freed) = self.cache.as_mut().map(|c| c.clear()) {
            self.take_back(freed);
        }
    }

    /// Puts blocks the prefix cache let go of on the free list, the first of them to be
    /// handed out first.
    fn take_back(&mut self, freed: Vec<usize>) {
        self.free.extend(freed.into_iter().rev());
    }

    /// Copy-on-write: copies the K/V of `block` (all layers) into a fresh block, drops one
    /// reference to `block` and returns the copy, or `None` when the pool is exhausted.
    pub fn copy_on_write(&mut self, block: usize) -> Option<usize> {
        let fresh = self.allocate()?;
        let n = self.block_len();
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            buf.copy_within(block * n..(block + 1) * n, fresh * n);
        }
        self.release(block);
        Some(fresh)
    }

    fn block_len(&self) -> usize {
        self.block_size * self.kv_heads * self.head_dim
    }

    /// Start of `(block, kv_head)` in a layer buffer (keys and values alike); the span is
    /// `block_size * head_dim` long.
    #[inline]
    fn head_start(&self, block: usize, kv_head: usize) -> usize {
        (block * self.kv_heads + kv_head) * self.block_size * self.head_dim
    }

    /// Writes one token's keys and values (`[kv_heads * head_dim]` each) of `layer` at
    /// position `pos` of the sequence with block table `table`.
    pub fn write(&mut self, layer: usize, table: &[usize], pos: usize, k: &[f32], v: &[f32]) {
        let block = table[pos / self.block_size];
        let slot = pos % self.block_size;
        let (hd, bs) = (self.head_dim, self.block_size);
        for h in 0..self.kv_heads {
            let o = self.head_start(block, h);
            let keys = &mut self.keys[layer][o..o + bs * hd];
            for (d, &x) in k[h * hd..(h + 1) * hd].iter().enumerate() {
                keys[d * bs + slot] = x;
            }
            let o = o + slot * hd;
            self.values[layer][o..o + hd].copy_from_slice(&v[h * hd..(h + 1) * hd]);
        }
    }

    /// Keys of `(block, kv_head)` in `layer`: `[head_dim, block_size]` (channel-major).
    #[inline]
    pub fn key_block(&self, layer: usize, block: usize, kv_head: usize) -> &[f32] {
        let o = self.head_start(block, kv_head);
        &self.keys[layer][o..o + self.block_size * self.head_dim]
    }

    /// Values of `(block, kv_head)` in `layer`: `[block_size, head_dim]` (position-major).
    #[inline]
    pub fn value_block(&self, layer: usize, block: usize, kv_head: usize) -> &[f32] {
        let o = self.head_start(block, kv_head);
        &self.values[layer][o..o + self.block_size * self.head_dim]
    }
}
