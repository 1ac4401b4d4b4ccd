//! Which keys each query of causal self-attention sees: the causal rule, key padding, an
//! optional sliding window and packed segments (several sequences in one row), as index ranges
//! and per-key flags (never a `[B, 1, T, T]` mask).
//! Pure index bookkeeping for the attention kernels; no scores, no tensors.

use std::ops::Range;

use candle_core::Result;

/// Visibility over `t` queries and the same `t` keys (self-attention without a KV cache).
///
/// Key `j` is visible to query `i` (both in `0..t`) iff `j <= i`, key `j` of that batch row
/// is valid (not padding), with a window `w`, `i - j < w`, and, with segments, `j` lies in the
/// segment of `i` (a segment is a maximal run of equal segment ids in a row). A query row that
/// sees no key at all is *dead* (the attention kernels give it the uniform average over all
/// `t` keys).
#[derive(Clone, Debug)]
pub(crate) struct Visibility {
    t: usize,
    window: Option<usize>,
    /// `[B, T]` first index of each token's segment (`None`: one segment per row).
    seg_start: Option<Vec<u32>>,
    /// `[B, T]` one past the last index of each token's segment (`None`: `t`).
    seg_end: Option<Vec<u32>>,
    /// `[B, T]` key validity (`None`: every key is valid).
    valid: Option<Vec<bool>>,
    /// `[B, T + 1]` running counts of valid keys: `counts[b][j]` valid keys in `0..j`.
    counts: Vec<u32>,
}

impl Visibility {
    /// `key_mask`: row-major `[batch, t]`, nonzero = real token, 0 = padding (`None`: all
    /// real). `segments`: row-major `[batch, t]` segment ids (`None`: one segment per row).
    /// `window`: sliding window in tokens (`Some(0)` hides every key).
    pub(crate) fn new(
        op: &str,
        (batch, t): (usize, usize),
        key_mask: Option<&[u32]>,
        segments: Option<&[u32]>,
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
        let (seg_start, seg_end) = match segments {
            Some(s) if s.len() != batch * t => candle_core::bail!(
                "{op}: `segments` must hold batch * T = {batch} * {t} = {} ids, got {}",
                batch * t,
                s.len()
            ),
            Some(s) => segment_bounds(s, t),
            None => (None, None),
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
            seg_start,
            seg_end,
            valid,
            counts,
        })
    }

    /// Keys query `i` of batch row `b` may see before the padding rule: `lo..i + 1` (causal,
    /// window and segment). `lo` never decreases as `i` grows.
    #[inline]
    pub(crate) fn key_range(&self, b: usize, i: usize) -> Range<usize> {
        let win = self.window.map_or(0, |w| (i + 1).saturating_sub(w));
        let seg = self
            .seg_start
            .as_ref()
            .map_or(0, |s| s[b * self.t + i] as usize);
        win.max(seg).min(i + 1)..i + 1
    }

    /// The keys of [`Self::key_range`] that fall in the block `block`.
    #[inline]
    pub(crate) fn key_range_in(&self, b: usize, i: usize, block: &Range<usize>) -> Range<usize> {
        let r = self.key_range(b, i);
        let lo = r.start.max(block.start);
        lo..r.end.min(block.end).max(lo)
    }

    /// Queries of batch row `b` whose [`Self::key_range`] meets the non-empty key block
    /// `keys` (a superset of those that see one of its keys, since padding is not taken into
    /// account): from the block's first key to the end of its last key's segment, cut by
    /// the window.
    pub(crate) fn query_range_for(&self, b: usize, keys: &Range<usize>) -> Range<usize> {
        let mut hi = match self.window {
            Some(w) => (keys.end + w).saturating_sub(1).min(self.t),
            None => self.t,
        };
        if let (Some(end), Some(last)) = (&self.seg_end, keys.end.checked_sub(1)) {
            hi = hi.min(end[b * self.t + last] as usize);
        }
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
        let r = self.key_range(b, i);
        let c = &self.counts[b * (self.t + 1)..(b + 1) * (self.t + 1)];
        c[r.end] > c[r.start]
    }

    /// The dead queries of batch row `b`, in increasing order.
    pub(crate) fn dead_rows(&self, b: usize) -> Vec<usize> {
        (0..self.t).filter(|&i| !self.row_sees_any(b, i)).collect()
    }
}

/// Per-token segment start and end (`[B, T]` each) of the runs of equal ids in each row of
/// `segments` (`[B, t]`), or `None`s when every row is a single run.
fn segment_bounds(segments: &[u32], t: usize) -> (Option<Vec<u32>>, Option<Vec<u32>>) {
    if t == 0 || segments.chunks(t).all(|r| r.iter().all(|&x| x == r[0])) {
        return (None, None);
    }
    let mut start = vec![0u32; segments.len()];
    let mut end = vec![0u32; segments.len()];
    for (row, (st, en)) in segments
        .chunks(t)
        .zip(start.chunks_mut(t).zip(end.chunks_mut(t)))
    {
        let mut lo = 0;
        for i in 0..t {
            if i > 0 && row[i] != row[i - 1] {
                en[lo..i].fill(i as u32);
                lo = i;
            }
            st[i] = lo as u32;
        }
        en[lo..].fill(t as u32);
    }
    (Some(start), Some(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule spelled out per (i, j), as `models/src/nn/mask.rs` builds it.
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
            let vis = Visibility::new("test", (3, t), Some(&mask), None, window)?;
            for b in 0..3 {
                let valid = vis.valid_keys(b).expect("some padding");
                for i in 0..t {
                    let mut any = false;
                    for (j, &ok) in valid.iter().enumerate() {
                        let want = visible(&mask, t, b, i, j, window);
                        let got = vis.key_range(b, i).contains(&j) && ok;
                        assert_eq!(got, want, "b {b} i {i} j {j} window {window:?}");
                        any |= want;
                        if want {
                            let block = (j / 4) * 4..((j / 4) * 4 + 4).min(t);
                            assert!(vis.key_range_in(b, i, &block).contains(&j));
                            assert!(vis.query_range_for(b, &block).contains(&i));
                        }
                    }
                    assert_eq!(vis.row_sees_any(b, i), any, "b {b} i {i}");
                }
            }
        }
        let vis = Visibility::new("test", (3, t), Some(&mask), None, None)?;
        assert_eq!(vis.dead_rows(0), vec![0, 1, 2]);
        assert!(vis.dead_rows(1).is_empty() && vis.dead_rows(2).is_empty());
        Ok(())
    }

    #[test]
    fn all_valid_masks_are_dropped_and_bad_lengths_fail() -> Result<()> {
        let vis = Visibility::new("test", (2, 3), Some(&[1, 1, 1, 2, 1, 1]), None, None)?;
        assert!(vis.valid_keys(1).is_none());
        let err = Visibility::new("op", (2, 3), Some(&[1, 1]), None, None).unwrap_err();
        assert!(err.to_string().contains("`key_mask` must hold"), "{err}");
        Ok(())
    }

    #[test]
    fn segments_limit_keys_to_their_run() -> Result<()> {
        let t = 10;
        // Row 0: segments [0, 4), [4, 9), then one pad token as its own run; row 1: one run.
        let mut seg = vec![0u32; 2 * t];
        seg[4..9].fill(1);
        seg[9] = 7;
        let mut mask = vec![1u32; 2 * t];
        mask[9] = 0;
        for window in [None, Some(2), Some(4)] {
            let vis = Visibility::new("test", (2, t), Some(&mask), Some(&seg), window)?;
            for b in 0..2 {
                let run = |k: usize| {
                    (1..=k)
                        .filter(|&x| seg[b * t + x] != seg[b * t + x - 1])
                        .count()
                };
                for i in 0..t {
                    for j in 0..t {
                        let want = visible(&mask, t, b, i, j, window) && run(i) == run(j);
                        let got = vis.key_range(b, i).contains(&j)
                            && vis.valid_keys(b).is_none_or(|v| v[j]);
                        assert_eq!(got, want, "b {b} i {i} j {j} window {window:?}");
                        if want {
                            let block = (j / 3) * 3..((j / 3) * 3 + 3).min(t);
                            assert!(vis.query_range_for(b, &block).contains(&i));
                        }
                    }
                }
            }
            assert_eq!(vis.dead_rows(0), vec![9]);
        }
        let err = Visibility::new("op", (2, 3), None, Some(&[0, 1]), None).unwrap_err();
        assert!(err.to_string().contains("`segments` must hold"), "{err}");
        Ok(())
    }
}
