//! Which builds of the engine's hot loops this CPU can run.

/// Whether the AVX2+FMA builds of the hot loops can run on this CPU.
pub(crate) fn wide_simd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
