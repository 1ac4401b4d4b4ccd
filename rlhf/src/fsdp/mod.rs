//! FSDP / ZeRO-3-style sharding of one trainer over the replicas of a role's device group, used
//! with `placement.sharding = "sharded"` by the policy and the critic.
//!
//! Each replica keeps 1/N of every parameter as an f32 master shard ([`ShardLayout`]: a flat
//! shard per parameter, padded to equal lengths), 1/N of the gradients (reduce-scattered) and
//! 1/N of AdamW's moments (an [`AdamW`](crate::optim::AdamW) over the shards). During a step
//! the decoder layers are gathered just in time, one at a time, for the forward and again for
//! the backward, and freed right after each ([`LayerStream`]; the backward recomputes each
//! layer and reduce-scatters its gradients before moving on); the parameters outside the layers
//! (embedding, final norm, head) are gathered for the step. Between steps a replica holds only
//! its shards ([`ShardedParams`]). The trainers use this through their `shard` methods; this
//! module spawns nothing and knows nothing of actors.
//!
//! The files:
//! * `layout.rs`: [`ShardLayout`]. Each parameter is flattened and cut into `world` chunks of
//!   `ceil(numel / world)` elements, the last padded with zeros, so every rank's shard has one
//!   length and AdamW's per-parameter groups (weight decay) stay exact. Units: one per decoder
//!   layer, one for the rest (embedding, final norm, head); `units_by_layer` says which layer
//!   each is.
//! * `storage.rs`: freeing and refilling a CPU f32 `Var`'s storage in place (candle
//!   `InplaceOp1`): the model keeps its layers and tensors, their elements come and go.
//! * `params.rs`: [`ShardedParams`], the f32 master shards; `gather_unit`/`release_unit`
//!   (all-gather one unit into the model's `Var`s, free it; the per-unit state sits behind a
//!   lock so a layer can be gathered from inside candle's forward and backward),
//!   `gather`/`gather_rest`/`release`; `reduce_scatter_unit` of one unit's gradients, and
//!   `reduce_scatter` of the units not yet handed over, last layer first (the order a streamed
//!   backward uses, so a rank whose backward never reached its layers still meets its peers'
//!   exchanges in order); the global gradient norm (per-rank f64 sums gathered and added in
//!   rank order), the non-finite check over every rank's shards.
//! * `stream.rs`: [`LayerStream`], the model's `LayerResidency` for a sharded replica. Acquire
//!   = gather the layer's unit, release = free it, and `take_gradients` reduce-scatters a
//!   layer's full gradients to this rank's shard the moment its backward has run, and measures
//!   the bytes held then.
//! * `step.rs`: one step: backward (each streamed layer hands over its shard gradients during
//!   it), reduce-scatter of what is left (the rest unit), drop the full gradients, clip by the
//!   group's norm, AdamW (`shard_optimizer`: the same groups as `AdamW::for_params`) on the
//!   shards; the step's peak bytes.
//! * `state_io.rs`: each rank's AdamW state in `optimizer/shard_<rank>/` with its
//!   `shard_layout.json`; loading checks the layout first (another group size is refused, not
//!   resharded).
//! * `memory.rs`: `TrainMemory`, bytes of parameters, gradients and moments, measured from
//!   tensor storage, and the step's peak.
//!
//! **Layers just in time** (`models/src/nn/streamed_layer.rs`).
//! `Sharded::shard(rank, world, collective)` gives the model's decoder a `LayerStream` over the
//! role's collective group (`Decoder::set_layer_residency`). From then on each decoder layer
//! whose weights are absent runs as one candle custom op: its forward gathers the layer, runs
//! it outside the autograd graph and frees it; its backward gathers the layer again, recomputes
//! it from the saved input (replaying the experts the forward chose), backpropagates the
//! incoming gradient through that layer alone, hands the layer's weight gradients to the stream
//! (reduce-scatter to the shard) and frees the layer and its full gradients before the layer
//! below runs. A sparse layer's op also outputs its router logits, so the load-balancing loss
//! keeps its gradient through the routers; rollout routing replay works as without sharding. A
//! training step gathers only the rest unit up front (`TrainParams::gather_for_step`) and
//! releases everything after the optimizer step. The price is one extra forward of every layer
//! (activation checkpointing); the saving is that a step holds the shards, their gradients and
//! moments (4/N of the model), the rest unit with its gradients, and one layer with its
//! gradients (docs/PERFORMANCE.md, "Sharded (FSDP) training"). Every rank runs the same layers
//! in the same order, forward and reverse, so the gathers and reduce-scatters line up across
//! ranks. A trainer sharded without a collective in a larger group (tests only) gathers the
//! whole model for each step instead.
//!
//! **Around it.** `trainer/sharding.rs` holds `TrainParams` (replicated or sharded; `apply`
//! dispatches to all-reduce or reduce-scatter) and the `Sharded` trait of `PolicyTrainer` and
//! `CriticTrainer` (`shard`, `gather`, `release`, `save_optimizer`, `load_optimizer`,
//! `memory`). Setup shards each trainer after its engine has taken its copy
//! (`actors/src/controller/setup.rs`, `shard_if`), and builds a sharded role's collective group
//! before its trainers (`replica_group`) so `shard` can stream over it. Scoring (π_old,
//! values), refit and saving still gather the whole model around the use
//! (`actors/src/roles/sharded.rs`: `with_policy_gathered`, `with_gathered`, on every rank even
//! with no rows): they hold no gradients, and a rank without rows takes part in the gather
//! without running a forward. Each replica's engine keeps its own full copy (it generates).
//! Reading a released model through a trainer method is `RlhfError::Sharding`, not a crash.
//! Saving gathers and rank 0 writes the whole HF weights, every rank writes its optimizer
//! shard; resume (`actors/src/controller/run/resume_point.rs`) accepts the sharded optimizer
//! layout. Not sharded: DPO, reward-model training, a quantized engine's trainer scoring,
//! non-CPU devices (the recipe check, `actors/src/recipe/sharding_check.rs`, refuses them).

mod layout;
mod memory;
mod params;
mod state_io;
mod step;
mod storage;
mod stream;

pub use memory::TrainMemory;
pub(crate) use params::ShardedParams;
pub(crate) use state_io::{load_shard_state, save_shard_state};
pub(crate) use step::{apply_sharded_gradients, shard_optimizer};
pub(crate) use storage::held_bytes;
pub(crate) use stream::LayerStream;
