//! FSDP / ZeRO-3-style sharding of one trainer over the replicas of a role's device group.
//!
//! Each replica keeps 1/N of every parameter as an f32 master shard ([`ShardLayout`]: a flat
//! shard per parameter, padded to equal lengths), 1/N of the gradients (reduce-scattered) and
//! 1/N of AdamW's moments (an [`AdamW`](crate::optim::AdamW) over the shards). During a
//! step the decoder layers are gathered just in time, one at a time, for the forward and
//! again for the backward, and freed right after each ([`LayerStream`]; the backward
//! recomputes each layer and reduce-scatters its gradients before moving on); the
//! parameters outside the layers (embedding, final norm, head) are gathered for the step.
//! Between steps a replica holds only its shards ([`ShardedParams`]). The trainers use this
//! through their `shard` methods; this module spawns nothing and knows nothing of actors.

mod layout;
mod memory;
mod params;
mod state_io;
mod step;
mod storage;
mod stream;

pub use layout::{ParamShard, ShardLayout};
pub use memory::TrainMemory;
pub use params::ShardedParams;
pub use state_io::{load_shard_state, save_shard_state, LAYOUT_FILE};
pub use step::{apply_sharded_gradients, shard_optimizer};
pub use storage::held_bytes;
pub use stream::{LayerStream, StreamedGrads};
