//! Which keys each query of causal self-attention sees: the causal rule, key padding and an
//! optional sliding window, as index ranges and per-key flags (never a `[B, 1, T, T]` mask).
//! Pure index bookkeeping for the attention kernels; no scores, no tensors.

use std::ops::Range;

use candle_core::Result;

/// Visibility over `t` queries and the same `t` keys (self-attention without a KV cache).
///
/// Key `j` is visible to query `i` (both in `0..t`) iff `j <= i`, key `j` of that batch row
/// is valid (not padding) and, with a window `w`, `i - j < w`. A query row that sees no key
/// at all is *dead* (the attention kernels give it the uniform average over all `t` keys).
#[derive(Clone, Debug)]
pub(crate) struct Visibility {
    t: usize,
    window: Option<usize>,
    /// `[B, T]` key validity (`None`: every key is valid).
    valid: Option<Vec<bool>>,
    /// `[B, T + 1]` running counts of valid keys: `counts[b][j]` valid keys in `0..j`.
    counts: Vec<u32>,
}

impl Visibility {
    /// `key_mask`: row-major `[batch, t]`, nonzero = real token, 0 = padding (`None`: all
    /// real). `window`: sliding window in tokens (`Some(0)` hides every key).
    pub(crate) fn new(
        op: &str,
        batch: usize,
        t: usize,
        key_mask: Option<&[u32]>,
        window: Option<usize>,
    ) -> Result<Visibility> {
        let valid: Option<Vec<bool>> = match key_mask {
            Some(m) if m.len() != batch * t => candle_core::bail!(
                "{op}: `key_mask` must hold batch * T = {batch} * {t} = {} flags, got {}",
                batch * t,
                m.len()
            ),
            Some(m) if m.iter().all(|&x| x != 0) => None,
            Some(m) => Some(m.iter().map(|&x| x != 0).collect()),
            None => None,
        };
        let mut counts = Vec::with_capacity(batch * (t + 1));
        for b in 0..batch {
            let mut c = 0u32;
            counts.push(c);
            for j in 0..t {
                c += u32::from(valid.as_ref().is_none_or(|v| v[b * t + j]));
                counts.push(c);
            }
        }
        Ok(Visibility {
            t,
            window,
            valid,
            counts,
        })
    }

    /// Keys query `i` may see before the padding rule: `lo..i + 1` (causal and window).
    #[inline]
    pub(crate) fn key_range(&self, i: usize) -> Range<usize> {
        let lo = self.window.map_or(0, |w| (i + 1).saturating_sub(w));
        lo.min(i + 1)..i + 1
    }

    /// The keys of [`Self::key_range`] that fall in the block `block`.
    #[inline]
    pub(crate) fn key_range_in(&self, i: usize, block: &Range<usize>) -> Range<usize> {
        let r = self.key_range(i);
        let lo = r.start.max(block.start);
        lo..r.end.min(block.end).max(lo)
    }

    /// Queries whose [`Self::key_range`] meets the key block `keys` (a superset of those
    /// that see one of its keys, since padding is not taken into account).
    pub(crate) fn query_range_for(&self, keys: &Range<usize>) -> Range<usize> {
        let hi = match self.window {
            Some(w) => (keys.end + w).saturating_sub(1).min(self.t),
            None => self.t,
        };
        keys.start..hi.max(keys.start)
    }

    /// Key validity of batch row `b` (`[T]`), or `None` when no key of any row is padding.
    #[inline]
    pub(crate) fn valid_keys(&self, b: usize) -> Option<&[bool]> {
        self.valid
            .as_ref()
            .map(|v| &v[b * self.t..(b + 1) * self.t])
    }

    /// Whether query `i` of batch row `b` sees at least one key (else it is dead).
    #[inline]
    pub(crate) fn row_sees_any(&self, b: usize, i: usize) -> bool {
        let r = self.key_range(i);
        let c = &self.counts[b * (self.t + 1)..(b + 1) * (self.t + 1)];
        c[r.end] > c[r.start]
    }

    /// The dead queries of batch row `b`, in increasing order.
    pub(crate) fn dead_rows(&self, b: usize) -> Vec<usize> {
        (0..self.t).filter(|&i| !self.row_sees_any(b, i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule spelled out per (i, j), as `models/src/mask.rs` builds it.
    fn visible(key_mask: &[u32], t: usize, b: usize, i: usize, j: usize, w: Option<usize>) -> bool {
        j <= i && w.is_none_or(|w| i - j < w) && key_mask[b * t + j] != 0
    }

    #[test]
    fn ranges_match_the_per_pair_rule() -> Result<()> {
        let t = 9;
        // Row 0 left-padded by 3, row 1 full, row 2 with a hole (not left padding).
        let mut mask = vec![1u32; 3 * t];
        mask[..3].fill(0);
        mask[2 * t + 4] = 0;
        for window in [None, Some(1), Some(3), Some(20), Some(0)] {
            let vis = Visibility::new("test", 3, t, Some(&mask), window)?;
            for b in 0..3 {
                let valid = vis.valid_keys(b).expect("some padding");
                for i in 0..t {
                    let mut any = false;
                    for (j, &ok) in valid.iter().enumerate() {
                        let want = visible(&mask, t, b, i, j, window);
                        let got = vis.key_range(i).contains(&j) && ok;
                        assert_eq!(got, want, "b {b} i {i} j {j} window {window:?}");
                        any |= want;
                        if want {
                            let block = (j / 4) * 4..((j / 4) * 4 + 4).min(t);
                            assert!(vis.key_range_in(i, &block).contains(&j));
                            assert!(vis.query_range_for(&block).contains(&i));
                        }
                    }
                    assert_eq!(vis.row_sees_any(b, i), any, "b {b} i {i}");
                }
            }
        }
        let vis = Visibility::new("test", 3, t, Some(&mask), None)?;
        assert_eq!(vis.dead_rows(0), vec![0, 1, 2]);
        assert!(vis.dead_rows(1).is_empty() && vis.dead_rows(2).is_empty());
        Ok(())
    }

    #[test]
    fn all_valid_masks_are_dropped_and_bad_lengths_fail() -> Result<()> {
        let vis = Visibility::new("test", 2, 3, Some(&[1, 1, 1, 2, 1, 1]), None)?;
        assert!(vis.valid_keys(1).is_none());
        let err = Visibility::new("op", 2, 3, Some(&[1, 1]), None).unwrap_err();
        assert!(err.to_string().contains("`key_mask` must hold"), "{err}");
        Ok(())
    }
}
