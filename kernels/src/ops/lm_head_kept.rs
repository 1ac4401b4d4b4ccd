//! The scaled logits a fused LM head's forward keeps for its backward ([`KeptLogits`]), cut
//! by vocabulary into the groups the backward's tasks own, so each group is freed as soon as
//! its task is done with it.
//!
//! Why: the backward's peak holds the kept `[n, V]` logits beside the head weight's gradient
//! `[V, hidden]`, which the tasks write group by group. Kept whole, the logits lived until
//! the last task ended, beside the whole gradient; kept by group, the logits shrink while
//! the gradient grows (whose pages are first touched by the task that owns them). Each group
//! is a buffer glibc maps on its own, whatever its size, so freeing it hands its pages back
//! at once.

use std::sync::{Mutex, MutexGuard};

use super::cpu_math::Real;

/// Most bytes of logits a forward pass keeps for its backward pass: the `[n, V]` logits of
/// an 8×256 batch at a 32,000-token vocabulary in f32 (250 MiB). Above it the backward pass
/// recomputes them, so a long batch or a large vocabulary never holds the `[n, V]` logits at
/// once.
pub(crate) const LOGITS_CACHE_BYTES: usize = 256 << 20;

/// Vocabulary entries per chunk of logits (the unit of the head's products).
pub(crate) const VOCAB_CHUNK: usize = 512;

/// Vocabulary entries per backward task ([`vocab_group_width`]): one contiguous group of
/// chunks per task, twice as many tasks as rayon threads for balance.
pub(crate) fn vocab_group_width(vocab: usize) -> usize {
    let chunks = vocab.div_ceil(VOCAB_CHUNK).max(1);
    let tasks = (2 * rayon::current_num_threads()).clamp(1, chunks);
    chunks.div_ceil(tasks) * VOCAB_CHUNK
}

/// The forward's scaled logits by vocabulary group: group `g` covers entries
/// `g·width .. min((g+1)·width, V)` and holds them row-major `[n, its width]`.
pub(crate) struct KeptLogits<T> {
    n: usize,
    vocab: usize,
    width: usize,
    groups: Vec<Mutex<Option<Vec<T>>>>,
}

/// One group of the kept logits, borrowed by the backward task that owns it.
pub(crate) struct KeptGroup<'a, T> {
    guard: MutexGuard<'a, Option<Vec<T>>>,
    width: usize,
    first: usize,
}

impl<T: Real> KeptLogits<T> {
    /// Room for the logits of `n` rows over a vocabulary of `vocab` when they fit
    /// [`LOGITS_CACHE_BYTES`]; `None` otherwise. Written by the forward before anything reads
    /// it (zeros from `calloc`: a page's first touch is the forward's write).
    pub(crate) fn room(n: usize, vocab: usize) -> Option<Self> {
        let bytes = n
            .checked_mul(vocab)?
            .checked_mul(std::mem::size_of::<T>())?;
        if bytes > LOGITS_CACHE_BYTES {
            return None;
        }
        let width = vocab_group_width(vocab);
        let groups = (0..vocab.div_ceil(width))
            .map(|g| {
                let cols = width.min(vocab - g * width);
                Mutex::new(Some(own_mapping(n * cols)))
            })
            .collect();
        Some(KeptLogits {
            n,
            vocab,
            width,
            groups,
        })
    }

    /// Vocabulary entries per group (the last may hold fewer).
    pub(crate) fn group_width(&self) -> usize {
        self.width
    }

    /// Every group's rows `rows_per_block·k ..` for each block `k` of rows, in block order:
    /// what one forward task writes (`[its rows, group width]` per group).
    pub(crate) fn row_blocks(&mut self, rows_per_block: usize) -> Vec<Vec<&mut [T]>> {
        let blocks = self.n.div_ceil(rows_per_block.max(1));
        let mut out: Vec<Vec<&mut [T]>> = (0..blocks).map(|_| Vec::new()).collect();
        for (g, group) in self.groups.iter_mut().enumerate() {
            let cols = self.width.min(self.vocab - g * self.width);
            let data = group.get_mut().unwrap_or_else(|e| e.into_inner());
            let Some(data) = data.as_mut() else { continue };
            for (k, rows) in data.chunks_mut(rows_per_block * cols).enumerate() {
                out[k].push(rows);
            }
        }
        out
    }

    /// Group `g`, for its backward task (`None` once released).
    pub(crate) fn group(&self, g: usize) -> Option<KeptGroup<'_, T>> {
        let guard = self
            .groups
            .get(g)?
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        guard.as_ref()?;
        Some(KeptGroup {
            guard,
            width: self.width.min(self.vocab - g * self.width),
            first: g * self.width,
        })
    }

    /// Frees group `g`'s logits: its task has read them for the last time.
    pub(crate) fn release(&self, g: usize) {
        if let Some(group) = self.groups.get(g) {
            drop(group.lock().unwrap_or_else(|e| e.into_inner()).take());
        }
    }

    /// How many groups still hold their logits.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        let held = |g: &Mutex<Option<Vec<T>>>| g.lock().map(|g| g.is_some()).unwrap_or(false);
        self.groups.iter().filter(|g| held(g)).count()
    }
}

impl<T: Real> KeptGroup<'_, T> {
    /// Row `i`'s logits of vocabulary entries `c0 .. c0 + len` (inside this group).
    #[inline]
    pub(crate) fn row(&self, i: usize, c0: usize, len: usize) -> &[T] {
        let data = self.guard.as_deref().unwrap_or(&[]);
        let at = i * self.width + (c0 - self.first);
        &data[at..at + len]
    }
}

/// `n` zeros in a buffer of at least glibc's mmap threshold ([`crate::host_memory`]), so it
/// is mapped on its own and freeing it returns its pages to the kernel whatever `n` is (a
/// smaller one would come from the heap and raise its high-water mark for good). The capacity
/// past `n` is never touched: it costs address space, not memory.
fn own_mapping<T: Real>(n: usize) -> Vec<T> {
    let least = crate::host_memory::MMAP_THRESHOLD / std::mem::size_of::<T>().max(1);
    let mut v = vec![T::ZERO; n.max(least)];
    v.truncate(n);
    v
}
