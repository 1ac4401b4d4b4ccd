//! FSDP / ZeRO-3-style sharding of one trainer over the replicas of a role's device group.
//!
//! Each replica keeps 1/N of every parameter as an f32 master shard ([`ShardLayout`]: a flat
//! shard per parameter, padded to equal lengths), 1/N of the gradients (reduce-scattered) and
//! 1/N of AdamW's moments (an [`AdamW`](crate::optim::AdamW) over the shards). The model's
//! full `Var`s are filled by all-gather just before a forward (unit by unit, one layer at a
//! time) and freed right after the step ([`ShardedParams`]), so between steps a replica holds
//! only its shards. The trainers use this through their `shard` methods; this module spawns
//! nothing and knows nothing of actors.

mod layout;
mod memory;
mod params;
mod state_io;
mod step;
mod storage;

pub use layout::{ParamShard, ShardLayout};
pub use memory::TrainMemory;
pub use params::ShardedParams;
pub use state_io::{load_shard_state, save_shard_state, LAYOUT_FILE};
pub use step::{apply_sharded_gradients, shard_optimizer};
pub use storage::held_bytes;
