//! Saving and loading a sharded optimizer: each rank writes its AdamW state over its shards
//! into `<dir>/shard_<rank>/` (the usual `optimizer.safetensors` and `optimizer.json`, with
//! `[shard_len]` moments) next to its [`ShardLayout`] in [`LAYOUT_FILE`]. Loading checks the
//! layout (group size, rank, every parameter's name and shape) before touching the optimizer,
//! so a state saved with another group size fails with a message instead of loading wrong
//! moments. Resharding a saved state to another group size is not done here.

use super::layout::ShardLayout;
use crate::optim::state_io::STATE_JSON_FILE;
use crate::optim::AdamW;
use crate::{Result, RlhfError};
use std::path::{Path, PathBuf};

/// File name of a shard's layout inside its `shard_<rank>/` folder.
pub(crate) const LAYOUT_FILE: &str = "shard_layout.json";

fn shard_dir(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("shard_{rank}"))
}

/// Writes `opt` (over the shards of `layout`) and the layout into `<dir>/shard_<rank>/`.
pub(crate) fn save_shard_state(opt: &AdamW, layout: &ShardLayout, dir: &Path) -> Result<()> {
    let at = shard_dir(dir, layout.rank);
    opt.save_state(&at)?;
    let path = at.join(LAYOUT_FILE);
    let text = serde_json::to_string_pretty(layout).map_err(|source| RlhfError::Json {
        path: path.clone(),
        source,
    })?;
    std::fs::write(&path, text).map_err(|source| RlhfError::Io { path, source })
}

/// Restores what [`save_shard_state`] wrote for this rank into `opt`, after checking the
/// saved layout equals `layout` ([`RlhfError::StateMismatch`] names the file otherwise).
pub(crate) fn load_shard_state(opt: &mut AdamW, layout: &ShardLayout, dir: &Path) -> Result<()> {
    let at = shard_dir(dir, layout.rank);
    let path = at.join(LAYOUT_FILE);
    if !path.exists() && dir.join(STATE_JSON_FILE).exists() {
        return Err(RlhfError::StateMismatch {
            path: dir.to_path_buf(),
            reason: format!(
                "holds a replicated optimizer state, but this trainer is sharded over {} ranks \
                 (resharding a saved state is not supported)",
                layout.world
            ),
        });
    }
    let text = std::fs::read_to_string(&path).map_err(|source| RlhfError::Io {
        path: path.clone(),
        source,
    })?;
    let saved: ShardLayout = serde_json::from_str(&text).map_err(|source| RlhfError::Json {
        path: path.clone(),
        source,
    })?;
    if let Some(d) = layout.difference(&saved) {
        return Err(RlhfError::StateMismatch {
            path,
            reason: format!("the saved shard layout has {d}"),
        });
    }
    opt.load_state(&at)
}
