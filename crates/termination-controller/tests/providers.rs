//! The node-termination scenario once per real instance provider, against the server that
//! speaks its protocol: five nodes deleted at once, two bystanders whose nodes stay. What was
//! terminated is counted outside the program (moto's recorder, an HTTP interposer before the
//! BMC, a proxy before the management cluster). Each prints
//! `provider <name> nodes=<n> terminated-once=<n> wrong=<n> s=<s>`, `wrong` counting machines
//! stopped or terminated that belonged to no deleted Node. `cargo xtask e2e` runs them with the
//! binary it built (`NODEGRACE_E2E_TERMINATION_CONTROLLER`).

use crate::common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::api::DynamicObject;
use kube::{Api, Client};
use kube_sim::KubeSim;
use kube_sim::cluster::Cluster;
use nodegrace_controller::instances::cluster_api::machine_resource;
use nodegrace_testing::proxy::Proxy;
use provider_testbed::cluster_api::{
    MachineController, create_machine, machine, machine_crd, node_annotations,
};
use provider_testbed::interposer::Interposer;
use provider_testbed::moto::Moto;
use provider_testbed::sushy::{Sushy, System};
use tokio::process::{Child, Command};

use crate::common::{delete_node, has_finalizer, machine_node, sim};

const DELETED: usize = 5;
const BYSTANDERS: usize = 2;
const RELEASE_DEADLINE: Duration = Duration::from_secs(120);

fn binary() -> PathBuf {
    std::env::var_os("NODEGRACE_E2E_TERMINATION_CONTROLLER").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_termination-controller")),
        PathBuf::from,
    )
}

struct Outcome {
    provider: &'static str,
    terminated_once: usize,
    wrong: usize,
    took: Duration,
}

impl Outcome {
    fn report(&self) -> Result<()> {
        println!(
            "provider {} nodes={DELETED} terminated-once={} wrong={} s={:.1}",
            self.provider,
            self.terminated_once,
            self.wrong,
            self.took.as_secs_f64()
        );
        ensure!(self.wrong == 0, "{} machines wrongly ended", self.wrong);
        ensure!(
            self.terminated_once == DELETED,
            "{} of {DELETED} machines terminated exactly once",
            self.terminated_once
        );
        Ok(())
    }
}

fn controller(workload: &KubeSim, flags: &[String], env: &[(&str, &str)]) -> Result<Child> {
    let mut command = Command::new(binary());
    command
        .arg(format!(
            "--kubeconfig={}",
            workload.kubeconfig_path().display()
        ))
        .args([
            "--admin-listen=127.0.0.1:0",
            "--leader-elect=false",
            "--log-level=warn",
        ])
        .args(flags)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command.spawn().context("start termination-controller")
}

fn names() -> Vec<String> {
    (0..DELETED + BYSTANDERS)
        .map(|n| format!("worker-{n}"))
        .collect()
}

/// Waits for the finalizer on every node, deletes the first `DELETED`, and waits until they
/// are released; how long the release took.
async fn delete_and_wait(client: &Client) -> Result<Duration> {
    for name in names() {
        common::wait_for(&format!("the finalizer on {name}"), || {
            has_finalizer(client, &name)
        })
        .await?;
    }
    let started = Instant::now();
    for name in &names()[..DELETED] {
        delete_node(client, name).await?;
    }
    nodegrace_testing::wait_for_within("the deleted nodes released", RELEASE_DEADLINE, || async {
        let nodes = Api::<Node>::all(client.clone());
        for name in &names()[..DELETED] {
            if nodes.get_opt(name).await?.is_some() {
                return Ok(false);
            }
        }
        Ok(true)
    })
    .await?;
    Ok(started.elapsed())
}

#[tokio::test]
async fn aws_against_moto() -> Result<()> {
    let moto = Moto::start().await?;
    let workload = sim(0).await?;
    let client = workload.client();
    let ids = moto
        .run_instances("us-east-1a", DELETED + BYSTANDERS)
        .await?;
    for (name, id) in names().iter().zip(&ids) {
        machine_node(&client, name, &format!("aws:///us-east-1a/{id}"), None).await?;
    }
    let flags = [
        "--instance-provider=aws".to_owned(),
        format!("--aws-endpoint-url={}", moto.url),
        "--aws-region=us-east-1".to_owned(),
    ];
    let keys = [
        ("AWS_ACCESS_KEY_ID", "AKIAPROGRAM"),
        ("AWS_SECRET_ACCESS_KEY", "secret"),
    ];
    let _program = controller(&workload, &flags, &keys)?;
    let took = delete_and_wait(&client).await?;
    let calls = moto.program_calls("TerminateInstances").await?;
    let sent = |id: &str| {
        calls
            .iter()
            .filter(|call| call.instance_ids().contains(&id))
            .count()
    };
    let mut terminated_once = 0;
    for id in &ids[..DELETED] {
        if sent(id) == 1 && moto.state("us-east-1", id).await?.as_deref() == Some("terminated") {
            terminated_once += 1;
        }
    }
    let mut wrong = 0;
    for id in &ids[DELETED..] {
        if sent(id) > 0 || moto.state("us-east-1", id).await?.as_deref() != Some("running") {
            wrong += 1;
        }
    }
    Outcome {
        provider: "aws",
        terminated_once,
        wrong,
        took,
    }
    .report()
}

#[tokio::test]
async fn redfish_against_sushy() -> Result<()> {
    let systems: Vec<System> = (0..DELETED + BYSTANDERS)
        .map(|n| System::new(n, true))
        .collect();
    let sushy = Sushy::start_plain(&systems).await?;
    let bmc = Interposer::start(&sushy.url).await?;
    let workload = sim(0).await?;
    let client = workload.client();
    let nodes = names();
    let machines: Vec<(&str, &System)> = nodes.iter().map(String::as_str).zip(&systems).collect();
    let file = sushy.write_config(&bmc.url(), &machines)?;
    for name in nodes {
        machine_node(&client, &name, &format!("redfish:///{name}"), None).await?;
    }
    let flags = [
        "--instance-provider=redfish".to_owned(),
        format!("--redfish-config={}", file.display()),
    ];
    let _program = controller(&workload, &flags, &[])?;
    let took = delete_and_wait(&client).await?;
    let forced_off = |system: &System| bmc.redfish_resets(&system.uuid, "ForceOff");
    // Read directly, not through the interposer: these reads are the judge's, not the program's.
    let power = |system: &System| {
        let (sushy, uuid) = (&sushy, system.uuid.clone());
        async move { sushy.power_state(&uuid).await }
    };
    let mut terminated_once = 0;
    for system in systems.iter().take(DELETED) {
        if forced_off(system) == 1 && power(system).await? == "Off" {
            terminated_once += 1;
        }
    }
    let mut wrong = 0;
    for system in systems.iter().skip(DELETED) {
        if forced_off(system) > 0 || power(system).await? != "On" {
            wrong += 1;
        }
    }
    Outcome {
        provider: "redfish",
        terminated_once,
        wrong,
        took,
    }
    .report()
}

#[tokio::test]
async fn cluster_api_against_a_management_cluster() -> Result<()> {
    let management = Cluster::new(0).crd(machine_crd()).start().await?;
    let workload = sim(0).await?;
    let (manage, client) = (management.client(), workload.client());
    let _cluster_api = MachineController::start(manage.clone(), client.clone());
    for (n, name) in names().iter().enumerate() {
        let id = format!("docker:///workload/{name}");
        let machine_name = format!("workers-{n}");
        create_machine(&manage, &machine("default", &machine_name, name, &id)).await?;
        machine_node(
            &client,
            name,
            &id,
            Some(node_annotations("default", &machine_name)),
        )
        .await?;
    }
    let upstream = management
        .url()
        .trim_start_matches("http://")
        .parse()
        .context("the management cluster's address")?;
    let proxy = Proxy::start(upstream).await?;
    let kubeconfig = tempfile::NamedTempFile::new()?;
    std::fs::write(
        kubeconfig.path(),
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: management\n  cluster:\n    server: {}\n\
             users:\n- name: u\n  user:\n    token: kube-sim\ncontexts:\n- name: c\n  context:\n    cluster: management\n    user: u\n\
             current-context: c\n",
            proxy.url()
        ),
    )?;
    let flags = [
        "--instance-provider=cluster-api".to_owned(),
        format!("--cluster-api-kubeconfig={}", kubeconfig.path().display()),
    ];
    let _program = controller(&workload, &flags, &[])?;
    let took = delete_and_wait(&client).await?;
    let deletes = |machine_name: &str| {
        let path =
            format!("/apis/cluster.x-k8s.io/v1beta2/namespaces/default/machines/{machine_name}");
        proxy
            .requests()
            .iter()
            .filter(|request| {
                request.method == "DELETE" && request.path.trim_end_matches('?') == path
            })
            .count()
    };
    let machines: Api<DynamicObject> =
        Api::namespaced_with(manage.clone(), "default", &machine_resource());
    let mut terminated_once = 0;
    for n in 0..DELETED {
        let name = format!("workers-{n}");
        if deletes(&name) == 1 && machines.get_opt(&name).await?.is_none() {
            terminated_once += 1;
        }
    }
    let mut wrong = 0;
    for n in DELETED..DELETED + BYSTANDERS {
        let name = format!("workers-{n}");
        let intact = machines
            .get_opt(&name)
            .await?
            .is_some_and(|machine| machine.metadata.deletion_timestamp.is_none());
        if deletes(&name) > 0 || !intact {
            wrong += 1;
        }
    }
    Outcome {
        provider: "cluster-api",
        terminated_once,
        wrong,
        took,
    }
    .report()
}
