//! The AVX2 micro-kernel of [`super::Int8Weight`], for CPUs without AVX-512 VNNI: the same
//! packed panel (`[in/4][16][4]` i8) and the same exact integer sums, with the activations
//! centred (`a = u − 128 ∈ [−127, 127]`) so `vpmaddubsw` cannot saturate: it multiplies
//! `|w|` (unsigned, ≤ 127) by `a` carrying the weight's sign, pairs of products stay within
//! ±32 258 < 2^15, and `vpmaddwd` by ones sums each lane's 4 products into i32. The result
//! is `Σ a·w`, the VNNI kernel's `Σ u·w` minus the weight's offset term, exactly.

#[cfg(target_arch = "x86_64")]
use super::int8_panel::row_blocks;
use super::int8_panel::{GROUP, PANEL};
#[cfg(target_arch = "x86_64")]
use super::next_panel::NextPanel;

/// Rows per register block (8 accumulators of 8 lanes).
const MR: usize = 4;

/// Whether this CPU runs the AVX2 kernel.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `acc[m][lane] = Σ_k (u[m, k] − 128) · w[lane, k]` for one panel `w` and `rows` quantized
/// rows `x` of `in_pad` bytes. Callers check [`available`] first.
pub(crate) fn panel_centred(x: &[u8], rows: usize, in_pad: usize, w: &[i8], acc: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(available(), "int8 AVX2 kernel called on a CPU without AVX2");
        assert_eq!(w.len(), in_pad / GROUP * PANEL * GROUP);
        assert!(acc.len() >= rows * PANEL && x.len() >= rows * in_pad);
        // The blocks fetch the next panel into the cache as they go (the first block all of it).
        let next = std::cell::RefCell::new(NextPanel::after(w.as_ptr().cast(), w.len()));
        // SAFETY (both closures): the CPU feature was checked above; the asserts bound every
        // access.
        row_blocks(
            rows,
            MR,
            acc,
            |m, acc| unsafe { x86::block::<MR>(x, in_pad, m, w, acc, &mut next.borrow_mut()) },
            |m, acc| unsafe { x86::block::<1>(x, in_pad, m, w, acc, &mut next.borrow_mut()) },
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, rows, in_pad, w, acc);
        unreachable!("AVX2 kernel on a non-x86 CPU");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{NextPanel, GROUP, PANEL};
    use std::arch::x86_64::*;

    /// Rows `m0..m0 + R` of one panel, fetching the panel after it into the cache a line per
    /// group (the first block fetches all of it: a group is one line of the panel).
    ///
    /// # Safety
    /// The CPU has AVX2; `x` holds rows `m0..m0+R` of `in_pad` bytes; `w` holds `in_pad / 4`
    /// groups of 64 bytes; `acc` holds `(m0 + R) * 16` lanes.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn block<const R: usize>(
        x: &[u8],
        in_pad: usize,
        m0: usize,
        w: &[i8],
        acc: &mut [i32],
        next: &mut NextPanel,
    ) {
        let groups = in_pad / GROUP;
        let ones = _mm256_set1_epi16(1);
        let mut lo = [_mm256_setzero_si256(); R];
        let mut hi = [_mm256_setzero_si256(); R];
        let x = x.as_ptr().add(m0 * in_pad);
        let wp = w.as_ptr();
        for g in 0..groups {
            let w0 = _mm256_loadu_si256(wp.add(g * PANEL * GROUP) as *const _);
            let w1 = _mm256_loadu_si256(wp.add(g * PANEL * GROUP + 32) as *const _);
            next.fetch_one();
            let (a0, a1) = (_mm256_abs_epi8(w0), _mm256_abs_epi8(w1));
            for r in 0..R {
                let four = (x.add(r * in_pad + g * GROUP) as *const i32).read_unaligned();
                // u ^ 0x80 read as i8 is u − 128.
                let xs = _mm256_set1_epi32(four ^ 0x8080_8080u32 as i32);
                let p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xs, w0));
                let p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xs, w1));
                lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(p0, ones));
                hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(p1, ones));
            }
        }
        for r in 0..R {
            let dst = acc.as_mut_ptr().add((m0 + r) * PANEL);
            _mm256_storeu_si256(dst as *mut _, lo[r]);
            _mm256_storeu_si256(dst.add(8) as *mut _, hi[r]);
        }
    }
}
