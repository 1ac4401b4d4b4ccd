//! The paged KV cache: a pool of fixed-size K/V blocks per layer in host f32 buffers, with a
//! free list and reference counts (prefix sharing, copy-on-write copies). It knows nothing
//! about sequences or scheduling; block tables are held by the scheduler's sequences.

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
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Blocks not referenced by any sequence.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Blocks referenced by at least one sequence.
    pub fn num_used(&self) -> usize {
        self.num_blocks - self.free.len()
    }

    /// Most blocks in use at once since the pool was made.
    pub fn peak_used(&self) -> usize {
        self.peak_used
    }

    /// Reference count of `block`.
    pub fn refcount(&self, block: usize) -> u32 {
        self.refcount[block]
    }

    /// Takes a free block (refcount 1), or `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<usize> {
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
        if self.refcount[block] == 0 {
            self.free.push(block);
        }
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
