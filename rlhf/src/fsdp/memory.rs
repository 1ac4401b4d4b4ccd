//! What a replica holds for training, measured from the storage behind its tensors (not
//! computed from shapes): parameters, gradients kept for the optimizer, optimizer moments.

/// Bytes one replica holds, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TrainMemory {
    /// Parameters: the model's `Var`s as they are now, plus the master shards when sharded.
    pub params: usize,
    /// Gradients the optimizer steps on: the full gradients when replicated, this rank's
    /// reduce-scattered shard when sharded (measured during a step; see the trainers).
    pub grads: usize,
    /// AdamW's first and second moments.
    pub optimizer: usize,
    /// The most the last step held at once, measured when its backward returned: the
    /// model's `Var`s (gathered, when sharded), every full gradient, the master shards and
    /// the moments (activations not counted). `None` before a step, and for an
    /// expert-parallel trainer (not measured).
    pub step_peak: Option<usize>,
}

impl TrainMemory {
    /// The sum of the three.
    pub fn total(&self) -> usize {
        self.params + self.grads + self.optimizer
    }
}
