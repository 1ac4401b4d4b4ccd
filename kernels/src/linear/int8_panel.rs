//! The int8 weight's panel format, shared by the packing code and the VNNI, AVX2 and portable
//! kernels: channels per panel, inputs per group, and the activation offset.

/// Output channels per packed panel (one 512-bit register of i32 accumulators).
pub(crate) const PANEL: usize = 16;
/// Inputs per packed group (`vpdpbusd` sums 4 adjacent u8·i8 products per lane).
pub(crate) const GROUP: usize = 4;
/// The offset that turns a signed activation in `[-127, 127]` into the unsigned byte VNNI
/// expects; removed again with the weight's column sums.
pub(crate) const ACT_OFFSET: i32 = 128;

/// Walks `rows` rows in blocks of `mr` (`full(m, acc)` for rows `m..m + mr`), then the rest
/// one at a time (`single(m, acc)`): the row loop every register kernel of a panel shares.
#[cfg(target_arch = "x86_64")]
pub(crate) fn row_blocks(
    rows: usize,
    mr: usize,
    acc: &mut [i32],
    full: impl Fn(usize, &mut [i32]),
    single: impl Fn(usize, &mut [i32]),
) {
    let mut m = 0;
    while m + mr <= rows {
        full(m, acc);
        m += mr;
    }
    while m < rows {
        single(m, acc);
        m += 1;
    }
}
