//! [`NcclUniqueId`]: the 128 bytes that name one NCCL communicator. The controller (the owner
//! of rank 0) creates it and hands it to every rank of the group; each rank passes it to
//! `ncclCommInitRank`. This file is the id as data (serde, MessagePack-safe) and is compiled
//! in every build, so the cluster's messages are the same with and without the `cuda`
//! feature; creating an id (NCCL's `ncclGetUniqueId`) is `nccl.rs`'s.

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;

/// Bytes in an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// One NCCL communicator's unique id: opaque bytes, equal on every rank of the group.
///
/// Serialized as a byte string of exactly [`NCCL_UNIQUE_ID_BYTES`] bytes; any other length is
/// a deserialization error.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NcclUniqueId([u8; NCCL_UNIQUE_ID_BYTES]);

impl NcclUniqueId {
    /// The id with these bytes (as NCCL wrote them).
    pub fn from_bytes(bytes: [u8; NCCL_UNIQUE_ID_BYTES]) -> Self {
        Self(bytes)
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8; NCCL_UNIQUE_ID_BYTES] {
        &self.0
    }
}

impl fmt::Debug for NcclUniqueId {
    /// The first 8 bytes in hex: enough to tell ids apart in a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NcclUniqueId(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "…)")
    }
}

impl Serialize for NcclUniqueId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for NcclUniqueId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(IdVisitor)
    }
}

struct IdVisitor;

impl IdVisitor {
    fn exact<E: de::Error>(bytes: &[u8]) -> Result<NcclUniqueId, E> {
        let arr: [u8; NCCL_UNIQUE_ID_BYTES] = bytes
            .try_into()
            .map_err(|_| E::invalid_length(bytes.len(), &IdVisitor))?;
        Ok(NcclUniqueId(arr))
    }
}

impl<'de> Visitor<'de> for IdVisitor {
    type Value = NcclUniqueId;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an NCCL unique id of {NCCL_UNIQUE_ID_BYTES} bytes")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<NcclUniqueId, E> {
        Self::exact(v)
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<NcclUniqueId, E> {
        Self::exact(&v)
    }

    /// Formats without a byte string (JSON) write a sequence of numbers.
    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<NcclUniqueId, A::Error> {
        let mut bytes = Vec::with_capacity(NCCL_UNIQUE_ID_BYTES);
        while let Some(b) = seq.next_element::<u8>()? {
            bytes.push(b);
        }
        Self::exact(&bytes)
    }
}
