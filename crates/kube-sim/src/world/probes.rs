//! The kubelet's prober for containers run as processes (pkg/kubelet/prober): HTTP readiness
//! and liveness probes against the pod's address, with the probe's delay, period, timeout and
//! thresholds; a result is reported when it changes what the kubelet does (ready or not,
//! restart). TCP, gRPC, exec and startup probes are not run.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Readiness,
    Liveness,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Readiness => "Readiness",
            Self::Liveness => "Liveness",
        }
    }

    fn field(self) -> &'static str {
        match self {
            Self::Readiness => "readinessProbe",
            Self::Liveness => "livenessProbe",
        }
    }
}

#[derive(Debug)]
pub struct Outcome {
    pub uid: String,
    pub container: String,
    pub kind: Kind,
    pub healthy: bool,
    /// Why a probe failed, in the kubelet's words.
    pub message: String,
}

/// Where and how often one probe runs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Probe {
    address: String,
    path: String,
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

fn seconds(probe: &Value, field: &str, default: u64) -> Duration {
    Duration::from_secs(probe[field].as_u64().unwrap_or(default))
}

fn count(probe: &Value, field: &str, default: u32) -> u32 {
    probe[field]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// The container's HTTP probe of this kind, if it has one the prober runs.
fn probe(
    container: &Value,
    kind: Kind,
    pod_ip: &str,
    period_cap: Option<Duration>,
) -> Option<Probe> {
    let probe = &container[kind.field()];
    let get = probe.get("httpGet")?;
    let port = match &get["port"] {
        Value::Number(number) => number.as_u64(),
        Value::String(name) => name.parse().ok().or_else(|| {
            container["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|port| port["name"] == name.as_str())
                .and_then(|port| port["containerPort"].as_u64())
        }),
        _ => None,
    }?;
    let host = get["host"]
        .as_str()
        .filter(|h| !h.is_empty())
        .unwrap_or(pod_ip);
    let period = seconds(probe, "periodSeconds", 10).max(Duration::from_secs(1));
    Some(Probe {
        address: format!("{host}:{port}"),
        path: get["path"].as_str().unwrap_or("/").to_owned(),
        initial_delay: seconds(probe, "initialDelaySeconds", 0),
        period: period_cap.map_or(period, |cap| period.min(cap)),
        timeout: seconds(probe, "timeoutSeconds", 1).max(Duration::from_secs(1)),
        success_threshold: count(probe, "successThreshold", 1),
        failure_threshold: count(probe, "failureThreshold", 3),
    })
}

/// Whether the container has a readiness probe the prober runs (it is unready until it passes).
pub fn has_readiness_probe(container: &Value) -> bool {
    probe(container, Kind::Readiness, "127.0.0.1", None).is_some()
}

/// Starts the container's probes; they end with `stop`.
pub fn start(
    container: &Value,
    uid: &str,
    pod_ip: &str,
    period_cap: Option<Duration>,
    outcomes: &mpsc::UnboundedSender<Outcome>,
    stop: &CancellationToken,
) {
    let name = container["name"].as_str().unwrap_or_default();
    for kind in [Kind::Readiness, Kind::Liveness] {
        if let Some(probe) = probe(container, kind, pod_ip, period_cap) {
            tokio::spawn(run(
                probe,
                kind,
                uid.to_owned(),
                name.to_owned(),
                outcomes.clone(),
                stop.clone(),
            ));
        }
    }
}

async fn run(
    probe: Probe,
    kind: Kind,
    uid: String,
    container: String,
    outcomes: mpsc::UnboundedSender<Outcome>,
    stop: CancellationToken,
) {
    tokio::select! {
        () = stop.cancelled() => return,
        () = tokio::time::sleep(probe.initial_delay) => {}
    }
    let mut tick = tokio::time::interval(probe.period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut successes, mut failures) = (0u32, 0u32);
    // Readiness starts out failed: only a change is reported.
    let mut healthy = kind == Kind::Liveness;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let result = tokio::time::timeout(probe.timeout, get(&probe.address, &probe.path))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "Get \"http://{}{}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
                    probe.address, probe.path
                ))
            });
        let report = match result {
            Ok(()) => {
                successes += 1;
                failures = 0;
                (!healthy && successes >= probe.success_threshold).then(|| {
                    healthy = true;
                    String::new()
                })
            }
            Err(message) => {
                failures += 1;
                successes = 0;
                (healthy && failures >= probe.failure_threshold).then(|| {
                    healthy = kind == Kind::Liveness;
                    failures = 0;
                    message
                })
            }
        };
        if let Some(message) = report {
            let sent = outcomes.send(Outcome {
                uid: uid.clone(),
                container: container.clone(),
                kind,
                healthy: message.is_empty(),
                message,
            });
            if sent.is_err() {
                return;
            }
        }
    }
}

/// One HTTP GET; success is a status from 200 to 399, as the kubelet's HTTP prober counts it.
async fn get(address: &str, path: &str) -> Result<(), String> {
    let url = format!("http://{address}{path}");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| format!("Get \"{url}\": dial tcp {address}: connect: {e}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let mut head = [0u8; 64];
    let mut read = 0;
    while read < 12 {
        let n = stream
            .read(&mut head[read..])
            .await
            .map_err(|e| format!("Get \"{url}\": {e}"))?;
        if n == 0 {
            return Err(format!("Get \"{url}\": EOF"));
        }
        read += n;
    }
    let status: u16 = std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("Get \"{url}\": malformed HTTP response"))?;
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn probes_take_named_ports_and_the_defaults() {
        let container = json!({
            "name": "c",
            "ports": [{"name": "admin", "containerPort": 9451}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "admin"}, "periodSeconds": 20},
        });
        let readiness = probe(
            &container,
            Kind::Readiness,
            "127.64.0.2",
            Some(Duration::from_secs(1)),
        )
        .unwrap();
        assert_eq!(readiness.address, "127.64.0.2:9451");
        assert_eq!(readiness.period, Duration::from_secs(1));
        assert_eq!(
            (readiness.success_threshold, readiness.failure_threshold),
            (1, 3)
        );
        assert!(probe(&container, Kind::Liveness, "127.64.0.2", None).is_none());
        assert!(has_readiness_probe(&container));
    }
}
