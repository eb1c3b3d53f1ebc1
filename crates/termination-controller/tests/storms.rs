//! A provider that refuses or hangs, for the terminate call of every provider: the
//! release-shaped binary against moto's EC2 and sushy-tools' Redfish behind the interposer,
//! an operator's command, and a Cluster API management cluster whose RBAC does not let us
//! delete Machines. From the first terminate on, over a window of the failures' backoff, the
//! calls that reach the provider, the Node's writes and the Events are counted: at most one
//! call per backoff step, one Event with a count, the node held and the machine untouched.
//! Then the provider takes the request, and the machine's polls start again from their first
//! step rather than where the failures' backoff had grown to.
//!
//! The window is real time: the steps' deadlines are wall-clock, as on a cluster.

use std::time::Duration;

use anyhow::{Result, ensure};
use kube::{Api, Client};
use kube_sim::KubeSim;
use kube_sim::cluster::Cluster;
use nodegrace_testing::storms::{Storm, event_series, spawn_program};
use provider_testbed::interposer::Mode;
use provider_testbed::moto::InterposedEc2;
use provider_testbed::sushy::InterposedBmc;
use serde_json::json;
use termination_controller::termination::PROVIDER_FAILURES;
use tokio::process::Child;

use crate::common::{delete_node, has_finalizer, machine_node, node_gone, sim, wait_for};

const BINARY: &str = env!("CARGO_BIN_EXE_termination-controller");
const FAILED: &str = "InstanceTerminationFailed";
/// The machine under `worker` in the Cluster API tests.
const MACHINE_ID: &str = "docker:///workload/worker";
/// Five tries of the failures' backoff (at 0, 1, 3, 7 and 15 s) and short of the sixth (at
/// 31 s).
const OBSERVED: Duration = Duration::from_secs(24);

fn start(sim: &KubeSim, provider: &[String]) -> Result<Child> {
    let flags: Vec<String> = std::iter::once("--instance-not-found-confirm=2s".to_owned())
        .chain(provider.iter().cloned())
        .collect();
    spawn_program(BINARY, sim.kubeconfig_path(), &flags)
}

/// Deletes `worker` and, from the first terminate on, counts over [`OBSERVED`]: the calls
/// within the backoff's schedule, the Node's writes (per failure, the condition says the count
/// and the next try: one status write), one Event with a count; the node held.
async fn storm_free(client: &Client, calls: &dyn Fn() -> usize, what: &str) -> Result<usize> {
    wait_for("the finalizer", || has_finalizer(client, "worker")).await?;
    let storm = Storm {
        client,
        node: "worker",
        what,
        reason: FAILED,
        observed: OBSERVED,
        tries: 3..=PROVIDER_FAILURES.tries_within(OBSERVED),
        writes_per_try: 2,
    };
    let made = storm.judge(calls, delete_node(client, "worker")).await?;
    ensure!(!node_gone(client, "worker").await?, "released on a failure");
    Ok(made)
}

/// One EC2 machine under the node `worker`, reached through an interposer.
struct Ec2 {
    machine: InterposedEc2,
    client: Client,
    _sim: KubeSim,
    _controller: Child,
}

impl Ec2 {
    async fn start(mode: Mode) -> Result<Self> {
        let machine = InterposedEc2::start(mode).await?;
        let sim = sim(0).await?;
        let client = sim.client();
        machine_node(&client, "worker", &machine.provider_id(), None).await?;
        let controller = start(&sim, &machine.flags())?;
        Ok(Self {
            machine,
            client,
            _sim: sim,
            _controller: controller,
        })
    }

    async fn state(&self) -> Result<Option<String>> {
        self.machine.state().await
    }
}

async fn ec2_storm(mode: Mode) -> Result<()> {
    let ec2 = Ec2::start(mode).await?;
    let (client, cloud) = (&ec2.client, &ec2.machine.interposer);
    let made = storm_free(
        client,
        &|| cloud.calls("TerminateInstances"),
        "TerminateInstances",
    )
    .await?;
    ensure!(ec2.state().await?.as_deref() == Some("running"));

    // The refusal lifted: the next try is accepted, and the machine's end is read at the
    // polls' first step, not a grown backoff later (15 s before).
    let describes_before = cloud.calls("DescribeInstances");
    cloud.set(Mode::Forward);
    wait_for("the node released", || node_gone(client, "worker")).await?;
    ensure!(ec2.state().await?.as_deref() == Some("terminated"));
    ensure!(
        cloud.calls("TerminateInstances") == made + 1,
        "one accepted TerminateInstances after {made} failed"
    );
    // The try after the failures reads once, terminates, and reads the end on the first poll.
    let describes = cloud.calls("DescribeInstances") - describes_before;
    ensure!(
        describes <= 3,
        "{describes} DescribeInstances to read the end"
    );
    Ok(())
}

/// Termination protection, or an IAM policy without `ec2:TerminateInstances`.
#[tokio::test]
async fn a_refused_ec2_terminate_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_storm(Mode::Refuse("TerminateInstances".to_owned())).await
}

/// EC2 that does not answer a TerminateInstances within `--instance-provider-timeout`.
#[tokio::test]
async fn an_ec2_terminate_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_storm(Mode::Hang("TerminateInstances".to_owned())).await
}

/// The BMC's fault, and which of its requests are counted.
#[derive(Clone, Copy)]
enum Counted {
    Resets,
    Reads,
}

async fn redfish_storm(mode: Mode, counted: Counted) -> Result<()> {
    let bmc = InterposedBmc::start("worker", mode).await?;
    let sim = sim(0).await?;
    let client = sim.client();
    machine_node(&client, "worker", "redfish:///worker", None).await?;
    let _controller = start(
        &sim,
        &[
            "--instance-provider=redfish".to_owned(),
            format!("--redfish-config={}", bmc.config.display()),
        ],
    )?;
    match counted {
        Counted::Resets => storm_free(&client, &|| bmc.resets(), "ComputerSystem.Reset").await?,
        Counted::Reads => {
            let made = storm_free(&client, &|| bmc.reads(), "system read").await?;
            ensure!(bmc.resets() == 0, "reset after {made} failed reads");
            made
        }
    };
    Ok(())
}

/// A BMC account whose role may read but not reset.
#[tokio::test]
async fn a_refused_redfish_power_off_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(
        Mode::Refuse("ComputerSystem.Reset".to_owned()),
        Counted::Resets,
    )
    .await
}

/// A BMC that does not answer the reset within `--instance-provider-timeout`.
#[tokio::test]
async fn a_redfish_power_off_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(
        Mode::Hang("ComputerSystem.Reset".to_owned()),
        Counted::Resets,
    )
    .await
}

/// A BMC refusing even the system's reads: no power state, so no reset, and the reads on the
/// backoff's schedule.
#[tokio::test]
async fn a_refused_redfish_state_read_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(
        Mode::Refuse("/redfish/v1/Systems/".to_owned()),
        Counted::Reads,
    )
    .await
}

/// A BMC that does not answer the system's reads.
#[tokio::test]
async fn a_redfish_state_read_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    redfish_storm(
        Mode::Hang("/redfish/v1/Systems/".to_owned()),
        Counted::Reads,
    )
    .await
}

/// The operator's command: `state` runs `state`, `terminate` runs `terminate`; each call is a
/// line of its log, and the calls of `counted` are counted.
async fn exec_storm(state: &str, terminate: &str, counted: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("calls.log");
    let script = dir.path().join("provider.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$1\" >> {log}\ncase \"$1\" in\n  state) {state} ;;\n  \
             terminate) {terminate} ;;\nesac\n",
            log = log.display()
        ),
    )?;
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let sim = sim(0).await?;
    let client = sim.client();
    machine_node(&client, "worker", "example:///worker", None).await?;
    let _controller = start(
        &sim,
        &[
            "--instance-provider=exec".to_owned(),
            format!("--instance-provider-command={}", script.display()),
        ],
    )?;
    let calls = |of: &str| {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|line| *line == of)
            .count()
    };
    storm_free(&client, &|| calls(counted), counted).await?;
    if counted == "state" {
        ensure!(calls("terminate") == 0, "terminated without a state");
    }
    Ok(())
}

const RUNNING: &str = "echo running";
const REFUSED: &str = "echo 'not allowed' >&2; exit 1";
const HANGS: &str = "exec sleep 30";

#[tokio::test]
async fn a_failing_exec_terminate_is_retried_on_the_backoffs_schedule() -> Result<()> {
    exec_storm(RUNNING, REFUSED, "terminate").await
}

#[tokio::test]
async fn an_exec_terminate_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    exec_storm(RUNNING, HANGS, "terminate").await
}

#[tokio::test]
async fn a_failing_exec_state_read_is_retried_on_the_backoffs_schedule() -> Result<()> {
    exec_storm(REFUSED, "true", "state").await
}

#[tokio::test]
async fn an_exec_state_read_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    exec_storm(HANGS, "true", "state").await
}

/// A management cluster with the Machine `workers-0` of the node `worker`.
async fn management_cluster() -> Result<KubeSim> {
    use provider_testbed::cluster_api::{create_machine, machine, machine_crd};
    let management = Cluster::new(0).crd(machine_crd()).start().await?;
    create_machine(
        &management.client(),
        &machine("default", "workers-0", "worker", MACHINE_ID),
    )
    .await?;
    Ok(management)
}

/// The workload cluster with `worker` on that Machine, and the controller reaching the
/// management cluster with `kubeconfig`.
async fn on_machines(kubeconfig: &std::path::Path) -> Result<(KubeSim, Child)> {
    use provider_testbed::cluster_api::node_annotations;
    let sim = sim(0).await?;
    machine_node(
        &sim.client(),
        "worker",
        MACHINE_ID,
        Some(node_annotations("default", "workers-0")),
    )
    .await?;
    let controller = start(
        &sim,
        &[
            "--instance-provider=cluster-api".to_owned(),
            format!("--cluster-api-kubeconfig={}", kubeconfig.display()),
        ],
    )?;
    Ok((sim, controller))
}

/// The management cluster's kubeconfig changed by `change`, written in `dir`.
fn kubeconfig_changed(
    management: &KubeSim,
    dir: &tempfile::TempDir,
    change: impl FnOnce(String) -> String,
) -> Result<std::path::PathBuf> {
    let path = dir.path().join("management.kubeconfig");
    std::fs::write(
        &path,
        change(std::fs::read_to_string(management.kubeconfig_path())?),
    )?;
    Ok(path)
}

/// The Machine was not deleted.
async fn machine_left(management: &KubeSim) -> Result<()> {
    let machines: Api<kube::api::DynamicObject> = Api::namespaced_with(
        management.client(),
        "default",
        &nodegrace_controller::instances::cluster_api::machine_resource(),
    );
    let left = machines.get("workers-0").await?;
    ensure!(
        left.metadata.deletion_timestamp.is_none(),
        "the Machine was deleted"
    );
    Ok(())
}

/// Cluster API's management cluster failing every Machine delete (500s): tries on the
/// backoff's schedule, counted by the management cluster's fault injector.
#[tokio::test]
async fn a_failing_machine_delete_is_retried_on_the_backoffs_schedule() -> Result<()> {
    use kube_sim::faults::{ErrorRule, FailureKind};

    let management = management_cluster().await?;
    management.faults().add_rule(ErrorRule {
        verb: "delete".to_owned(),
        resource: "machines".to_owned(),
        rate: 1.0,
        failure: FailureKind::InternalError,
    });
    let (sim, _controller) = on_machines(management.kubeconfig_path()).await?;
    let deletes = || usize::try_from(management.faults().failed()).unwrap_or(usize::MAX);
    storm_free(&sim.client(), &deletes, "Machine delete").await?;
    Ok(())
}

/// A management cluster that does not answer about Machines within
/// `--instance-provider-timeout` (reached through an interposer that holds those requests):
/// the reads of the Machine are tried on the backoff's schedule, and nothing is deleted.
#[tokio::test]
async fn a_machine_read_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    use provider_testbed::interposer::Interposer;

    let management = management_cluster().await?;
    let hanging = Interposer::start(management.url()).await?;
    hanging.set(Mode::Hang("/machines/".to_owned()));
    let dir = tempfile::tempdir()?;
    let through = kubeconfig_changed(&management, &dir, |admin| {
        admin.replace(management.url(), &hanging.url())
    })?;
    ensure!(
        std::fs::read_to_string(&through)?.contains(&hanging.url()),
        "the admin's kubeconfig does not name the management cluster's URL"
    );
    let (sim, _controller) = on_machines(&through).await?;
    let machine_calls = || {
        hanging
            .seen()
            .iter()
            .filter(|seen| seen.path.contains("/machines/"))
            .count()
    };
    storm_free(&sim.client(), &machine_calls, "Machine read").await?;
    machine_left(&management).await
}

/// A management cluster whose RBAC lets us read and annotate Machines but not delete them:
/// a 403 holds the node with a Warning that names the missing permission.
#[tokio::test]
async fn a_machine_delete_forbidden_by_rbac_holds_the_node() -> Result<()> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::PostParams;

    let management = management_cluster().await?;
    let manage = management.client();
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "machine-reader"},
        "rules": [
            {"apiGroups": ["cluster.x-k8s.io"], "resources": ["machines"],
             "verbs": ["get", "list", "watch", "patch"]},
            {"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/version"], "verbs": ["get"]},
        ],
    }))?;
    Api::<ClusterRole>::all(manage.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "machine-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "machine-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "machine-reader"}],
    }))?;
    Api::<ClusterRoleBinding>::all(manage.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    // The admin's kubeconfig, acting as the reader (the admin may impersonate).
    let dir = tempfile::tempdir()?;
    let reader = kubeconfig_changed(&management, &dir, |admin| {
        admin.replace(
            "    token: kube-sim\n",
            "    token: kube-sim\n    as: machine-reader\n",
        )
    })?;
    ensure!(
        std::fs::read_to_string(&reader)?.contains("as: machine-reader"),
        "the admin's kubeconfig has no token line to act from"
    );
    let (sim, _controller) = on_machines(&reader).await?;
    let client = sim.client();
    wait_for("the finalizer", || has_finalizer(&client, "worker")).await?;
    delete_node(&client, "worker").await?;
    wait_for("three refused deletes", || async {
        Ok(event_series(&client, "worker", FAILED)
            .await?
            .iter()
            .any(|count| *count >= 3))
    })
    .await?;
    let failed = event_series(&client, "worker", FAILED).await?;
    ensure!(failed.len() == 1, "{failed:?}");
    ensure!(!node_gone(&client, "worker").await?, "released on a 403");
    machine_left(&management).await
}

/// EC2 refusing `DescribeInstances`: the machine's state cannot be read, so no terminate is
/// sent (it is decided on a state), and the reads are tried on the backoff's schedule.
#[tokio::test]
async fn a_refused_ec2_state_read_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_state_storm(Mode::Refuse("DescribeInstances".to_owned())).await
}

/// EC2 that does not answer `DescribeInstances` within `--instance-provider-timeout`.
#[tokio::test]
async fn an_ec2_state_read_that_hangs_is_retried_on_the_backoffs_schedule() -> Result<()> {
    ec2_state_storm(Mode::Hang("DescribeInstances".to_owned())).await
}

async fn ec2_state_storm(mode: Mode) -> Result<()> {
    let ec2 = Ec2::start(mode).await?;
    let reads = || ec2.machine.interposer.calls("DescribeInstances");
    storm_free(&ec2.client, &reads, "DescribeInstances").await?;
    ensure!(
        ec2.machine.interposer.calls("TerminateInstances") == 0,
        "terminated without a state"
    );
    ensure!(ec2.state().await?.as_deref() == Some("running"));
    Ok(())
}
