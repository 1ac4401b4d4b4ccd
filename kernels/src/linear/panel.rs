//! The packed f32/bf16 weight's panel format, shared by the packing code and the register
//! kernels: the panel width and the element types a panel can hold.

use half::bf16;

/// Output channels per packed panel.
pub(crate) const PANEL: usize = 32;

/// An element type a panel can store: how it is made from f32 and widened back.
pub trait PanelElement: Copy + Default + Send + Sync + 'static {
    /// The stored value of an f32 weight.
    fn from_f32(v: f32) -> Self;
    /// The f32 the kernels multiply with.
    fn to_f32(self) -> f32;
    /// Whether the register kernels widen 16-bit bf16 (`true`) or load f32 (`false`).
    const BF16: bool;
}

impl PanelElement for f32 {
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    const BF16: bool = false;
}

impl PanelElement for bf16 {
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    const BF16: bool = true;
}
