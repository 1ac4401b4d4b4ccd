//! Length-prefixed frames on a byte stream, and messages cut into frames.
//!
//! A frame is a 5-byte header — the payload length (`u32`, little-endian) and a flag byte
//! (`1` = the message's last frame, `0` = more follow) — then the payload. A message bigger
//! than the frame cap travels as several frames, each at most the cap. The reader refuses a
//! header announcing more than the cap before allocating anything, and a message whose
//! frames add up past the message cap, so what a peer can make a node allocate is what it
//! sent plus at most one frame. Not here: what the bytes mean (`wire.rs`).

use super::error::FrameError;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes of a frame header.
pub const HEADER_BYTES: usize = 5;

/// The caps a reader enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest frame payload, bytes.
    pub max_frame: usize,
    /// Largest message (all its frames), bytes.
    pub max_message: usize,
}

impl Limits {
    /// Frames of at most `max_frame` bytes, messages of at most 64 full frames (1 GiB at
    /// the default 16 MiB frame).
    pub fn with_frame(max_frame: usize) -> Self {
        Self {
            max_frame,
            max_message: max_frame.saturating_mul(64),
        }
    }
}

/// Writes `message` as frames of at most `max_frame` bytes (an empty message is one empty
/// frame) and flushes. Returns the bytes written, headers included.
pub async fn write_message<W: AsyncWrite + Unpin>(
    w: &mut W,
    message: &[u8],
    max_frame: usize,
) -> Result<u64, FrameError> {
    let mut chunks: Vec<&[u8]> = message.chunks(max_frame.max(1)).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    let mut written = 0u64;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let mut header = [0u8; HEADER_BYTES];
        header[..4].copy_from_slice(&(chunk.len() as u32).to_le_bytes());
        header[4] = u8::from(i == last);
        w.write_all(&header).await?;
        w.write_all(chunk).await?;
        written += (HEADER_BYTES + chunk.len()) as u64;
    }
    w.flush().await?;
    Ok(written)
}

/// Reads one whole message, or `Ok(None)` when the stream ends cleanly before a new one.
pub async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: Limits,
) -> Result<Option<Vec<u8>>, FrameError> {
    let mut message = Vec::new();
    loop {
        let mut header = [0u8; HEADER_BYTES];
        match r.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && message.is_empty() => {
                return Ok(None)
            }
            Err(e) => return Err(e.into()),
        }
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len > limits.max_frame {
            return Err(FrameError::FrameTooLarge {
                len,
                max: limits.max_frame,
            });
        }
        if header[4] > 1 {
            return Err(FrameError::BadFlag(header[4]));
        }
        if message.len() + len > limits.max_message {
            return Err(FrameError::MessageTooLarge {
                max: limits.max_message,
            });
        }
        let start = message.len();
        message.resize(start + len, 0);
        r.read_exact(&mut message[start..]).await?;
        if header[4] == 1 {
            return Ok(Some(message));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_message_bigger_than_a_frame_travels_in_chunks() {
        let msg: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let mut buf = Vec::new();
        let n = write_message(&mut buf, &msg, 64).await.unwrap();
        assert_eq!(n as usize, buf.len());
        assert_eq!(
            buf.len(),
            msg.len() + HEADER_BYTES * 16,
            "ceil(1000/64) frames"
        );
        let back = read_message(&mut buf.as_slice(), Limits::with_frame(64)).await;
        assert_eq!(back.unwrap().unwrap(), msg);
    }

    #[tokio::test]
    async fn an_oversized_header_is_refused_before_allocating() {
        let mut buf = Vec::new();
        buf.extend_from_slice(&u32::MAX.to_le_bytes());
        buf.push(1);
        let e = read_message(&mut buf.as_slice(), Limits::with_frame(1 << 20)).await;
        assert!(
            matches!(e, Err(FrameError::FrameTooLarge { len, .. }) if len == u32::MAX as usize),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn too_many_frames_and_bad_flags_are_refused() {
        let mut buf = Vec::new();
        write_message(&mut buf, &[7u8; 100], 10).await.unwrap();
        let limits = Limits {
            max_frame: 10,
            max_message: 50,
        };
        let e = read_message(&mut buf.as_slice(), limits).await;
        assert!(
            matches!(e, Err(FrameError::MessageTooLarge { .. })),
            "{e:?}"
        );
        let bad = [1u8, 0, 0, 0, 9, 0];
        let e = read_message(&mut bad.as_slice(), Limits::with_frame(10)).await;
        assert!(matches!(e, Err(FrameError::BadFlag(9))), "{e:?}");
        let clean_end: &[u8] = &[];
        let e = read_message(&mut &clean_end[..], Limits::with_frame(10)).await;
        assert!(matches!(e, Ok(None)), "{e:?}");
    }
}
