//! TFRecord framing: each record is its length (u64, little-endian), the masked CRC-32C
//! of those 8 bytes, the data, and the masked CRC-32C of the data.

/// Why bytes are not a sequence of whole, intact TFRecords.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The bytes end inside a record.
    #[error(
        "record at byte {offset}: the file ends inside it (a record is 8 + 4 + length + 4 bytes)"
    )]
    Truncated {
        /// Where the record starts.
        offset: usize,
    },
    /// A checksum does not match.
    #[error("record at byte {offset}: the {what} checksum does not match (masked CRC-32C)")]
    Checksum {
        /// Where the record starts.
        offset: usize,
        /// `"length"` or `"data"`.
        what: &'static str,
    },
}

/// TFRecord's checksum: CRC-32C rotated right by 15 bits plus a constant.
fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `data` framed as one record.
pub(super) fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// The records of a file's bytes, every checksum verified.
pub fn read_records(bytes: &[u8]) -> Result<Vec<&[u8]>, RecordError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let truncated = RecordError::Truncated { offset: at };
        if bytes.len() - at < 12 {
            return Err(truncated);
        }
        let len_bytes = &bytes[at..at + 8];
        if read_u32(bytes, at + 8) != masked_crc(len_bytes) {
            return Err(RecordError::Checksum {
                offset: at,
                what: "length",
            });
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        let start = at + 12;
        let end = usize::try_from(len)
            .ok()
            .and_then(|n| start.checked_add(n))
            .filter(|&end| end.checked_add(4).is_some_and(|e| e <= bytes.len()))
            .ok_or(truncated)?;
        if read_u32(bytes, end) != masked_crc(&bytes[start..end]) {
            return Err(RecordError::Checksum {
                offset: at,
                what: "data",
            });
        }
        out.push(&bytes[start..end]);
        at = end + 4;
    }
    Ok(out)
}
