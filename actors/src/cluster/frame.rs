//! Length-prefixed frames on a byte stream, and messages cut into frames.
//!
//! A frame is a 5-byte header — the payload length (`u32`, little-endian) and a flag byte
//! (`1` = the message's last frame, `0` = more follow) — then the payload. A message bigger
//! than the frame cap travels as several frames, each at most the cap. The reader refuses a
//! header announcing more than the cap before allocating anything, and a message whose
//! frames add up past the message cap; a payload's buffer grows with the bytes that arrive
//! (to at most twice them, or [`READ_CHUNK`] more), so what a peer can make a node allocate
//! is about what it sent. With a stall limit, a message that stops arriving midway (no byte for that
//! long) is an error, so a peer cannot hold a half-sent message open; the wait for a
//! message's first byte is not limited. Not here: what the bytes mean (`wire.rs`).
//!
//! The frame cap is `cluster.max_frame_mb` (the worker's `--max-frame-mb`; default 16 MiB);
//! a message may hold at most 64 full frames (1 GiB at the default cap). The worker's stall
//! limit is 60 s.

use super::error::FrameError;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Bytes of a frame header.
pub const HEADER_BYTES: usize = 5;
/// Most bytes a payload's buffer is grown by ahead of what has arrived.
pub(crate) const READ_CHUNK: usize = 1 << 20;

/// The caps a reader enforces.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest frame payload, bytes.
    pub max_frame: usize,
    /// Largest message (all its frames), bytes.
    pub max_message: usize,
    /// Longest wait for the next byte once a message has begun; `None` = no limit.
    pub stall: Option<Duration>,
}

impl Limits {
    /// Frames of at most `max_frame` bytes, messages of at most 64 full frames (1 GiB at
    /// the default 16 MiB frame).
    pub fn with_frame(max_frame: usize) -> Self {
        Self {
            max_frame,
            max_message: max_frame.saturating_mul(64),
            stall: None,
        }
    }

    /// These limits with a stall limit of `stall`.
    pub fn stalling_after(self, stall: Duration) -> Self {
        Self {
            stall: Some(stall),
            ..self
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
    let mut first = true;
    loop {
        let mut header = [0u8; HEADER_BYTES];
        let read = within(limits.stall.filter(|_| !first), r.read_exact(&mut header)).await?;
        match read {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && first => return Ok(None),
            Err(e) => return Err(e.into()),
        }
        first = false;
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
        read_payload(r, &mut message, len, limits.stall).await?;
        if header[4] == 1 {
            return Ok(Some(message));
        }
    }
}

/// Appends `len` bytes of `r` to `message`, growing it only when it is full, by at least
/// the rest of the payload up to [`READ_CHUNK`] (so at most twice what has arrived, or
/// [`READ_CHUNK`] more).
async fn read_payload<R: AsyncRead + Unpin>(
    r: &mut R,
    message: &mut Vec<u8>,
    len: usize,
    stall: Option<Duration>,
) -> Result<(), FrameError> {
    let end = message.len() + len;
    while message.len() < end {
        let want = (end - message.len()).min(READ_CHUNK);
        if message.len() == message.capacity() {
            message.reserve(want);
        }
        let mut part = (&mut *r).take(want as u64);
        if within(stall, part.read_buf(message)).await?? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
    }
    Ok(())
}

/// `read`, failing with [`FrameError::Stalled`] when `stall` is set and passes first.
async fn within<T>(
    stall: Option<Duration>,
    read: impl std::future::Future<Output = T>,
) -> Result<T, FrameError> {
    match stall {
        None => Ok(read.await),
        Some(limit) => tokio::time::timeout(limit, read)
            .await
            .map_err(|_| FrameError::Stalled {
                secs: limit.as_secs_f64(),
            }),
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
            stall: None,
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

    #[tokio::test]
    async fn a_message_that_stops_midway_is_cut_after_the_stall_limit() {
        let (mut peer, mut node) = tokio::io::duplex(1 << 16);
        let mut partial = Vec::new();
        partial.extend_from_slice(&(16u32 << 20).to_le_bytes());
        partial.push(1);
        partial.extend_from_slice(&[7u8; 10]);
        peer.write_all(&partial).await.unwrap();
        let limits = Limits::with_frame(16 << 20).stalling_after(Duration::from_millis(200));
        let read = tokio::time::timeout(Duration::from_secs(60), read_message(&mut node, limits));
        let e = read.await.expect("the stall limit never fired");
        assert!(matches!(e, Err(FrameError::Stalled { .. })), "{e:?}");
        drop(peer);
    }

    #[tokio::test]
    async fn a_payload_grows_with_what_arrives_not_with_what_is_announced() {
        let (mut peer, mut node) = tokio::io::duplex(1 << 16);
        let mut partial = Vec::new();
        partial.extend_from_slice(&(64u32 << 20).to_le_bytes());
        partial.push(1);
        partial.extend_from_slice(&[7u8; 10]);
        peer.write_all(&partial).await.unwrap();
        drop(peer);
        let mut message = Vec::new();
        let mut header = [0u8; HEADER_BYTES];
        node.read_exact(&mut header).await.unwrap();
        let e = read_payload(&mut node, &mut message, 64 << 20, None).await;
        assert!(e.is_err(), "the stream ended inside the payload");
        assert_eq!(message, [7u8; 10]);
        assert!(message.capacity() <= READ_CHUNK, "{}", message.capacity());
    }
}
