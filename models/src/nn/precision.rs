//! The numbers a trainer's linear layers compute in ([`Precision`]): f32, bf16 mixed
//! precision (bf16 products with f32 sums over f32 master weights), or the int8 engine's
//! numbers (`fake_quant.rs`). Not here: the kernels (`oxalign_kernels::ops::linear_bf16`,
//! `fake_quant.rs`).

/// The numbers a model's linear layers compute in. Norms, softmax, attention, log-probs
/// and the optimizer stay f32 in every mode; the weights are always f32 (the master copy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Plain f32 (or the weights' dtype).
    #[default]
    F32,
    /// bf16 mixed precision: the attention and MLP projections multiply bf16-rounded inputs
    /// and weights with f32 sums (`torch.autocast(dtype=torch.bfloat16)` for linear
    /// layers); gradients reach the f32 master weights. Routers, the LM head, norms and
    /// embeddings stay f32.
    #[serde(alias = "bf16-mixed")]
    Bf16Mixed,
    /// The int8 engine's W8A8 numbers with straight-through gradients.
    FakeInt8,
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16Mixed => "bf16_mixed",
            Precision::FakeInt8 => "fake_int8",
        })
    }
}

/// A precision name that is not one of [`Precision`]'s.
#[derive(Debug, thiserror::Error)]
#[error("unknown precision {0:?}: expected f32, bf16-mixed or fake_int8")]
pub struct UnknownPrecision(pub String);

impl std::str::FromStr for Precision {
    type Err = UnknownPrecision;

    /// `f32`, `bf16_mixed` (or `bf16-mixed`), `fake_int8`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16_mixed" | "bf16-mixed" => Ok(Precision::Bf16Mixed),
            "fake_int8" | "fake-int8" => Ok(Precision::FakeInt8),
            _ => Err(UnknownPrecision(s.to_string())),
        }
    }
}
