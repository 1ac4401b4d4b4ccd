//! The AVX-512 VNNI micro-kernel of [`super::Int8Weight`]: for one packed panel of 16 output
//! channels, blocks of up to 8 activation rows accumulate in 8 zmm registers of i32 lanes,
//! each step one 64-byte weight load, 8 broadcasts of 4 activation bytes and 8 `vpdpbusd`.
//! Integer arithmetic only, so it matches the portable kernel bit for bit.

#[cfg(target_arch = "x86_64")]
use super::int8_panel::row_blocks;
use super::int8_panel::{GROUP, PANEL};

/// Rows per register block.
const MR: usize = 8;

/// Whether this CPU runs the VNNI kernel (checked once, cached by std).
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `acc[m][lane] = Σ_k u[m, k] · w[lane, k]` for one panel `w` (`[in/4][16][4]` i8) and
/// `rows` quantized rows `x` of `in_pad` bytes. Callers check [`available`] first.
pub(crate) fn panel(x: &[u8], rows: usize, in_pad: usize, w: &[i8], acc: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            available(),
            "int8 VNNI kernel called on a CPU without AVX-512 VNNI"
        );
        assert_eq!(w.len(), in_pad / GROUP * PANEL * GROUP);
        assert!(acc.len() >= rows * PANEL && x.len() >= rows * in_pad);
        // SAFETY (both closures): the CPU features were checked above; the asserts bound every
        // access.
        row_blocks(
            rows,
            MR,
            acc,
            |m, acc| unsafe { x86::block::<MR>(x, in_pad, m, w, acc) },
            |m, acc| unsafe { x86::block::<1>(x, in_pad, m, w, acc) },
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, rows, in_pad, w, acc);
        unreachable!("VNNI kernel on a non-x86 CPU");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{GROUP, PANEL};
    use std::arch::x86_64::*;

    /// Rows `m0..m0 + R` of one panel.
    ///
    /// # Safety
    /// The CPU has AVX-512F/BW/VNNI; `x` holds rows `m0..m0+R` of `in_pad` bytes; `w` holds
    /// `in_pad / 4` groups of 64 bytes; `acc` holds `(m0 + R) * 16` lanes.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn block<const R: usize>(
        x: &[u8],
        in_pad: usize,
        m0: usize,
        w: &[i8],
        acc: &mut [i32],
    ) {
        let groups = in_pad / GROUP;
        let mut sums = [_mm512_setzero_si512(); R];
        let x = x.as_ptr().add(m0 * in_pad);
        let wp = w.as_ptr();
        for g in 0..groups {
            let wv = _mm512_loadu_si512(wp.add(g * PANEL * GROUP) as *const _);
            for (r, s) in sums.iter_mut().enumerate() {
                let four = (x.add(r * in_pad + g * GROUP) as *const i32).read_unaligned();
                *s = _mm512_dpbusd_epi32(*s, _mm512_set1_epi32(four), wv);
            }
        }
        for (r, s) in sums.iter().enumerate() {
            _mm512_storeu_si512(acc.as_mut_ptr().add((m0 + r) * PANEL) as *mut _, *s);
        }
    }
}
