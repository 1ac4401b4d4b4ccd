//! One named parameter of a model: its exact HF tensor name, shape, kind, and what the kind
//! implies (random initialisation, weight decay, engine precision); plus seeded random
//! initialisation of a list of them. Which parameters a model has is declared in `layout.rs`
//! and the family files (`family/`); this file knows nothing about architectures.

use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_distr::{Distribution, Normal};
use std::collections::HashMap;

/// How a parameter is initialised by `init_random`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamInit {
    /// Normal(0, std) (linear and embedding weights; std 0.02).
    Normal(f64),
    /// All ones (RMSNorm weights).
    Ones,
    /// All zeros (biases).
    Zeros,
}

/// What a parameter is. Its initialiser, weight-decay rule and engine precision follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamKind {
    /// A token embedding matrix `[V, H]`.
    Embedding,
    /// The weight `[out, in]` of a linear layer (projections, heads).
    Linear,
    /// The weight `[out, in]` of an MoE router or shared-expert gate: a linear layer whose
    /// outputs pick experts, so the engine keeps it in f32 (never quantized).
    Router,
    /// The bias `[out]` of a linear layer.
    Bias,
    /// An RMSNorm scale `[H]`.
    Norm,
}

/// How the engine may store a parameter for rollouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DtypePolicy {
    /// May be quantized (int8 / q4) when the engine is asked to (linear weights).
    Quantizable,
    /// Always kept in f32 (norms, biases, embedding lookups).
    F32,
}

impl ParamKind {
    /// The random initialiser: Normal(0, 0.02) for weights and embeddings, ones for norms,
    /// zeros for biases.
    pub fn init(self) -> ParamInit {
        match self {
            ParamKind::Embedding | ParamKind::Linear | ParamKind::Router => ParamInit::Normal(STD),
            ParamKind::Norm => ParamInit::Ones,
            ParamKind::Bias => ParamInit::Zeros,
        }
    }

    /// Whether AdamW's weight decay applies (linear and router weights; norms, biases and
    /// embeddings are exempt).
    pub fn decays(self) -> bool {
        matches!(self, ParamKind::Linear | ParamKind::Router)
    }

    /// The engine's storage rule for this kind (routers stay f32, so quantization never
    /// moves a routing decision through the router's own weights).
    pub fn dtype_policy(self) -> DtypePolicy {
        match self {
            ParamKind::Linear => DtypePolicy::Quantizable,
            _ => DtypePolicy::F32,
        }
    }
}

/// One named parameter: HF tensor name, shape and kind.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// HF tensor name, e.g. `model.layers.0.mlp.gate_proj.weight`.
    pub name: String,
    /// Shape, e.g. `[intermediate_size, hidden_size]`.
    pub shape: Vec<usize>,
    /// What the parameter is (decides init, decay and engine precision).
    pub kind: ParamKind,
}

impl ParamSpec {
    /// A parameter named `name` of `shape` and `kind`.
    pub fn new(name: impl Into<String>, shape: Vec<usize>, kind: ParamKind) -> ParamSpec {
        ParamSpec {
            name: name.into(),
            shape,
            kind,
        }
    }

    /// The initialiser implied by the kind.
    pub fn init(&self) -> ParamInit {
        self.kind.init()
    }

    /// Number of scalars.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

const STD: f64 = 0.02;

/// Draws every parameter of `specs` from a `StdRng` seeded with `seed`, in the order of
/// `specs` (so the same config and seed always give the same weights).
pub(crate) fn init_tensors(
    specs: &[ParamSpec],
    seed: u64,
    dtype: DType,
    device: &Device,
) -> candle_core::Result<HashMap<String, Tensor>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = HashMap::with_capacity(specs.len());
    for spec in specs {
        let t = match spec.init() {
            ParamInit::Ones => Tensor::ones(spec.shape.as_slice(), dtype, device)?,
            ParamInit::Zeros => Tensor::zeros(spec.shape.as_slice(), dtype, device)?,
            ParamInit::Normal(std) => {
                let dist = Normal::new(0.0f32, std as f32)
                    .map_err(|e| candle_core::Error::Msg(format!("normal({std}): {e}")))?;
                let values: Vec<f32> = (0..spec.numel()).map(|_| dist.sample(&mut rng)).collect();
                Tensor::from_vec(values, spec.shape.as_slice(), device)?.to_dtype(dtype)?
            }
        };
        out.insert(spec.name.clone(), t);
    }
    Ok(out)
}
