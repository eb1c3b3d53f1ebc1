//! A TCP proxy in front of the API server that a test can cut and heal: one replica's network
//! partition, while its process runs on. It records every HTTP/1.1 request line a client sent
//! through it, also while cut (the bytes are read, logged and never forwarded), so a test can
//! tell what a partitioned replica tried to do and when.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One request line a client sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub at: SystemTime,
    pub method: String,
    pub path: String,
    /// False when the proxy was cut: the request never reached the server.
    pub forwarded: bool,
}

#[derive(Debug)]
pub struct Proxy {
    pub address: SocketAddr,
    cut: watch::Sender<bool>,
    requests: Arc<Mutex<Vec<Request>>>,
    accepting: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let address = listener.local_addr()?;
        let (cut, is_cut) = watch::channel(false);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&requests);
        let accepting = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let is_cut = is_cut.clone();
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let _ = serve(client, upstream, is_cut, log).await;
                });
            }
        });
        Ok(Self {
            address,
            cut,
            requests,
            accepting,
        })
    }

    /// The URL clients use instead of the server's.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Closes every connection and forwards nothing until [`Proxy::heal`].
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Every request line seen so far.
    pub fn requests(&self) -> Vec<Request> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut is_cut: watch::Receiver<bool>,
    log: Arc<Mutex<Vec<Request>>>,
) -> std::io::Result<()> {
    let mut lines = RequestLines::default();
    let mut buffer = vec![0; 16 * 1024];
    if *is_cut.borrow() {
        // Read what the client tries to send, then hang up.
        let read = client.read(&mut buffer).await?;
        lines.feed(&buffer[..read], false, &log);
        return Ok(());
    }
    let mut server = TcpStream::connect(upstream).await?;
    let (mut server_read, mut server_write) = server.split();
    let (mut client_read, mut client_write) = client.split();
    let to_server = async {
        let mut buffer = vec![0; 16 * 1024];
        loop {
            let read = client_read.read(&mut buffer).await?;
            if read == 0 {
                return server_write.shutdown().await;
            }
            lines.feed(&buffer[..read], true, &log);
            server_write.write_all(&buffer[..read]).await?;
        }
    };
    let to_client = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        result = to_server => result,
        result = to_client => result.map(drop),
        _ = is_cut.wait_for(|cut| *cut) => Ok(()),
    }
}

/// Reads the requests in a client's HTTP/1.1 byte stream: request line and headers, then a
/// body of `Content-Length` bytes skipped (a body ends without a newline, so the next request
/// line follows it directly on a kept-alive connection).
#[derive(Debug, Default)]
struct RequestLines {
    line: Vec<u8>,
    /// The request line of the head being read, and its body length so far.
    head: Option<((String, String), usize)>,
    /// Body bytes still to skip.
    body_left: usize,
}

/// Lines longer than this are not request lines or headers we read.
const LONGEST_LINE: usize = 8 * 1024;

impl RequestLines {
    fn feed(&mut self, mut bytes: &[u8], forwarded: bool, log: &Mutex<Vec<Request>>) {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let skipped = self.body_left.min(bytes.len());
                self.body_left -= skipped;
                bytes = &bytes[skipped..];
                continue;
            }
            let byte = bytes[0];
            bytes = &bytes[1..];
            if byte != b'\n' {
                if self.line.len() < LONGEST_LINE {
                    self.line.push(byte);
                }
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            match &mut self.head {
                None => {
                    if let Some(request) = request_line(line) {
                        self.head = Some((request, 0));
                    }
                }
                Some((_, length)) if !line.is_empty() => {
                    if let Some(value) = header(line, "content-length") {
                        *length = value.trim().parse().unwrap_or(0);
                    }
                }
                Some(_) => {
                    if let Some(((method, path), length)) = self.head.take() {
                        log.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(Request {
                                at: SystemTime::now(),
                                method,
                                path,
                                forwarded,
                            });
                        self.body_left = length;
                    }
                }
            }
        }
    }
}

/// The value of header `name` (lower case) if `line` is that header.
fn header<'a>(line: &'a [u8], name: &str) -> Option<&'a str> {
    let line = std::str::from_utf8(line).ok()?;
    let (key, value) = line.split_once(':')?;
    key.trim().eq_ignore_ascii_case(name).then_some(value)
}

fn request_line(line: &[u8]) -> Option<(String, String)> {
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    let (method, path, version) = (parts.next()?, parts.next()?, parts.next()?);
    let known = ["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&method);
    (known && version == "HTTP/1.1" && path.starts_with('/') && parts.next().is_none())
        .then(|| (method.to_owned(), path.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_read_across_chunks_and_bodies_on_a_kept_alive_connection() {
        let log = Mutex::new(Vec::new());
        let mut lines = RequestLines::default();
        let body = "{\"GET /x HTTP/1.1\": 1}";
        lines.feed(b"POST /api/v1/namespaces/d/pods/p/evi", true, &log);
        lines.feed(
            format!(
                "ction HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}GET /api HTTP/1.1\r\nhost: x\r\n\r\n",
                body.len()
            )
            .as_bytes(),
            true,
            &log,
        );
        let seen: Vec<(String, String)> = log
            .into_inner()
            .unwrap()
            .into_iter()
            .map(|request| (request.method, request.path))
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "POST".to_owned(),
                    "/api/v1/namespaces/d/pods/p/eviction".to_owned()
                ),
                ("GET".to_owned(), "/api".to_owned()),
            ]
        );
    }
}
