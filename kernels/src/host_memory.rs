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

/// Largest buffer (bytes) served from the heap rather than a fresh mapping: glibc's maximum.
pub(crate) const MMAP_THRESHOLD: usize = 32 << 20;
/// Free heap memory (bytes) kept before any is handed back to the kernel: 2 GiB, the most
/// `mallopt` takes.
pub(crate) const TRIM_THRESHOLD: usize = i32::MAX as usize;

/// Applies [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`] unless the user set glibc's own
/// `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_`. Returns whether it changed anything.
/// A no-op on targets without glibc. Call it first thing in `main`.
pub fn configure_host_allocator() -> bool {
    let user_set = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some();
    !user_set && apply()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    // SAFETY: mallopt only changes allocator parameters; called before threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    false
}
