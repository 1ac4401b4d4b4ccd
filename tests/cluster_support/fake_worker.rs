//! A stand-in worker on 127.0.0.1: it passes the handshake, answers each inventory request
//! with the inventory it was given, and closes a connection at any other request (it builds
//! no role). It records the kind of every request it read.

use oxalign_actors::cluster::{
    decode_request, encode, encode_response, read_message, write_message, HelloReply, Inventory,
    Limits, Request, Response,
};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};

const FRAME: usize = 1 << 20;

/// A running stand-in worker; it stops when dropped.
pub struct FakeWorker {
    /// The address it listens on.
    pub addr: String,
    seen: Arc<Mutex<Vec<String>>>,
    _rt: tokio::runtime::Runtime,
}

impl FakeWorker {
    /// Listens on a free port and answers inventory requests with `inventory`.
    pub fn start(inventory: Inventory) -> FakeWorker {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        rt.spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, inventory.clone(), log.clone()));
            }
        });
        FakeWorker {
            addr,
            seen,
            _rt: rt,
        }
    }

    /// The kinds of the requests it has read (`inventory`, `spawn`, ...), in order.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

async fn serve(mut s: TcpStream, inventory: Inventory, seen: Arc<Mutex<Vec<String>>>) {
    let limits = Limits::with_frame(FRAME);
    if !matches!(read_message(&mut s, limits).await, Ok(Some(_))) {
        return;
    }
    let welcome = encode(&HelloReply::Welcome).unwrap();
    if write_message(&mut s, &welcome, FRAME).await.is_err() {
        return;
    }
    while let Ok(Some(bytes)) = read_message(&mut s, limits).await {
        let Ok(env) = decode_request(&bytes) else {
            return;
        };
        seen.lock().unwrap().push(env.body.kind().to_string());
        let Request::Inventory = env.body else {
            return;
        };
        let answer = encode_response(env.id, Response::Inventory(inventory.clone())).unwrap();
        if write_message(&mut s, &answer, FRAME).await.is_err() {
            return;
        }
    }
}
