//! Fetching the next packed panel into the cache while the register kernels multiply this
//! one, shared by the f32/bf16 (`packed_x86.rs`) and int8 (`int8_avx2.rs`) AVX2 kernels.
//! Without it the first row block of every panel waited on memory: it reads the panel at
//! one core's memory stream speed, below the block's arithmetic speed.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};

/// The panel after this one in memory, fetched a cache line per call of
/// [`NextPanel::fetch_one`].
pub(super) struct NextPanel {
    line: *const u8,
    left: usize,
}

impl NextPanel {
    /// The `bytes` bytes after the panel of `bytes` bytes at `panel`. Past the last panel
    /// the address is made with `wrapping_add` and only ever prefetched, never read.
    pub(super) fn after(panel: *const u8, bytes: usize) -> Self {
        Self {
            line: panel.wrapping_add(bytes),
            left: bytes / 64,
        }
    }

    /// Prefetches the next line into L2, if any is left. A prefetch never faults.
    #[inline(always)]
    pub(super) fn fetch_one(&mut self) {
        if self.left > 0 {
            // SAFETY: `_mm_prefetch` needs SSE, part of x86-64; it reads nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.line.cast()) };
            self.line = self.line.wrapping_add(64);
            self.left -= 1;
        }
    }
}
