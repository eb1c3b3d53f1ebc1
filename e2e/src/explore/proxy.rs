//! TCP proxies: one per controller replica in front of the API server, so one replica's
//! traffic can be cut (every connection dropped, new ones refused) while the others keep
//! theirs; and one in front of every replica's webhook server, as a Service would be, reaching
//! whichever replica accepts.

use std::net::SocketAddr;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug)]
pub struct Proxy {
    address: SocketAddr,
    cut: watch::Sender<bool>,
    accepting: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free local port; each connection goes to the first of `backends` that
    /// accepts it, trying them from a different one each time.
    pub async fn start(backends: Vec<SocketAddr>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind a proxy port")?;
        let address = listener.local_addr()?;
        let (cut, cut_seen) = watch::channel(false);
        let accepting = tokio::spawn(accept(listener, backends, cut_seen));
        Ok(Self {
            address,
            cut,
            accepting,
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Drops every open connection and refuses new ones until [`Proxy::restore`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accepting.abort();
    }
}

async fn accept(listener: TcpListener, backends: Vec<SocketAddr>, cut: watch::Receiver<bool>) {
    let mut next = 0;
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *cut.borrow() {
            drop(client);
            continue;
        }
        next = (next + 1) % backends.len().max(1);
        tokio::spawn(forward(client, backends.clone(), next, cut.clone()));
    }
}

async fn forward(
    mut client: TcpStream,
    backends: Vec<SocketAddr>,
    first: usize,
    mut cut: watch::Receiver<bool>,
) {
    let mut server = None;
    for offset in 0..backends.len() {
        if let Ok(stream) = TcpStream::connect(backends[(first + offset) % backends.len()]).await {
            server = Some(stream);
            break;
        }
    }
    let Some(mut server) = server else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = cut.wait_for(|cut| *cut) => {}
    }
}
