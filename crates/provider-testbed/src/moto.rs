//! moto's server (PyPI `moto[server]`, installed by `cargo xtask test`): EC2 and STS speaking
//! their real Query protocols on a loopback port, for the `aws` provider's tests. Requests
//! are recorded by moto itself, so a test counts what reached "EC2" outside the program.

use std::process::Stdio;

use anyhow::{Context, Result, ensure};
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::process::{Child, Command};

#[derive(Debug)]
pub struct Moto {
    pub url: String,
    _server: Child,
    /// moto writes its recording to a file, by default in the working directory that tests
    /// running at once share.
    _recording: tempfile::TempDir,
    http: Client<HttpConnector, Full<Bytes>>,
}

/// A request moto recorded.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The form's fields, in order.
    pub form: Vec<(String, String)>,
    pub authorization: String,
    pub security_token: Option<String>,
}

impl Recorded {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.form
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn action(&self) -> &str {
        self.field("Action").unwrap_or_default()
    }

    /// The values of `InstanceId.N`.
    pub fn instance_ids(&self) -> Vec<&str> {
        self.form
            .iter()
            .filter(|(key, _)| key.starts_with("InstanceId."))
            .map(|(_, value)| value.as_str())
            .collect()
    }
}

impl Moto {
    /// Starts `moto_server` on a free loopback port, recording requests.
    pub async fn start() -> Result<Self> {
        let recording = tempfile::tempdir()?;
        let mut server = Command::new("python3")
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"])
            .env("MOTO_ENABLE_RECORDING", "True")
            .env(
                "MOTO_RECORDER_FILEPATH",
                recording.path().join("recording.jsonl"),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context(
                "start python3 -m moto.server (pip install 'moto[server]'; cargo xtask test does)",
            )?;
        let url = crate::flask_url(&mut server, "moto_server").await?;
        let moto = Self {
            url,
            _server: server,
            _recording: recording,
            http: Client::builder(TokioExecutor::new()).build_http(),
        };
        moto.post_plain("/moto-api/recorder/start-recording", "")
            .await?;
        Ok(moto)
    }

    async fn post_plain(&self, path: &str, body: &str) -> Result<String> {
        let request = http::Request::post(format!("{}{path}", self.url))
            .body(Full::new(Bytes::from(body.to_owned())))?;
        let response = self.http.request(request).await?;
        let body = response.into_body().collect().await?.to_bytes();
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// An EC2 call in `region`, as a test's own client: moto picks the service and region from
    /// the credential scope and checks no signature.
    pub async fn ec2(&self, region: &str, action: &str, params: &[(&str, &str)]) -> Result<String> {
        let mut form = form_urlencoded::Serializer::new(String::new());
        form.append_pair("Action", action)
            .append_pair("Version", "2016-11-15");
        for (name, value) in params {
            form.append_pair(name, value);
        }
        let body = form.finish();
        let request = http::Request::post(format!("{}/", self.url))
            .header(
                http::header::AUTHORIZATION,
                format!(
                    "AWS4-HMAC-SHA256 Credential=AKIDTEST/20260101/{region}/ec2/aws4_request, \
                     SignedHeaders=host, Signature=0"
                ),
            )
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(Full::new(Bytes::from(body)))?;
        let response = self.http.request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        let text = String::from_utf8_lossy(&body).into_owned();
        ensure!(status.is_success(), "ec2:{action}: {status}: {text}");
        Ok(text)
    }

    /// Launches `count` instances in `zone`; their ids.
    pub async fn run_instances(&self, zone: &str, count: usize) -> Result<Vec<String>> {
        let region = zone.trim_end_matches(|c: char| c.is_ascii_lowercase());
        let count = count.to_string();
        let text = self
            .ec2(
                region,
                "RunInstances",
                &[
                    ("ImageId", "ami-12c6146b"),
                    ("MinCount", &count),
                    ("MaxCount", &count),
                    ("Placement.AvailabilityZone", zone),
                ],
            )
            .await?;
        let document = roxmltree::Document::parse(&text)?;
        let ids: Vec<String> = document
            .descendants()
            .filter(|node| node.tag_name().name() == "instanceId")
            .filter_map(|node| node.text().map(str::to_owned))
            .collect();
        ensure!(
            ids.len().to_string() == count,
            "RunInstances answered {text}"
        );
        Ok(ids)
    }

    /// Turns on an instance's termination protection (`DisableApiTermination`).
    pub async fn protect(&self, region: &str, id: &str) -> Result<()> {
        self.ec2(
            region,
            "ModifyInstanceAttribute",
            &[("InstanceId", id), ("DisableApiTermination.Value", "true")],
        )
        .await
        .map(drop)
    }

    /// An instance's state name as EC2 describes it (`None`: unknown).
    pub async fn state(&self, region: &str, id: &str) -> Result<Option<String>> {
        let text = self
            .ec2(
                region,
                "DescribeInstances",
                &[("Filter.1.Name", "instance-id"), ("Filter.1.Value.1", id)],
            )
            .await?;
        let document = roxmltree::Document::parse(&text)?;
        Ok(document
            .descendants()
            .find(|node| node.tag_name().name() == "instanceState")
            .and_then(|state| {
                state
                    .children()
                    .find(|child| child.tag_name().name() == "name")
            })
            .and_then(|name| name.text().map(str::to_owned)))
    }

    /// Every request moto recorded since it started, the tests' own among them.
    pub async fn recorded(&self) -> Result<Vec<Recorded>> {
        let request =
            http::Request::get(format!("{}/moto-api/recorder/download-recording", self.url))
                .body(Full::new(Bytes::new()))?;
        let response = self.http.request(request).await?;
        let body = response.into_body().collect().await?.to_bytes();
        let mut recorded = Vec::new();
        for line in String::from_utf8_lossy(&body).lines() {
            if line.trim().is_empty() {
                continue;
            }
            let entry: serde_json::Value = serde_json::from_str(line)?;
            let raw = entry["body"].as_str().unwrap_or_default();
            let body = if entry["body_encoded"].as_bool() == Some(true) {
                base64::engine::general_purpose::STANDARD.decode(raw)?
            } else {
                raw.as_bytes().to_vec()
            };
            let header = |name: &str| {
                entry["headers"]
                    .as_object()
                    .and_then(|headers| {
                        headers
                            .iter()
                            .find(|(key, _)| key.eq_ignore_ascii_case(name))
                    })
                    .and_then(|(_, value)| value.as_str().map(str::to_owned))
            };
            recorded.push(Recorded {
                form: form_urlencoded::parse(&body).into_owned().collect(),
                authorization: header("Authorization").unwrap_or_default(),
                security_token: header("X-Amz-Security-Token"),
            });
        }
        Ok(recorded)
    }

    /// The requests of the program under test (a signature that is not the tests' own) calling
    /// `action`.
    pub async fn program_calls(&self, action: &str) -> Result<Vec<Recorded>> {
        Ok(self
            .recorded()
            .await?
            .into_iter()
            .filter(|request| request.action() == action)
            .filter(|request| !request.authorization.contains("Credential=AKIDTEST/"))
            .collect())
    }
}

/// One EC2 instance on moto in `us-east-1a`, reached by a program through an interposer that
/// puts a fault between them.
#[derive(Debug)]
pub struct InterposedEc2 {
    pub moto: Moto,
    pub interposer: crate::interposer::Interposer,
    pub id: String,
}

impl InterposedEc2 {
    pub const ZONE: &str = "us-east-1a";
    pub const REGION: &str = "us-east-1";

    pub async fn start(mode: crate::interposer::Mode) -> Result<Self> {
        let moto = Moto::start().await?;
        let interposer = crate::interposer::Interposer::start(&moto.url).await?;
        interposer.set(mode);
        let id = moto.run_instances(Self::ZONE, 1).await?.remove(0);
        Ok(Self {
            moto,
            interposer,
            id,
        })
    }

    /// The node's `spec.providerID`.
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", Self::ZONE, self.id)
    }

    /// The program's flags to reach EC2 through the interposer.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--instance-provider=aws".to_owned(),
            format!("--aws-endpoint-url={}", self.interposer.url()),
            format!("--aws-region={}", Self::REGION),
        ]
    }

    /// The instance's state as moto has it.
    pub async fn state(&self) -> Result<Option<String>> {
        self.moto.state(Self::REGION, &self.id).await
    }
}
