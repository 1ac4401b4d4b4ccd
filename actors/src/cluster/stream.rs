//! The byte stream under a node session, on both ends: plain TCP on loopback or TLS, split
//! into halves that `ractor_cluster` drives as an external transport. The read half is
//! guarded: a peer that sends no byte for [`Guard::idle`] is cut (a live session pings every
//! few seconds, so only a stalled or vanished peer goes quiet that long), and frames (the
//! session's u64 length prefix and payload) are counted against a per-connection rate, above
//! which reading pauses until the budget refills. Until the session is authenticated, a frame
//! may announce at most [`UNAUTHENTICATED_FRAME`] bytes (the handshake's messages are small),
//! so a peer that does not know the cookie cannot make a worker buffer a big message, and a
//! session not authenticated within [`Guard::handshake`] ends (a read stalled in a frame
//! that will never be finished included). Bytes
//! in and out are counted for the run's traffic figures (`traffic.rs`) when the guard says so.

use super::traffic;
use ractor_cluster::{BoxRead, BoxWrite, ClusterBidiStream};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The largest frame a peer may announce before its session is authenticated, bytes.
pub const UNAUTHENTICATED_FRAME: u64 = 1 << 20;

/// The limits on one connection's read half.
#[derive(Debug, Clone, Copy)]
pub struct Guard {
    /// How long the peer may send nothing.
    pub idle: Duration,
    /// Frames per second the peer may send on average.
    pub frames_per_s: f64,
    /// Frames the peer may send in a burst.
    pub burst: f64,
    /// How long the session may take to be authenticated (TLS and the cookie's challenge).
    pub handshake: Duration,
    /// Whether the bytes count toward this process's traffic figures.
    pub count_traffic: bool,
}

impl Guard {
    /// The limits a worker and a controller apply: one minute of silence, 2000 frames a
    /// second with bursts of 4000, ten seconds to authenticate.
    pub const DEFAULT: Guard = Guard {
        idle: Duration::from_secs(60),
        frames_per_s: 2000.0,
        burst: 4000.0,
        handshake: Duration::from_secs(10),
        count_traffic: false,
    };
}

/// A stream split for a node session, labelled so the session can be found by it.
pub(crate) struct GuardedStream<S> {
    stream: S,
    label: String,
    guard: Guard,
    authenticated: Arc<AtomicBool>,
}

impl<S> GuardedStream<S> {
    /// Guards `stream`; `authenticated` is set once its session is.
    pub(crate) fn new(
        stream: S,
        label: String,
        guard: Guard,
        authenticated: Arc<AtomicBool>,
    ) -> Self {
        Self {
            stream,
            label,
            guard,
            authenticated,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Send + 'static> ClusterBidiStream for GuardedStream<S> {
    fn split(self: Box<Self>) -> (BoxRead, BoxWrite) {
        let (rd, wr) = tokio::io::split(self.stream);
        let read = GuardedRead::new(rd, self.guard, self.authenticated);
        let write = CountedWrite {
            inner: wr,
            count: self.guard.count_traffic,
        };
        (Box::new(read), Box::new(write))
    }

    fn peer_label(&self) -> Option<String> {
        Some(self.label.clone())
    }
}

/// Where the frame parser is: inside a length prefix (bytes of it seen) or a payload
/// (bytes left).
#[derive(Debug, Clone, Copy)]
enum FrameCursor {
    Prefix { seen: usize, len: [u8; 8] },
    Payload { left: u64 },
}

/// Counts whole frames in the bytes as they pass, and keeps the largest length announced.
#[derive(Debug)]
struct FrameCounter {
    cursor: FrameCursor,
    largest: u64,
}

impl FrameCounter {
    const AT_PREFIX: FrameCursor = FrameCursor::Prefix {
        seen: 0,
        len: [0; 8],
    };

    fn new() -> Self {
        Self {
            cursor: Self::AT_PREFIX,
            largest: 0,
        }
    }

    /// The largest frame length announced so far.
    fn largest(&self) -> u64 {
        self.largest
    }

    /// Feeds `bytes`; returns how many frames began in them.
    fn feed(&mut self, mut bytes: &[u8]) -> u64 {
        let mut began = 0;
        while !bytes.is_empty() {
            match &mut self.cursor {
                FrameCursor::Prefix { seen, len } => {
                    let take = (8 - *seen).min(bytes.len());
                    len[*seen..*seen + take].copy_from_slice(&bytes[..take]);
                    *seen += take;
                    bytes = &bytes[take..];
                    if *seen == 8 {
                        began += 1;
                        let left = u64::from_be_bytes(*len);
                        self.largest = self.largest.max(left);
                        self.cursor = FrameCursor::Payload { left };
                    }
                }
                FrameCursor::Payload { left } => {
                    let take = (*left).min(bytes.len() as u64);
                    *left -= take;
                    bytes = &bytes[take as usize..];
                }
            }
            if matches!(self.cursor, FrameCursor::Payload { left: 0 }) {
                self.cursor = Self::AT_PREFIX;
            }
        }
        began
    }
}

/// A read half with an idle cut, a frame rate and the cap before authentication.
struct GuardedRead<R> {
    inner: R,
    guard: Guard,
    authenticated: Arc<AtomicBool>,
    idle: Pin<Box<Sleep>>,
    handshake: Pin<Box<Sleep>>,
    pause: Option<Pin<Box<Sleep>>>,
    frames: FrameCounter,
    budget: f64,
    refilled: Instant,
}

impl<R> GuardedRead<R> {
    fn new(inner: R, guard: Guard, authenticated: Arc<AtomicBool>) -> Self {
        Self {
            inner,
            guard,
            authenticated,
            idle: Box::pin(tokio::time::sleep(guard.idle)),
            handshake: Box::pin(tokio::time::sleep(guard.handshake)),
            pause: None,
            frames: FrameCounter::new(),
            budget: guard.burst,
            refilled: Instant::now(),
        }
    }

    /// Takes `began` frames from the budget; when it runs dry, reading pauses until it is
    /// back above zero.
    fn spend(&mut self, began: u64) {
        let now = Instant::now();
        let earned = now.duration_since(self.refilled).as_secs_f64() * self.guard.frames_per_s;
        self.budget = (self.budget + earned).min(self.guard.burst) - began as f64;
        self.refilled = now;
        if self.budget < 0.0 {
            let wait = Duration::from_secs_f64(-self.budget / self.guard.frames_per_s);
            self.pause = Some(Box::pin(tokio::time::sleep(wait)));
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for GuardedRead<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(pause) = &mut this.pause {
            ready!(pause.as_mut().poll(cx));
            this.pause = None;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let fresh = &buf.filled()[before..];
                if !fresh.is_empty() {
                    let began = this.frames.feed(fresh);
                    let largest = this.frames.largest();
                    if largest > UNAUTHENTICATED_FRAME
                        && !this.authenticated.load(Ordering::Acquire)
                    {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!(
                                "a frame of {largest} bytes announced before authentication \
                                 (at most {UNAUTHENTICATED_FRAME})"
                            ),
                        )));
                    }
                    if this.guard.count_traffic {
                        traffic::received(fresh.len() as u64);
                    }
                    let deadline = Instant::now() + this.guard.idle;
                    this.idle.as_mut().reset(deadline);
                    this.spend(began);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                if this.idle.as_mut().poll(cx).is_ready() {
                    let idle = this.guard.idle.as_secs_f64();
                    let why = format!("no byte from the peer for {idle:.0} s");
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)));
                }
                if !this.authenticated.load(Ordering::Acquire)
                    && this.handshake.as_mut().poll(cx).is_ready()
                {
                    let wait = this.guard.handshake.as_secs_f64();
                    let why = format!("the session was not authenticated within {wait:.0} s");
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)));
                }
                Poll::Pending
            }
            other => other,
        }
    }
}

/// A write half that counts what it sends.
struct CountedWrite<W> {
    inner: W,
    count: bool,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CountedWrite<W> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        if this.count {
            traffic::sent(n as u64);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u64).to_be_bytes().to_vec();
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frames_are_counted_however_the_bytes_are_cut() {
        let mut bytes = frame(b"hello");
        bytes.extend(frame(b""));
        bytes.extend(frame(&[7; 300]));
        for cut in [1, 3, 8, 13, 64, bytes.len()] {
            let mut c = FrameCounter::new();
            let began: u64 = bytes.chunks(cut).map(|piece| c.feed(piece)).sum();
            assert_eq!(began, 3, "cut into pieces of {cut}");
            assert!(matches!(c.cursor, FrameCursor::Prefix { seen: 0, .. }));
            assert_eq!(c.largest(), 300);
        }
    }

    #[tokio::test]
    async fn a_session_not_authenticated_in_time_ends_the_read() {
        use tokio::io::AsyncReadExt;
        let (_keep, quiet) = tokio::io::duplex(64);
        let guard = Guard {
            handshake: Duration::from_millis(50),
            ..Guard::DEFAULT
        };
        let mut rd = GuardedRead::new(quiet, guard, Arc::default());
        let mut buf = [0u8; 8];
        let err = rd.read(&mut buf).await.unwrap_err();
        assert!(err.to_string().contains("not authenticated"), "{err}");
    }

    #[tokio::test]
    async fn a_big_frame_before_authentication_ends_the_read() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        for (authenticated, refused) in [(false, true), (true, false)] {
            let (mut tx, rx) = tokio::io::duplex(64);
            let flag = Arc::new(AtomicBool::new(authenticated));
            let mut rd = GuardedRead::new(rx, Guard::DEFAULT, flag);
            tx.write_all(&(UNAUTHENTICATED_FRAME + 1).to_be_bytes())
                .await
                .unwrap();
            let mut buf = [0u8; 8];
            let read = rd.read(&mut buf).await;
            assert_eq!(read.is_err(), refused, "{read:?}");
        }
    }

    #[tokio::test]
    async fn a_silent_peer_is_cut_after_the_idle_limit() {
        use tokio::io::AsyncReadExt;
        let (_keep, quiet) = tokio::io::duplex(64);
        let guard = Guard {
            idle: Duration::from_millis(50),
            ..Guard::DEFAULT
        };
        let mut rd = GuardedRead::new(quiet, guard, Arc::new(AtomicBool::new(true)));
        let mut buf = [0u8; 8];
        let err = rd.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_flood_of_frames_is_slowed_to_the_rate() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let guard = Guard {
            frames_per_s: 100.0,
            burst: 10.0,
            ..Guard::DEFAULT
        };
        let flood: Vec<u8> = (0..30).flat_map(|_| frame(b"x")).collect();
        tx.write_all(&flood).await.unwrap();
        drop(tx);
        let mut rd = GuardedRead::new(rx, guard, Arc::default());
        let start = std::time::Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 9];
        loop {
            let n = rd.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        // 30 frames with a burst of 10 at 100/s: at least 0.2 s of pauses.
        assert!(
            start.elapsed() >= Duration::from_millis(150),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(got.len(), flood.len());
    }
}
