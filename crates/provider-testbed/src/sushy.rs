//! sushy-tools' Redfish emulator (PyPI `sushy-tools`, installed by `cargo xtask test`) with its
//! fake driver: systems whose power changes land 1 to 11 s after the request, behind basic
//! auth and TLS with a CA of the test's own, for the `redfish` provider's tests.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail, ensure};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio::process::{Child, Command};

pub const USERNAME: &str = "admin";
pub const PASSWORD: &str = "redfish-test-password";

/// One system of the emulator.
#[derive(Debug, Clone)]
pub struct System {
    pub uuid: String,
    pub name: String,
    pub on: bool,
}

impl System {
    pub fn new(n: usize, on: bool) -> Self {
        Self {
            uuid: format!("7c3b1e2a-0000-4000-8000-{n:012}"),
            name: format!("bm-{n}"),
            on,
        }
    }

    pub fn path(&self) -> String {
        format!("/redfish/v1/Systems/{}", self.uuid)
    }
}

#[derive(Debug)]
pub struct Sushy {
    /// `https://127.0.0.1:<port>` (`http://` for [`Sushy::start_plain`]).
    pub url: String,
    pub dir: tempfile::TempDir,
    _server: Child,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl Sushy {
    /// Starts the emulator with `systems` over TLS; `power_off_refused` sets its
    /// `SUSHY_EMULATOR_DISABLE_POWER_OFF`.
    pub async fn start(systems: &[System], power_off_refused: bool) -> Result<Self> {
        Self::serve(systems, power_off_refused, true).await
    }

    /// Over plain HTTP, for a test that counts requests through an interposer.
    pub async fn start_plain(systems: &[System]) -> Result<Self> {
        Self::serve(systems, false, false).await
    }

    async fn serve(systems: &[System], power_off_refused: bool, tls: bool) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        write_tls(dir.path())?;
        // The emulator checks the hash on every request: at bcrypt's default cost that is
        // 0.36 s of Python each, and a few programs polling at once queued past their 2 s
        // timeouts. The lowest cost keeps each check at about a millisecond.
        let hash = Command::new("python3")
            .args([
                "-c",
                "import bcrypt, sys; print(bcrypt.hashpw(sys.argv[1].encode(), bcrypt.gensalt(rounds=4)).decode())",
                PASSWORD,
            ])
            .output()
            .await
            .context("hash the password with python3's bcrypt (a dependency of sushy-tools)")?;
        if !hash.status.success() {
            bail!("bcrypt: {}", String::from_utf8_lossy(&hash.stderr));
        }
        std::fs::write(
            dir.path().join("htpasswd"),
            format!(
                "{USERNAME}:{}",
                String::from_utf8_lossy(&hash.stdout).trim()
            ),
        )?;
        let listed: Vec<String> = systems
            .iter()
            .map(|system| {
                format!(
                    "{{'uuid': '{}', 'name': '{}', 'power_state': '{}', 'nics': []}}",
                    system.uuid,
                    system.name,
                    if system.on { "On" } else { "Off" }
                )
            })
            .collect();
        let config = format!(
            "SUSHY_EMULATOR_FAKE_DRIVER = True\n\
             SUSHY_EMULATOR_LISTEN_PORT = 0\n\
             SUSHY_EMULATOR_AUTH_FILE = {auth:?}\n\
             SUSHY_EMULATOR_STATE_DIR = {state:?}\n\
             SUSHY_EMULATOR_DISABLE_POWER_OFF = {refused}\n\
             SUSHY_EMULATOR_FAKE_SYSTEMS = [{systems}]\n",
            auth = dir.path().join("htpasswd").display().to_string(),
            state = dir.path().join("state").display().to_string(),
            refused = if power_off_refused { "True" } else { "False" },
            systems = listed.join(", "),
        );
        std::fs::write(dir.path().join("emulator.conf"), config)?;
        let mut command = Command::new("python3");
        // The port comes from the config file: `-p 0` reads as no port, and 8000 is taken.
        command
            .args([
                "-m",
                "sushy_tools.emulator.main",
                "--fake",
                "-i",
                "127.0.0.1",
            ])
            .arg("--config")
            .arg(dir.path().join("emulator.conf"));
        if tls {
            command
                .arg("--ssl-certificate")
                .arg(dir.path().join("server.pem"))
                .arg("--ssl-key")
                .arg(dir.path().join("server.key"));
        }
        let mut server = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("start python3 -m sushy_tools.emulator.main (pip install sushy-tools; cargo xtask test does)")?;
        let url = crate::flask_url(&mut server, "the Redfish emulator").await?;
        std::fs::create_dir_all(dir.path().join("credentials"))?;
        std::fs::write(dir.path().join("credentials/username"), USERNAME)?;
        std::fs::write(dir.path().join("credentials/password"), PASSWORD)?;
        Ok(Self {
            url,
            dir,
            _server: server,
            http: Client::builder(TokioExecutor::new()).build_http(),
        })
    }

    /// A call of the test's own, with the emulator's credentials (plain HTTP only).
    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value> {
        let basic =
            base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"));
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header(http::header::AUTHORIZATION, format!("Basic {basic}"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                body.map(|body| body.to_string()).unwrap_or_default(),
            )))?;
        let answer = self.http.request(request).await?;
        let status = answer.status();
        let body = answer.into_body().collect().await?.to_bytes();
        ensure!(
            status.is_success(),
            "redfish {path}: {status}: {}",
            String::from_utf8_lossy(&body)
        );
        Ok(serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
    }

    /// Writes a `--redfish-config` mapping each node to its system, reached at `endpoint` (the
    /// emulator, or an interposer in front of it), and returns its path.
    pub fn write_config(&self, endpoint: &str, machines: &[(&str, &System)]) -> Result<PathBuf> {
        let listed: Vec<serde_json::Value> = machines
            .iter()
            .map(|(node, system)| {
                serde_json::json!({"node": node, "endpoint": endpoint, "system": system.path(),
                    "credentials": self.credentials()})
            })
            .collect();
        let file = self.dir.path().join("machines.yaml");
        std::fs::write(&file, serde_json::json!({ "machines": listed }).to_string())?;
        Ok(file)
    }

    /// The system's `PowerState` (`On`, `Off`), as the emulator says it now.
    pub async fn power_state(&self, system: &str) -> Result<String> {
        let answer = self
            .call(
                http::Method::GET,
                &format!("/redfish/v1/Systems/{system}"),
                None,
            )
            .await?;
        answer["PowerState"]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("system {system} has no PowerState: {answer}"))
    }

    /// Asks for a `ComputerSystem.Reset` of `reset_type` (`ForceOff`, `On`), as the test's own.
    pub async fn reset(&self, system: &str, reset_type: &str) -> Result<()> {
        self.call(
            http::Method::POST,
            &format!("/redfish/v1/Systems/{system}/Actions/ComputerSystem.Reset"),
            Some(serde_json::json!({"ResetType": reset_type})),
        )
        .await
        .map(drop)
    }

    /// The CA the emulator's certificate chains to.
    pub fn ca_bundle(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A directory with `username` and `password`, as a mounted Secret.
    pub fn credentials(&self) -> PathBuf {
        self.dir.path().join("credentials")
    }
}

fn write_tls(dir: &Path) -> Result<()> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "test BMC CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let key = KeyPair::generate()?;
    let serving = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])?
        .signed_by(&key, &ca)?;
    std::fs::write(dir.join("ca.pem"), ca.pem())?;
    std::fs::write(dir.join("server.pem"), serving.pem())?;
    std::fs::write(dir.join("server.key"), key.serialize_pem())?;
    Ok(())
}

/// One machine's BMC (the emulator over plain HTTP) behind an interposer that puts a fault
/// between a program and it, and the `--redfish-config` that maps `node` to it.
#[derive(Debug)]
pub struct InterposedBmc {
    pub sushy: Sushy,
    pub interposer: crate::interposer::Interposer,
    /// The `--redfish-config` file.
    pub config: PathBuf,
}

impl InterposedBmc {
    pub async fn start(node: &str, mode: crate::interposer::Mode) -> Result<Self> {
        let system = System::new(0, true);
        let sushy = Sushy::start_plain(std::slice::from_ref(&system)).await?;
        let interposer = crate::interposer::Interposer::start(&sushy.url).await?;
        interposer.set(mode);
        let config = sushy.dir.path().join("machines.yaml");
        let machines = serde_json::json!({"machines": [{"node": node,
            "endpoint": interposer.url(), "system": system.path(),
            "credentials": sushy.credentials()}]});
        std::fs::write(&config, machines.to_string())?;
        Ok(Self {
            sushy,
            interposer,
            config,
        })
    }

    /// The `ComputerSystem.Reset` requests that reached the interposer.
    pub fn resets(&self) -> usize {
        self.interposer
            .seen()
            .iter()
            .filter(|seen| seen.redfish_reset().is_some())
            .count()
    }

    /// The `ComputerSystem.Reset` requests of `reset_type` (`On`, `ForceOff`).
    pub fn resets_of(&self, reset_type: &str) -> usize {
        self.interposer
            .seen()
            .iter()
            .filter(|seen| {
                seen.redfish_reset()
                    .is_some_and(|(_, asked)| asked == reset_type)
            })
            .count()
    }

    /// The reads of the system (its power state, before each reset too).
    pub fn reads(&self) -> usize {
        self.interposer
            .seen()
            .iter()
            .filter(|seen| seen.method == "GET" && seen.path.starts_with("/redfish/v1/Systems/"))
            .count()
    }
}
