//! A stand-in worker on 127.0.0.1: a `ractor_cluster` node (no cookie, no TLS) whose role
//! host answers each inventory request with the inventory it was given and drops any other
//! request unanswered (it builds no role). It records the kind of every request it read.

use oxalign_actors::cluster::{
    decode_request, encode_response, HostMessage, Inventory, Request, Response, HOST_GROUP,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use ractor_cluster::NodeServer;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Seen = Arc<Mutex<Vec<String>>>;

/// A running stand-in worker; it stops when dropped.
pub struct FakeWorker {
    /// The address it listens on.
    pub addr: String,
    seen: Seen,
    _rt: tokio::runtime::Runtime,
}

struct FakeHost;

impl Actor for FakeHost {
    type Msg = HostMessage;
    type State = (Inventory, Seen);
    type Arguments = (Inventory, Seen);

    async fn pre_start(
        &self,
        myself: ActorRef<HostMessage>,
        args: (Inventory, Seen),
    ) -> Result<Self::State, ActorProcessingErr> {
        ractor::pg::join(HOST_GROUP.into(), vec![myself.get_cell()]);
        Ok(args)
    }

    async fn handle(
        &self,
        _myself: ActorRef<HostMessage>,
        msg: HostMessage,
        (inventory, seen): &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (bytes, reply) = match msg {
            HostMessage::Call(bytes, reply) => (bytes, Some(reply)),
            HostMessage::Cast(bytes) => (bytes, None),
            HostMessage::PeerGone(_) => return Ok(()),
        };
        let Ok(env) = decode_request(&bytes) else {
            return Ok(());
        };
        seen.lock().unwrap().push(env.body.kind().to_string());
        if let (Request::Inventory, Some(reply)) = (env.body, reply) {
            let answer = encode_response(env.id, Response::Inventory(inventory.clone()))?;
            let _ = reply.send(answer);
        }
        Ok(())
    }
}

impl FakeWorker {
    /// Listens on a free port and answers inventory requests with `inventory`.
    pub fn start(inventory: Inventory) -> FakeWorker {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let seen = Seen::default();
        let log = seen.clone();
        rt.block_on(async move {
            let server = NodeServer::new(
                port,
                String::new(),
                "fake".into(),
                "oxalign".into(),
                None,
                None,
            )
            .with_listen_addr(IpAddr::V4(Ipv4Addr::LOCALHOST));
            Actor::spawn(None, server, ()).await.unwrap();
            Actor::spawn(None, FakeHost, (inventory, log))
                .await
                .unwrap();
        });
        let addr = format!("127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the fake worker never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
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
