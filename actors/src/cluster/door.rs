//! The front door of a listener (the worker's, the dashboard's): it holds at most so many
//! connections at once, in total and per peer address, so a flood of idle connections cannot
//! spend the process's file descriptors; and its accept never fails: an error (out of
//! descriptors above all) is logged, waited out for [`ACCEPT_BACKOFF`] and retried, so the
//! server goes on with the connections it has. A connection past the total waits in the
//! kernel's backlog; one past its peer's share is accepted and closed at once. The caps come
//! from the soft `RLIMIT_NOFILE`: a quarter of it in total (8 to 1024 connections), half of
//! that per peer address (at least 4).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long an accept that failed (e.g. EMFILE) waits before the next.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The descriptor limit assumed where it cannot be read.
const DEFAULT_NOFILE: u64 = 1024;

/// How many connections a [`Door`] holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DoorCaps {
    /// In total.
    pub total: usize,
    /// From one IP address.
    pub per_peer: usize,
}

impl DoorCaps {
    /// From the process's file-descriptor limit (soft `RLIMIT_NOFILE`): a quarter of it in
    /// total, between 8 and 1024 connections, so the rest of the process keeps the other
    /// descriptors; half of that per peer (at least 4).
    pub fn from_descriptor_limit() -> Self {
        Self::for_limit(descriptor_limit())
    }

    /// The caps for a descriptor limit of `nofile`.
    pub fn for_limit(nofile: u64) -> Self {
        let total = (nofile / 4).clamp(8, 1024) as usize;
        DoorCaps {
            total,
            per_peer: (total / 2).max(4),
        }
    }
}

/// The soft limit on open file descriptors.
fn descriptor_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass and reads nothing else.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    if ok && lim.rlim_cur != libc::RLIM_INFINITY {
        lim.rlim_cur
    } else {
        DEFAULT_NOFILE
    }
}

/// A listener with connection caps.
#[derive(Debug)]
pub struct Door {
    listener: TcpListener,
    caps: DoorCaps,
    total: Arc<Semaphore>,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A connection's place in its [`Door`]'s caps, given back when dropped.
#[derive(Debug)]
pub struct Admission {
    _permit: OwnedSemaphorePermit,
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = peers.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                peers.remove(&self.ip);
            }
        }
    }
}

impl Door {
    /// `listener` with `caps`.
    pub fn new(listener: TcpListener, caps: DoorCaps) -> Self {
        Door {
            listener,
            caps,
            total: Arc::new(Semaphore::new(caps.total)),
            peers: Arc::default(),
        }
    }

    /// The caps.
    pub fn caps(&self) -> DoorCaps {
        self.caps
    }

    /// The address bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection within the caps; waits while the total is reached, never fails.
    pub async fn accept(&self) -> (TcpStream, SocketAddr, Admission) {
        loop {
            let permit = self
                .total
                .clone()
                .acquire_owned()
                .await
                .expect("the door's semaphore is never closed");
            let (stream, peer) = match self.listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    backoff(&e).await;
                    continue;
                }
            };
            match self.admit(peer.ip(), permit) {
                Some(admission) => return (stream, peer, admission),
                None => tracing::debug!(
                    "{peer}: closed at once, its address holds {} connections already",
                    self.caps.per_peer
                ),
            }
        }
    }

    /// A place for one more connection from `ip`, unless it holds its share.
    fn admit(&self, ip: IpAddr, permit: OwnedSemaphorePermit) -> Option<Admission> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let n = peers.entry(ip).or_insert(0);
        if *n >= self.caps.per_peer {
            return None;
        }
        *n += 1;
        Some(Admission {
            _permit: permit,
            peers: self.peers.clone(),
            ip,
        })
    }
}

/// Logs a failed accept and waits, unless it only concerned one connection that the peer
/// gave up on.
async fn backoff(e: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!(
        "accepting a connection failed: {e}; trying again in {} ms",
        ACCEPT_BACKOFF.as_millis()
    );
    tokio::time::sleep(ACCEPT_BACKOFF).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_follow_the_descriptor_limit() {
        assert_eq!(
            DoorCaps::for_limit(64),
            DoorCaps {
                total: 16,
                per_peer: 8
            }
        );
        assert_eq!(DoorCaps::for_limit(1 << 20).total, 1024);
        assert_eq!(DoorCaps::for_limit(10).total, 8);
        assert!(DoorCaps::from_descriptor_limit().total >= 8);
    }

    #[tokio::test]
    async fn a_peer_gets_its_share_and_no_more_until_one_closes() {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let caps = DoorCaps {
            total: 8,
            per_peer: 2,
        };
        let door = Arc::new(Door::new(listener, caps));
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let (_, _, first) = door.accept().await;
        let (_, _, _second) = door.accept().await;
        let d = door.clone();
        let next = tokio::spawn(async move { d.accept().await.1 });
        // The third is closed at once: its peer holds two places.
        let mut third = clients.pop().unwrap();
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(60), third.read(&mut buf));
        assert!(
            matches!(read.await, Ok(Ok(0) | Err(_))),
            "the third was let in"
        );
        // A place given back is taken by the next connection.
        drop(first);
        let late = TcpStream::connect(addr).await.unwrap();
        let peer = tokio::time::timeout(Duration::from_secs(60), next)
            .await
            .expect("a freed place is given again")
            .unwrap();
        assert_eq!(peer, late.local_addr().unwrap());
    }
}
