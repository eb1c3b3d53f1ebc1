//! The kubelet's HTTP probe: a GET that succeeds with a 2xx or 3xx status.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The kubelet's default probe timeout.
const TIMEOUT: Duration = Duration::from_secs(1);

pub async fn http_get_succeeds(address: SocketAddr, path: &str) -> bool {
    tokio::time::timeout(TIMEOUT, status_code(address, path))
        .await
        .ok()
        .flatten()
        .is_some_and(|code| (200..400).contains(&code))
}

async fn status_code(address: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(address).await.ok()?;
    let request =
        format!("GET {path} HTTP/1.0\r\nHost: {address}\r\nUser-Agent: kube-probe\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = [0u8; 32];
    let read = stream.read(&mut head).await.ok()?;
    // "HTTP/1.x 200 OK"
    std::str::from_utf8(&head[..read])
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}
