//! The webhook's Service: a local port in front of every termination-controller replica's
//! webhook server, each connection going to the first replica that accepts it (trying them
//! from a different one each time), so reviews reach whichever replica runs. The replicas' API
//! traffic goes through `nodegrace_core::testing::proxy::Proxy`, one each, which can be cut.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

#[derive(Debug)]
pub struct Balancer {
    address: SocketAddr,
    accepting: JoinHandle<()>,
}

impl Balancer {
    pub async fn start(backends: Vec<SocketAddr>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the webhook's port")?;
        let address = listener.local_addr()?;
        let accepting = tokio::spawn(accept(listener, backends));
        Ok(Self { address, accepting })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

async fn accept(listener: TcpListener, backends: Vec<SocketAddr>) {
    let mut next = 0;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        next = (next + 1) % backends.len().max(1);
        tokio::spawn(forward(client, backends.clone(), next));
    }
}

async fn forward(mut client: TcpStream, backends: Vec<SocketAddr>, first: usize) {
    for offset in 0..backends.len() {
        let backend = backends[(first + offset) % backends.len()];
        if let Ok(mut server) = TcpStream::connect(backend).await {
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            return;
        }
    }
}
