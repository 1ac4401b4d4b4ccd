//! How the host allocator treats tensor buffers: freed buffers stay in the process for the
//! next step instead of going back to the kernel. Not an allocator of our own: glibc's
//! malloc, tuned once at start-up.
//!
//! Every candle op allocates its output. With glibc's defaults a buffer above the mmap
//! threshold (128 KiB, rising to at most 32 MiB as buffers are freed) is mapped fresh and
//! unmapped when freed, and a heap top above the trim threshold is handed back, so each step
//! pays page faults and the kernel zeroing those pages again: 22% of a `bench train` profile
//! was `clear_page_erms`. Raising both thresholds keeps the memory mapped for reuse; peak
//! RSS is unchanged (the same buffers live at the peak either way).
//!
//! One arena ([`ARENA_MAX`]): glibc gives each thread an arena of its own (up to 8 per
//! core), and a buffer goes back to the arena that allocated it. The roles of a run work on
//! different threads (the trainer's lane, the engine's lane, rayon's workers, tokio's), so
//! each arena kept its own high-water mark and the heap grew step after step: peak RSS of a
//! 4-step GRPO run on the 56M model fell from 1908 to 1706 MiB (full fine-tuning) and from
//! 1118 to 876 MiB (LoRA) with one arena, at 2-3% of training and generation throughput on
//! 2 cores (docs/PERFORMANCE.md).

/// Largest buffer (bytes) served from the heap rather than a fresh mapping: glibc's maximum.
pub(crate) const MMAP_THRESHOLD: usize = 32 << 20;
/// Free heap memory (bytes) kept before any is handed back to the kernel: 2 GiB, the most
/// `mallopt` takes.
pub(crate) const TRIM_THRESHOLD: usize = i32::MAX as usize;

/// Arenas glibc's malloc may create: one, shared by every thread.
pub(crate) const ARENA_MAX: usize = 1;

/// Applies [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`] unless the user set glibc's own
/// `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`, and [`ARENA_MAX`] unless the user set
/// `MALLOC_ARENA_MAX`. Returns whether it changed anything. A no-op on targets without
/// glibc. Call it first thing in `main`.
pub fn configure_host_allocator() -> bool {
    let set = |name: &str| std::env::var_os(name).is_some();
    let thresholds = !set("MALLOC_MMAP_THRESHOLD_") && !set("MALLOC_TRIM_THRESHOLD_");
    let arenas = !set("MALLOC_ARENA_MAX");
    let a = thresholds && apply_thresholds();
    let b = arenas && apply_arena_max();
    a || b
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply_thresholds() -> bool {
    // SAFETY: mallopt only changes allocator parameters; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) == 1
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply_arena_max() -> bool {
    // SAFETY: as above.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX as libc::c_int) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply_thresholds() -> bool {
    false
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply_arena_max() -> bool {
    false
}

/// `n` copies of `zero` whose pages are written, for a buffer a kernel reads before it writes (a GEMM
/// destination it accumulates into). `vec![0; n]` is `calloc`, which for memory fresh from
/// the heap top writes nothing: the kernel's first read then maps the shared zero page, and
/// its first write faults again to replace that read-only mapping, which flushes the TLB of
/// every core running the process (`do_wp_page`, `flush_tlb_mm_range`; a third of a LoRA
/// update's time on 2 cores). One volatile write per 4 KiB page makes the first touch a
/// write: one fault, no flush.
pub fn zeros_touched<T: Copy>(n: usize, zero: T) -> Vec<T> {
    let mut v = vec![zero; n];
    touch_pages(&mut v, zero);
    v
}

/// Writes `zero` once per 4 KiB page of `v` (volatile, so it happens), making each page's
/// first touch a write ([`zeros_touched`]): for a buffer from `calloc` whose parts are
/// first used at different times, each part touched when its user starts.
pub fn touch_pages<T: Copy>(v: &mut [T], zero: T) {
    let per_page = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for x in v.iter_mut().step_by(per_page) {
        // SAFETY: `x` is a valid, aligned, exclusive reference into `v`.
        unsafe { std::ptr::write_volatile(x, zero) };
    }
}
