//! The trainer's weights on their way to a rollout engine in another role (`placement.engine`):
//! packed into buckets of at most `cluster.refit_bucket_mb`, each bucket one safetensors
//! buffer (`F32`, little-endian) whose header metadata lists its pieces and their checksums.
//! A tensor bigger than a bucket is cut into chunks (1-D runs of its row-major values) over
//! several buckets. [`Assembly`] takes the buckets as they arrive and checks every piece's
//! checksum at once, so a damaged bucket is refused with a [`BucketError`] naming the tensor
//! and the bucket. Checksums are the engine's own ([`checksum_f32`]), so the engine's
//! verification in `Engine::refit` compares the same numbers. Not here: how buckets travel
//! (`cluster/`) and how an engine applies them (`roles/rollout_engine.rs`).

use oxalign_models::engine::{checksum_f32, Probe};
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The metadata key of a bucket's piece list (JSON).
const PIECES_KEY: &str = "oxalign.refit.pieces";

/// Header bytes a bucket reserves besides its pieces' entries.
const BASE_OVERHEAD: usize = 256;

/// One tensor of a model's weights in host memory: row-major f32 values of `shape`.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// HF name (`model.layers.0.self_attn.q_proj.weight`).
    pub name: String,
    /// Dimensions.
    pub shape: Vec<usize>,
    /// The values, `shape.iter().product()` of them.
    pub values: Vec<f32>,
}

/// One bucket of a refit: a safetensors buffer of whole tensors or chunks of one.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct WeightBucket {
    /// Index of this bucket, from 0.
    pub index: usize,
    /// How many buckets the update has.
    pub count: usize,
    /// The safetensors buffer (its bytes travel beside a call's MessagePack part).
    pub bytes: Vec<u8>,
}

/// A trainer's weights for an engine role: update `version` as buckets, and the probe
/// (the trainer's log-probs of a fixed sequence) the engine must reproduce after taking them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightExport {
    /// The policy version the weights are.
    pub version: u64,
    /// The buckets, in order.
    pub buckets: Vec<WeightBucket>,
    /// The verification probe.
    pub probe: Probe,
}

impl WeightExport {
    /// Bytes of all buckets (what crosses to the engine role).
    pub fn bytes(&self) -> u64 {
        self.buckets.iter().map(|b| b.bytes.len() as u64).sum()
    }
}

/// One entry of a bucket: a whole tensor, or values `offset..offset + len` of one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Piece {
    /// The safetensors entry holding the values.
    entry: String,
    /// The tensor it belongs to.
    tensor: String,
    /// The whole tensor's shape.
    shape: Vec<usize>,
    /// First value (row-major index) of this piece.
    offset: usize,
    /// [`checksum_f32`] of this piece's values.
    checksum: u64,
    /// [`checksum_f32`] of the whole tensor (the trainer's).
    tensor_checksum: u64,
}

/// Why buckets could not be packed or were refused on arrival.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BucketError {
    /// A piece's values do not match the checksum the sender computed.
    #[error(
        "tensor {tensor:?} in refit bucket {bucket} of {count} fails its checksum (sent \
         {expected:#018x}, received {got:#018x}); the engine keeps its previous weights"
    )]
    Checksum {
        /// The tensor.
        tensor: String,
        /// The bucket (from 0).
        bucket: usize,
        /// Buckets in the update.
        count: usize,
        /// The sender's checksum.
        expected: u64,
        /// The checksum of what arrived.
        got: u64,
    },
    /// A bucket is not what a sender writes (header, piece list, dtype, lengths).
    #[error("refit bucket {bucket}: {reason}")]
    Malformed {
        /// The bucket (from 0).
        bucket: usize,
        /// What is wrong.
        reason: String,
    },
    /// The update is incomplete when applied (a bucket or part of a tensor missing).
    #[error("refit of version {version} is incomplete: {what}")]
    Incomplete {
        /// The update's version.
        version: u64,
        /// What is missing.
        what: String,
    },
    /// The bucket limit leaves no room for a tensor's header and one value.
    #[error(
        "a refit bucket of {limit} bytes cannot hold tensor {tensor:?}'s header and one value"
    )]
    TooSmall {
        /// The limit, bytes.
        limit: usize,
        /// The tensor.
        tensor: String,
    },
    /// Writing a bucket failed (or it came out over the limit).
    #[error("writing refit bucket {bucket}: {reason}")]
    Write {
        /// The bucket (from 0).
        bucket: usize,
        /// Why.
        reason: String,
    },
}

/// Header bytes one piece of `tensor` may take: its safetensors entry and its line in the
/// piece list (escaped JSON inside the metadata).
fn piece_overhead(tensor: &str) -> usize {
    4 * tensor.len() + 320
}

/// Packs `tensors` into buckets of at most `limit` bytes each, whole tensors where they fit,
/// in the order given. Each piece carries its checksum and its tensor's.
pub fn pack(tensors: &[HostTensor], limit: usize) -> Result<Vec<WeightBucket>, BucketError> {
    let mut buckets: Vec<Vec<(Piece, &[f32])>> = Vec::new();
    let (mut current, mut used) = (Vec::new(), BASE_OVERHEAD);
    for t in tensors {
        let tensor_checksum = checksum_f32(&t.values);
        let (n, over) = (t.values.len(), piece_overhead(&t.name));
        let mut offset = 0;
        loop {
            if used + over + 4 > limit && !current.is_empty() {
                buckets.push(std::mem::take(&mut current));
                used = BASE_OVERHEAD;
            }
            if used + over + 4 > limit {
                return Err(BucketError::TooSmall {
                    limit,
                    tensor: t.name.clone(),
                });
            }
            let take = (n - offset).min((limit - used - over) / 4);
            let values = &t.values[offset..offset + take];
            let whole = offset == 0 && take == n;
            let entry = match whole {
                true => t.name.clone(),
                false => format!("{}#{offset}", t.name),
            };
            let piece = Piece {
                entry,
                tensor: t.name.clone(),
                shape: t.shape.clone(),
                offset,
                checksum: checksum_f32(values),
                tensor_checksum,
            };
            current.push((piece, values));
            used += over + 4 * take;
            offset += take;
            if offset >= n {
                break;
            }
            buckets.push(std::mem::take(&mut current));
            used = BASE_OVERHEAD;
        }
    }
    if !current.is_empty() {
        buckets.push(current);
    }
    let count = buckets.len();
    buckets
        .into_iter()
        .enumerate()
        .map(|(index, pieces)| write_bucket(index, count, &pieces, limit))
        .collect()
}

/// One bucket's safetensors buffer.
fn write_bucket(
    index: usize,
    count: usize,
    pieces: &[(Piece, &[f32])],
    limit: usize,
) -> Result<WeightBucket, BucketError> {
    let fail = |reason: String| BucketError::Write {
        bucket: index,
        reason,
    };
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = pieces
        .iter()
        .map(|(p, v)| {
            let shape = match p.entry == p.tensor {
                true => p.shape.clone(),
                false => vec![v.len()],
            };
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (p.entry.clone(), shape, bytes)
        })
        .collect();
    let views = data
        .iter()
        .map(|(n, s, b)| TensorView::new(Dtype::F32, s.clone(), b).map(|v| (n.as_str(), v)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(e.to_string()))?;
    let list: Vec<&Piece> = pieces.iter().map(|(p, _)| p).collect();
    let json = serde_json::to_string(&list).map_err(|e| fail(e.to_string()))?;
    let meta = HashMap::from([(PIECES_KEY.to_string(), json)]);
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| fail(e.to_string()))?;
    if bytes.len() > limit {
        return Err(fail(format!(
            "{} bytes, over the limit of {limit}",
            bytes.len()
        )));
    }
    Ok(WeightBucket {
        index,
        count,
        bytes,
    })
}

/// A tensor being put together from its pieces.
struct Partial {
    shape: Vec<usize>,
    values: Vec<f32>,
    filled: usize,
    tensor_checksum: u64,
    /// The last bucket that brought a piece of it.
    bucket: usize,
}

/// The weights an update brought, checked piece by piece and whole.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrived {
    /// The tensors, by name.
    pub tensors: Vec<HostTensor>,
    /// The sender's checksum of each tensor (for the engine's own verification).
    pub checksums: HashMap<String, u64>,
}

/// The buckets of one update as they arrive.
pub struct Assembly {
    version: u64,
    count: Option<usize>,
    seen: BTreeSet<usize>,
    tensors: BTreeMap<String, Partial>,
}

impl Assembly {
    /// An empty assembly of update `version`.
    pub fn new(version: u64) -> Self {
        Self {
            version,
            count: None,
            seen: BTreeSet::new(),
            tensors: BTreeMap::new(),
        }
    }

    /// The update's version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Takes `bucket`, checking every piece's checksum.
    pub fn add(&mut self, bucket: &WeightBucket) -> Result<(), BucketError> {
        let i = bucket.index;
        let bad = |reason: String| BucketError::Malformed { bucket: i, reason };
        if bucket.index >= bucket.count || *self.count.get_or_insert(bucket.count) != bucket.count {
            return Err(bad(format!(
                "index {} of {} buckets does not fit the update",
                bucket.index, bucket.count
            )));
        }
        if !self.seen.insert(i) {
            return Err(bad("arrived twice".into()));
        }
        let st = SafeTensors::deserialize(&bucket.bytes).map_err(|e| bad(e.to_string()))?;
        let (_, meta) =
            SafeTensors::read_metadata(&bucket.bytes).map_err(|e| bad(e.to_string()))?;
        let json = meta
            .metadata()
            .as_ref()
            .and_then(|m| m.get(PIECES_KEY))
            .ok_or_else(|| bad(format!("no {PIECES_KEY} in its header")))?;
        let pieces: Vec<Piece> = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
        if pieces.len() != st.len() {
            return Err(bad(format!(
                "{} pieces listed, {} tensors held",
                pieces.len(),
                st.len()
            )));
        }
        for p in pieces {
            let view = st
                .tensor(&p.entry)
                .map_err(|_| bad(format!("piece {:?} listed but not held", p.entry)))?;
            if view.dtype() != Dtype::F32 {
                return Err(bad(format!(
                    "{:?} is {:?}, expected F32",
                    p.entry,
                    view.dtype()
                )));
            }
            let values: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let got = checksum_f32(&values);
            if got != p.checksum {
                return Err(BucketError::Checksum {
                    tensor: p.tensor,
                    bucket: i,
                    count: bucket.count,
                    expected: p.checksum,
                    got,
                });
            }
            self.place(i, p, &values)?;
        }
        Ok(())
    }

    /// Copies a checked piece into its tensor.
    fn place(&mut self, bucket: usize, p: Piece, values: &[f32]) -> Result<(), BucketError> {
        let total: usize = p.shape.iter().product();
        let part = self
            .tensors
            .entry(p.tensor.clone())
            .or_insert_with(|| Partial {
                shape: p.shape.clone(),
                values: vec![0.0; total],
                filled: 0,
                tensor_checksum: p.tensor_checksum,
                bucket,
            });
        let end = p.offset + values.len();
        if part.shape != p.shape || part.tensor_checksum != p.tensor_checksum || end > total {
            return Err(BucketError::Malformed {
                bucket,
                reason: format!(
                    "piece {:?} (values {}..{end}) does not fit tensor {:?} {:?}",
                    p.entry, p.offset, p.tensor, part.shape
                ),
            });
        }
        part.values[p.offset..end].copy_from_slice(values);
        part.filled += values.len();
        part.bucket = bucket;
        Ok(())
    }

    /// The whole update, once every bucket and every value arrived; each tensor's checksum
    /// is checked again whole.
    pub fn finish(self) -> Result<Arrived, BucketError> {
        let incomplete = |what: String| BucketError::Incomplete {
            version: self.version,
            what,
        };
        let count = self.count.unwrap_or(0);
        if count == 0 || self.seen.len() != count {
            return Err(incomplete(format!(
                "{} of {count} buckets arrived",
                self.seen.len()
            )));
        }
        let mut out = Arrived {
            tensors: Vec::with_capacity(self.tensors.len()),
            checksums: HashMap::with_capacity(self.tensors.len()),
        };
        for (name, p) in self.tensors {
            if p.filled != p.values.len() {
                let what = format!(
                    "tensor {name:?} has {} of {} values",
                    p.filled,
                    p.values.len()
                );
                return Err(incomplete(what));
            }
            let got = checksum_f32(&p.values);
            if got != p.tensor_checksum {
                return Err(BucketError::Checksum {
                    tensor: name,
                    bucket: p.bucket,
                    count,
                    expected: p.tensor_checksum,
                    got,
                });
            }
            out.checksums.insert(name.clone(), p.tensor_checksum);
            out.tensors.push(HostTensor {
                name,
                shape: p.shape,
                values: p.values,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
#[path = "weight_buckets_tests.rs"]
mod tests;
