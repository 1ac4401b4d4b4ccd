//! Where each parameter's elements live in a sharded group: a flat shard per parameter.
//!
//! Every parameter is flattened (row-major) and cut into `world` equal contiguous chunks of
//! `ceil(numel / world)` elements; rank `r` owns chunk `r`. The last chunks are padded with
//! zeros past `numel`, so every rank's shard of a parameter has the same length (what
//! reduce-scatter and all-gather need) and the optimizer's per-parameter groups (weight
//! decay) stay exact. Parameters are grouped into units (one per decoder layer, one for the
//! rest) that are gathered and reduce-scattered together. This file holds no tensors.

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// One parameter's place in the layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ParamShard {
    /// HF tensor name.
    pub name: String,
    /// The full parameter's shape.
    pub shape: Vec<usize>,
    /// Elements of the full parameter.
    pub numel: usize,
    /// Elements of every rank's shard (`ceil(numel / world)`), padding included.
    pub shard_len: usize,
}

impl ParamShard {
    /// The elements of the flattened parameter that rank `rank` owns (may be empty; its
    /// shard is then all padding).
    pub fn owned(&self, rank: usize) -> Range<usize> {
        let start = (rank * self.shard_len).min(self.numel);
        start..((rank + 1) * self.shard_len).min(self.numel)
    }

    /// Length of the flat buffer that holds every rank's shard (`world · shard_len`).
    pub fn padded_len(&self, world: usize) -> usize {
        self.shard_len * world
    }
}

/// The flat-shard layout of one rank of a group of `world`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShardLayout {
    /// Ranks in the group.
    pub world: usize,
    /// This rank.
    pub rank: usize,
    /// Every parameter, in the optimizer's order (sorted by name).
    pub params: Vec<ParamShard>,
}

impl ShardLayout {
    /// The layout of `params` (`(name, shape)`, in order) for `rank` of `world` (≥ 1).
    pub fn new(params: &[(String, Vec<usize>)], rank: usize, world: usize) -> Self {
        let world = world.max(1);
        let params = params
            .iter()
            .map(|(name, shape)| {
                let numel: usize = shape.iter().product();
                ParamShard {
                    name: name.clone(),
                    shape: shape.clone(),
                    numel,
                    shard_len: numel.div_ceil(world),
                }
            })
            .collect();
        Self {
            world,
            rank,
            params,
        }
    }

    /// Indices of `params` grouped into units gathered together: one unit per decoder
    /// layer (`…layers.{i}.…`), in layer order, then one for every other parameter.
    #[cfg(test)]
    pub fn units(&self) -> Vec<Vec<usize>> {
        self.units_by_layer().into_iter().map(|(_, u)| u).collect()
    }

    /// [`Self::units`] with the decoder layer each belongs to (`None`: the unit of every
    /// parameter outside the layers: embedding, final norm, head).
    pub fn units_by_layer(&self) -> Vec<(Option<usize>, Vec<usize>)> {
        let mut layers: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut rest = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            match layer_index(&p.name) {
                Some(l) => match layers.iter_mut().find(|(k, _)| *k == l) {
                    Some((_, v)) => v.push(i),
                    None => layers.push((l, vec![i])),
                },
                None => rest.push(i),
            }
        }
        layers.sort_by_key(|(l, _)| *l);
        let mut units: Vec<(Option<usize>, Vec<usize>)> =
            layers.into_iter().map(|(l, v)| (Some(l), v)).collect();
        if !rest.is_empty() {
            units.push((None, rest));
        }
        units
    }

    /// Elements of this rank's shards (padding included).
    #[cfg(test)]
    pub fn shard_elems(&self) -> usize {
        self.params.iter().map(|p| p.shard_len).sum()
    }

    /// Elements of the full parameters.
    #[cfg(test)]
    pub fn full_elems(&self) -> usize {
        self.params.iter().map(|p| p.numel).sum()
    }

    /// How `other` (e.g. a layout read from a checkpoint) differs from this one, if it does:
    /// the group size, the rank, or a parameter's name or shape.
    pub fn difference(&self, other: &ShardLayout) -> Option<String> {
        if (self.world, self.rank) != (other.world, other.rank) {
            return Some(format!(
                "rank {} of {} ranks, expected rank {} of {}",
                other.rank, other.world, self.rank, self.world
            ));
        }
        if self.params.len() != other.params.len() {
            return Some(format!(
                "{} parameters, expected {}",
                other.params.len(),
                self.params.len()
            ));
        }
        self.params
            .iter()
            .zip(&other.params)
            .find(|(a, b)| a != b)
            .map(|(a, b)| {
                format!(
                    "parameter `{}` {:?}, expected `{}` {:?}",
                    b.name, b.shape, a.name, a.shape
                )
            })
    }
}

/// `i` of a name containing `layers.{i}.`.
fn layer_index(name: &str) -> Option<usize> {
    let at = name.find("layers.")? + "layers.".len();
    let digits: String = name[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(world: usize, rank: usize) -> ShardLayout {
        let p = |n: &str, s: &[usize]| (n.to_string(), s.to_vec());
        let params = [
            p("lm_head.weight", &[5, 2]),
            p("model.layers.0.mlp.up_proj.weight", &[3, 3]),
            p("model.layers.1.input_layernorm.weight", &[3]),
            p("model.layers.10.input_layernorm.weight", &[3]),
            p("model.layers.0.input_layernorm.weight", &[3]),
        ];
        ShardLayout::new(&params, rank, world)
    }

    #[test]
    fn shards_cover_each_parameter_once_with_padding_at_the_end() {
        let l = layout(4, 0);
        let p = &l.params[0];
        assert_eq!((p.numel, p.shard_len, p.padded_len(4)), (10, 3, 12));
        let owned: Vec<_> = (0..4).map(|r| p.owned(r)).collect();
        assert_eq!(owned, vec![0..3, 3..6, 6..9, 9..10]);
        // Three elements over four ranks: the last rank owns nothing.
        let q = &l.params[2];
        assert_eq!(
            (0..4).map(|r| q.owned(r)).collect::<Vec<_>>(),
            vec![0..1, 1..2, 2..3, 3..3]
        );
        assert_eq!(l.full_elems(), 10 + 9 + 9);
        assert_eq!(l.shard_elems(), 3 + 3 + 1 + 1 + 1);
    }

    #[test]
    fn units_are_layers_in_order_then_the_rest() {
        assert_eq!(
            layout(2, 0).units(),
            vec![vec![1, 4], vec![2], vec![3], vec![0]]
        );
    }

    #[test]
    fn differences_name_what_changed() {
        assert_eq!(layout(2, 1).difference(&layout(2, 1)), None);
        let d = layout(2, 1).difference(&layout(4, 1)).unwrap();
        assert!(d.contains("rank 1 of 4 ranks"), "{d}");
        let mut other = layout(2, 1);
        other.params[1].shape = vec![9];
        let d = layout(2, 1).difference(&other).unwrap();
        assert!(d.contains("model.layers.0.mlp.up_proj.weight"), "{d}");
    }
}
