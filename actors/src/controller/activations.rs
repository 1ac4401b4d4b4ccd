//! What a trainer keeps of its forward for the backward: the layerwise backward by default
//! (each decoder layer's activations freed as soon as its backward is done), activation
//! checkpointing when the recipe asks for it, and candle's plain backward where neither
//! applies.

use crate::recipe::{Recipe, Sharding};

/// How one trainer's backward holds the forward's activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activations {
    /// `model.gradient_checkpointing`: each layer recomputed in the backward.
    Recompute,
    /// The layerwise backward: no recompute, each layer's activations freed in turn.
    Layerwise,
    /// Candle's one backward: every activation lives until the backward ends. A GPU
    /// trainer, and a sharded or expert-parallel one (they stream or spread their layers
    /// their own way).
    Plain,
}

impl Activations {
    /// The mode of a trainer of `recipe` on a device that `is_cpu` or not.
    pub(crate) fn of(recipe: &Recipe, is_cpu: bool) -> Activations {
        let replicated =
            recipe.placement.sharding != Sharding::Sharded && recipe.placement.expert_parallel <= 1;
        match (recipe.model.gradient_checkpointing, replicated && is_cpu) {
            (true, _) => Activations::Recompute,
            (false, true) => Activations::Layerwise,
            (false, false) => Activations::Plain,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layerwise_only_where_a_replicated_cpu_trainer_runs() {
        let mut r = Recipe::default();
        assert_eq!(Activations::of(&r, true), Activations::Layerwise);
        assert_eq!(Activations::of(&r, false), Activations::Plain);
        r.placement.expert_parallel = 2;
        assert_eq!(Activations::of(&r, true), Activations::Plain);
        r.placement.expert_parallel = 1;
        r.placement.sharding = Sharding::Sharded;
        assert_eq!(Activations::of(&r, true), Activations::Plain);
        r.model.gradient_checkpointing = true;
        r.placement.sharding = Sharding::Replicated;
        assert_eq!(Activations::of(&r, true), Activations::Recompute);
    }
}
