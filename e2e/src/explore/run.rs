//! One run: a fresh kube-sim, the programs' binaries (two replicas each, through a
//! proxy each), the cluster set up, the seed's schedule played, the faults cleared, a wait for
//! the cluster to settle, then the judgement. Everything lands in `<work>/<seed>/`:
//! `history.jsonl` (each event, when, and what became of it), `logs/` (every process),
//! `violations.txt`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ListParams;
use kube::config::Kubeconfig;
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::actions::{World, register_node};
use super::cloud::Machines;
use super::fences;
use super::invariants::{
    self, Deletion, Disruption, Instance, Settled, TERMINATION_CONTROLLER_USER, Unavailability,
    Violation,
};
use super::orphans;
use super::proxy::Proxy;
use super::record;
use super::responders;
use super::schedule::{self, Event, NODES, Program, Programs, Provider, REPLICAS, Step};
use super::setup;
use super::setup::node_budgets;
use super::sim::{Outcome, sim_get as get};
use super::storms;
use crate::cluster::Cluster;
use crate::processes::Guarded;
use crate::wait::poll_until;

/// The machines renew their Lease every 500 ms and count as down after 3 s of silence.
const RENEW_INTERVAL: Duration = Duration::from_millis(500);
const NODE_MONITOR_GRACE: Duration = Duration::from_secs(3);
/// How long the programs get to bring every node into a state the progress invariant
/// accepts, once the schedule is over: the longest chain of the timings below (a stuck pod
/// given up after 5 s, a detach waited for 10 s, the provider's poll backing off to 15 s),
/// with room for a lost leadership (4 s lease).
pub const SETTLE_BOUND: Duration = Duration::from_secs(60);
/// How long the programs get to send the Events of their last writes once the cluster settled.
/// 10 s proved short on a loaded CI machine (12 runs at once, 4 jobs): a drain-deadline delete
/// in the run's last second had its `DrainDeadline` Event still queued when the judge looked
/// (seed 41, 2026-11-29; the seed alone passes). A lost Event still fails the run.
const EVENTS_BOUND: Duration = Duration::from_secs(30);
/// out-of-service-gc's `--liveness-guard-window` and `--max-fenced` (its default) in a run.
const LIVENESS_WINDOW: Duration = Duration::from_secs(3);
const MAX_FENCED: usize = 1;
/// The pod GC's sweep period and quarantine, shortened as the node timings are (20 s and 40 s
/// upstream).
const POD_GC: orphans::PodGc = orphans::PodGc {
    period: jiff::SignedDuration::from_secs(1),
    quarantine: jiff::SignedDuration::from_secs(3),
};
/// How long a node Ready again after a recovery's power-on gets for its cleanup's last pass:
/// a Node change wakes it, and it writes one update.
const RECOVERY_BOUND: Duration = Duration::from_secs(10);
/// How often the settling cluster is read (kube-sim has no watch for the cloud's state).
const SETTLE_POLL: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct Options {
    /// Where kube-sim and the programs' binaries are (the dev build).
    pub bin_dir: PathBuf,
    pub charts_dir: PathBuf,
    /// Each run writes into `<work_root>/<seed>`.
    pub work_root: PathBuf,
    pub duration: Duration,
    pub programs: Programs,
    pub provider: Provider,
    /// Drain through EvictionRequests, with responders played by [`super::responders`].
    pub eviction_requests: bool,
}

#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub events: usize,
    /// What reached the provider's server, where it is one (aws).
    pub provider_traffic: Option<String>,
    /// The most writes one program sent one Node within invariant 13's window.
    pub busiest_node_writes: usize,
    pub violations: Vec<Violation>,
    pub dir: PathBuf,
}

struct Replica {
    program: Program,
    index: usize,
    proxy: Proxy,
    process: Option<Guarded>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl Replica {
    fn start(&mut self, binary: &Path) -> Result<()> {
        self.process = Some(Guarded::spawn(
            self.program.name(),
            binary,
            &self.args,
            &self.env,
            &self.log,
        )?);
        Ok(())
    }
}

/// Plays `seed` and judges it.
pub async fn explore(seed: u64, options: &Options) -> Result<Report> {
    let dir = options.work_root.join(seed.to_string());
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clear {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir.join("logs"))?;
    let programs = options.programs.list();
    let steps = schedule::generate(seed, options.duration, &programs, options.provider);
    let registers_nodes = Machines::registers_nodes(options.provider);
    let kube_sim = options.bin_dir.join("kube-sim");
    // A simulator built before its pod GC had `gcOrphaned` has no such flags: invariant 12 is
    // then not judged.
    let pod_gc_flags = known_to_command(&kube_sim, &["serve"], POD_GC.flags())?;
    let orphans_judged = pod_gc_flags.len() == POD_GC.flags().len();
    let mut sim_args = vec!["--default-toleration-seconds=4".to_owned()];
    sim_args.extend(pod_gc_flags);
    if options.eviction_requests {
        sim_args.extend(responders::SIM_FLAGS.map(str::to_owned));
    }
    let cluster = Cluster::start(
        &kube_sim,
        if registers_nodes { 0 } else { NODES },
        RENEW_INTERVAL,
        NODE_MONITOR_GRACE,
        &dir,
        &sim_args,
    )
    .await?;
    let client = cluster.client().clone();
    let api = api_address(cluster.kubeconfig())?;
    let mut machines = Machines::start(options.provider, &client, api, &dir).await?;
    let mut provider_ids = HashMap::new();
    for index in 0..NODES {
        let provider_id = machines.first(index).await?;
        if registers_nodes {
            let annotations = machines.node_annotations(&provider_id);
            register_node(&client, index, &provider_id, &annotations).await?;
        }
        provider_ids.insert(schedule::node(index), provider_id);
    }
    let names: Vec<&str> = programs.iter().map(|p| p.name()).collect();
    let tokens = setup::identities(&client, &names).await?;
    setup::crd(&client, &options.charts_dir).await?;
    let webhook_ports = free_ports(REPLICAS)?;
    let webhook = Proxy::start(
        webhook_ports
            .iter()
            .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
            .collect(),
    )
    .await?;
    if programs.contains(&Program::TerminationController) {
        setup::webhooks(&client, webhook.address()).await?;
    }
    setup::workloads(&client, options.eviction_requests).await?;
    let _responders = options
        .eviction_requests
        .then(|| responders::play(client.clone(), seed));

    let mut replicas = Vec::new();
    for (program, token) in programs.iter().zip(&tokens) {
        for (index, webhook_port) in webhook_ports.iter().copied().enumerate() {
            let proxy = Proxy::start(vec![api]).await?;
            let kubeconfig = dir.join(format!("kubeconfig-{}-{index}", program.name()));
            setup::write_kubeconfig(&kubeconfig, &format!("http://{}", proxy.address()), token)?;
            let mut args = arguments(*program, index, &kubeconfig, webhook_port);
            if options.eviction_requests && *program == Program::TerminationController {
                args.push("--eviction-api=eviction-request".to_owned());
            }
            let (provider_args, provider_env) = machines.program_args(*program);
            args.extend(provider_args);
            let mut replica = Replica {
                program: *program,
                index,
                args: known_to(&binary(options, *program), args)?,
                env: provider_env,
                log: dir.join(format!("logs/{}-{index}.log", program.name())),
                proxy,
                process: None,
            };
            replica.start(&binary(options, *program))?;
            replicas.push(replica);
        }
    }
    if programs.contains(&Program::TerminationController) {
        let nodes: Api<Node> = Api::all(client.clone());
        let finalized = poll_until(Duration::from_secs(30), || async {
            nodes.list(&ListParams::default()).await.is_ok_and(|list| {
                list.items.iter().all(|node| {
                    node.metadata
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| f.iter().any(|f| f == invariants::FINALIZER))
                })
            })
        })
        .await;
        anyhow::ensure!(
            finalized,
            "termination-controller did not put its finalizer on every node within 30 s (logs in {})",
            dir.display()
        );
    }

    let (recording, _watches) = record::start(&client);
    let mut history = History::create(&dir.join("history.jsonl"))?;
    let mut world = World::new(client.clone(), machines, provider_ids);
    let mut violations = Vec::new();
    let start = Instant::now();
    for step in &steps {
        tokio::time::sleep_until(start + step.at).await;
        let outcome = match &step.event {
            Event::KillReplica { program, replica } => {
                let replica = find(&mut replicas, *program, *replica);
                match replica.process.take() {
                    Some(mut process) => {
                        check_alive(
                            &mut process,
                            replica.program,
                            replica.index,
                            &mut violations,
                        );
                        process.kill();
                        Outcome::Done("SIGKILL".to_owned())
                    }
                    None => Outcome::Skipped("not running".to_owned()),
                }
            }
            Event::StartReplica { program, replica } => {
                let binary = binary(options, *program);
                let replica = find(&mut replicas, *program, *replica);
                if replica.process.is_some() {
                    Outcome::Skipped("running".to_owned())
                } else {
                    replica.start(&binary)?;
                    Outcome::Done("started".to_owned())
                }
            }
            Event::CutReplica { program, replica } => {
                find(&mut replicas, *program, *replica).proxy.cut();
                Outcome::Done("API traffic cut".to_owned())
            }
            Event::RestoreReplica { program, replica } => {
                find(&mut replicas, *program, *replica).proxy.restore();
                Outcome::Done("API traffic restored".to_owned())
            }
            event => world.apply(event).await,
        };
        history.write(start, step, &outcome)?;
        for replica in &mut replicas {
            let (program, index) = (replica.program, replica.index);
            if let Some(process) = replica.process.as_mut()
                && check_alive(process, program, index, &mut violations)
            {
                replica.process = None;
            }
        }
    }

    // The faults end; the machines stay as the schedule left them (off, terminated, running).
    let settling = Instant::now();
    let clear = [Event::ClearFaults];
    for event in &clear {
        let outcome = world.apply(event).await;
        history.write(
            start,
            &Step {
                at: start.elapsed(),
                event: event.clone(),
            },
            &outcome,
        )?;
    }
    for replica in &mut replicas {
        replica.proxy.restore();
        if replica.process.is_none() {
            replica.start(&binary(options, replica.program))?;
        }
    }
    heal_partitions(&mut world, start, &mut history).await?;
    let termination = programs.contains(&Program::TerminationController);
    let out_of_service = programs.contains(&Program::OutOfServiceGc);
    let deadline = Instant::now() + SETTLE_BOUND;
    let (settled, stuck) = loop {
        let mut stuck = settled_state(&client, termination, out_of_service)
            .await
            .unwrap_or_else(|error| vec![format!("reading the cluster failed: {error:#}")]);
        if options.eviction_requests {
            stuck.extend(
                responders::requests_left(&client)
                    .await
                    .unwrap_or_else(|error| {
                        vec![format!("reading the requests failed: {error:#}")]
                    }),
            );
        }
        if stuck.is_empty() || Instant::now() >= deadline {
            break (stuck.is_empty(), stuck);
        }
        tokio::time::sleep(SETTLE_POLL).await;
    };
    if !settled {
        for what in &stuck {
            violations.push(Violation {
                invariant: if what.starts_with(responders::LEFT) {
                    14
                } else {
                    5
                },
                at: jiff::Timestamp::now().to_string(),
                what: format!("{:.0?} after the schedule: {what}", settling.elapsed()),
            });
        }
    }
    if orphans_judged {
        violations.extend(orphans_past_the_bound(&client, &recording).await?);
    }
    // Just before the programs stop: a drain deadline can fall due while the orphans are
    // waited for, and its delete's Event must not be judged missing before it was sent.
    if termination {
        await_drain_deadline_events(&client).await;
    }
    for replica in &mut replicas {
        if let Some(mut process) = replica.process.take() {
            check_alive(
                &mut process,
                replica.program,
                replica.index,
                &mut violations,
            );
        }
    }
    let watched = recording.in_order();
    let lines: Vec<String> = watched
        .iter()
        .map(|seen| seen.summary().to_string())
        .collect();
    std::fs::write(dir.join("watched.jsonl"), lines.join("\n"))?;
    violations.extend(judge(&dir, &client, &watched, termination, out_of_service).await?);
    if termination {
        violations.extend(leaks(&dir, &client, &world).await?);
    }
    violations.extend(storms::provider_calls(
        &world.machines().provider_requests(),
    ));
    let (too_many_writes, busiest_node_writes) = node_writes(&dir, &client).await?;
    violations.extend(too_many_writes);
    violations.extend(panics(&dir.join("logs")));
    write_violations(&dir, &violations, &history.lines)?;
    drop(replicas);
    drop(cluster);
    Ok(Report {
        seed,
        events: steps.len(),
        provider_traffic: world.machines().traffic(),
        busiest_node_writes,
        violations,
        dir,
    })
}

fn binary(options: &Options, program: Program) -> PathBuf {
    options.bin_dir.join(program.name())
}

fn find(replicas: &mut [Replica], program: Program, index: usize) -> &mut Replica {
    replicas
        .iter_mut()
        .find(|r| r.program == program && r.index == index)
        .expect("the schedule names only replicas the run started")
}

/// 6. A process that ended without being killed by the explorer: returns whether it ended.
fn check_alive(
    process: &mut Guarded,
    program: Program,
    index: usize,
    violations: &mut Vec<Violation>,
) -> bool {
    let Some(status) = process.exited() else {
        return false;
    };
    violations.push(Violation {
        invariant: 6,
        at: jiff::Timestamp::now().to_string(),
        what: format!(
            "{} replica {} exited on its own: {status}",
            program.name(),
            index
        ),
    });
    true
}

/// 6. A panic anywhere in a log.
fn panics(logs: &Path) -> Vec<Violation> {
    let Ok(entries) = std::fs::read_dir(logs) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let text = std::fs::read_to_string(entry.path()).ok()?;
            let line = text.lines().find(|line| line.contains("panicked at"))?;
            Some(Violation {
                invariant: 6,
                at: String::new(),
                what: format!("{}: {line}", entry.file_name().to_string_lossy()),
            })
        })
        .collect()
}

async fn heal_partitions(world: &mut World, start: Instant, history: &mut History) -> Result<()> {
    let nodes: Api<Node> = Api::all(world.client().clone());
    for node in nodes.list(&ListParams::default()).await?.items {
        let partitioned = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("sim.nodegrace.io/kubelet"))
            .is_some_and(|state| state == "partitioned");
        if partitioned {
            let name = node.metadata.name.clone().unwrap_or_default();
            let event = Event::Heal { node: name };
            let outcome = world.apply(&event).await;
            history.write(
                start,
                &Step {
                    at: start.elapsed(),
                    event,
                },
                &outcome,
            )?;
        }
    }
    Ok(())
}

/// What keeps the progress invariant from holding now (empty: it holds).
async fn settled_state(
    client: &Client,
    termination: bool,
    out_of_service: bool,
) -> Result<Vec<String>> {
    let nodes: Vec<Value> = list::<Node>(Api::all(client.clone())).await?;
    let pods = list::<Pod>(Api::all(client.clone())).await?;
    let attachments = list::<VolumeAttachment>(Api::all(client.clone())).await?;
    let pod_budgets = list::<PodDisruptionBudget>(Api::all(client.clone())).await?;
    let node_budgets: Vec<Value> = node_budgets(client)
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|b| serde_json::to_value(b).unwrap_or_default())
        .collect();
    let instances: Vec<Instance> = serde_json::from_str(&get(client, "/sim/v1/instances").await?)?;
    let mut stuck = invariants::progress(
        &Settled {
            nodes: &nodes,
            pods: &pods,
            attachments: &attachments,
            instances: &instances,
            pod_budgets: &pod_budgets,
            node_budgets: &node_budgets,
        },
        termination,
        out_of_service,
    );
    if out_of_service {
        stuck.extend(nodes.iter().filter_map(fences::unsettled));
    }
    Ok(stuck)
}

async fn list<K>(api: Api<K>) -> Result<Vec<Value>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|item| serde_json::to_value(item).unwrap_or_default())
        .collect())
}

/// Invariant 12: waits, at most the pod GC's bound, for the pods bound to a gone node to go;
/// those still bound past the bound are violations.
async fn orphans_past_the_bound(
    client: &Client,
    recording: &record::Recording,
) -> Result<Vec<Violation>> {
    let bound = POD_GC.bound();
    let deadline = Instant::now() + bound.unsigned_abs();
    loop {
        let now = jiff::Timestamp::now();
        let nodes = list::<Node>(Api::all(client.clone())).await?;
        let pods = list::<Pod>(Api::all(client.clone())).await?;
        let removals = orphans::removals(&recording.in_order());
        let left = orphans::orphans(&removals, &nodes, &pods);
        let late = orphans::overdue(&left, now, bound);
        if late.len() == left.len() || Instant::now() >= deadline {
            return Ok(late);
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// termination-controller sends an Event behind each write, not before it: a drain-deadline
/// delete just before the cluster settled may still have its `DrainDeadline` Event in flight,
/// and stopping the program would lose it. So the judge waits, a bounded while, until every
/// budget-breaking delete of termination-controller is named by one; a delete that never is
/// stays for invariant 2 to report.
async fn await_drain_deadline_events(client: &Client) {
    let all_named = || async {
        let Ok(text) = get(client, "/sim/v1/audit/violations").await else {
            return false;
        };
        let Ok(breaches) = serde_json::from_str::<Vec<Unavailability>>(&text) else {
            return false;
        };
        let Ok(named) = drain_deadline_pods(client).await else {
            return false;
        };
        breaches
            .iter()
            .filter(|u| u.by == Disruption::Delete && u.user == TERMINATION_CONTROLLER_USER)
            .all(|u| invariants::deleted_at_the_drain_deadline(u, &named))
    };
    poll_until(EVENTS_BOUND, all_named).await;
}

/// The pods a `DrainDeadline` Event names: deleted at the drain deadline, on purpose.
async fn drain_deadline_pods(client: &Client) -> Result<BTreeSet<(String, String)>> {
    let events: Api<CoreEvent> = Api::all(client.clone());
    Ok(events
        .list(&ListParams::default().fields("reason=DrainDeadline"))
        .await?
        .items
        .into_iter()
        .filter(|event| event.involved_object.kind.as_deref() == Some("Pod"))
        .map(|event| {
            (
                event.involved_object.namespace.unwrap_or_default(),
                event.involved_object.name.unwrap_or_default(),
            )
        })
        .collect())
}

/// Invariants 1–4, from kube-sim's records and the judge's watches.
async fn judge(
    dir: &Path,
    client: &Client,
    recording: &[record::Seen],
    termination: bool,
    out_of_service: bool,
) -> Result<Vec<Violation>> {
    // kube-sim's records are kept beside the history: the simulator is gone after the run.
    let record = |name: &str, text: &str| std::fs::write(dir.join(name), text);
    let text = get(client, "/sim/v1/audit/deletions").await?;
    record("audit-deletions.json", &text)?;
    let deletions: Vec<Deletion> = serde_json::from_str(&text)?;
    let text = get(client, "/sim/v1/audit/violations").await?;
    record("audit-violations.json", &text)?;
    let unavailabilities: Vec<Unavailability> = serde_json::from_str(&text)?;
    let text = get(client, "/sim/v1/instances").await?;
    record("instances.json", &text)?;
    let instances: Vec<Instance> = serde_json::from_str(&text)?;
    let drain_deadline_pods = drain_deadline_pods(client).await?;
    let mut violations = Vec::new();
    if termination {
        violations.extend(invariants::terminations(&instances, &deletions));
        violations.extend(invariants::budgets(recording));
    }
    violations.extend(invariants::repeated_deletes(&deletions));
    violations.extend(invariants::availability(
        &unavailabilities,
        &drain_deadline_pods,
    ));
    if out_of_service {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), setup::APPS);
        let keeper_volumes = claims
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|claim| {
                claim
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| name.starts_with("data-keeper-"))
            })
            .filter_map(|claim| claim.spec.and_then(|spec| spec.volume_name))
            .collect();
        violations.extend(invariants::out_of_service(
            &deletions,
            &keeper_volumes,
            recording,
        ));
        violations.extend(fences::power_offs(recording, &instances, LIVENESS_WINDOW));
        violations.extend(fences::at_most_fenced(recording, MAX_FENCED));
        violations.extend(recoveries_ended(client, recording).await?);
    }
    Ok(violations)
}

/// 11, on a node that is Ready now. A fenced node whose cleanup ended late is powered on
/// after the cluster settled, and comes back Ready while the judges run: it gets
/// [`RECOVERY_BOUND`] from the first read for its cleanup to take the taint and the step off.
async fn recoveries_ended(client: &Client, recording: &[record::Seen]) -> Result<Vec<Violation>> {
    let deadline = Instant::now() + RECOVERY_BOUND;
    loop {
        let nodes = list::<Node>(Api::all(client.clone())).await?;
        let violations = fences::recovered(recording, &nodes);
        if violations.is_empty() || Instant::now() >= deadline {
            return Ok(violations);
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

/// 13's second half, from kube-sim's audit of Node writes (kept beside the history); a
/// simulator without that audit (an older `--bin-dir`) is not judged on it.
async fn node_writes(dir: &Path, client: &Client) -> Result<(Vec<Violation>, usize)> {
    let Ok(text) = get(client, "/sim/v1/audit/node-writes").await else {
        return Ok((Vec::new(), 0));
    };
    std::fs::write(dir.join("audit-node-writes.json"), &text)?;
    let writes: Vec<kube_sim::audit::NodeWrite> = serde_json::from_str(&text)?;
    let programs = [
        invariants::TERMINATION_CONTROLLER_USER,
        invariants::OUT_OF_SERVICE_GC_USER,
    ];
    Ok((
        storms::node_writes(&writes, &programs),
        storms::busiest_node_writes(&writes, &programs),
    ))
}

/// 8. No machine leaks, judged from the cloud of record (moto for aws) at the end.
async fn leaks(dir: &Path, client: &Client, world: &World) -> Result<Vec<Violation>> {
    let states = world.machines().states().await?;
    std::fs::write(
        dir.join("machines.json"),
        serde_json::to_vec_pretty(&states)?,
    )?;
    let deletions: Vec<Deletion> =
        serde_json::from_str(&get(client, "/sim/v1/audit/deletions").await?)?;
    let named_now: BTreeSet<String> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|node| node.spec.and_then(|spec| spec.provider_id))
        .collect();
    Ok(invariants::leaks(
        &deletions,
        &named_now,
        world.released_by_hand(),
        &states,
    ))
}

fn api_address(kubeconfig: &Path) -> Result<SocketAddr> {
    let config = Kubeconfig::read_from(kubeconfig)?;
    let server = config
        .clusters
        .first()
        .and_then(|cluster| cluster.cluster.as_ref())
        .and_then(|cluster| cluster.server.clone())
        .context("the kubeconfig names no server")?;
    let authority = server
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    authority
        .parse()
        .with_context(|| format!("kube-sim's address {server} (the explorer serves plain HTTP)"))
}

/// The flags among `args` that `binary --help` names: a binary built from an older commit (to
/// show what the explorer finds there) runs with the options it has.
fn known_to(binary: &Path, args: Vec<String>) -> Result<Vec<String>> {
    known_to_command(binary, &[], args)
}

/// [`known_to`] for a subcommand's flags (`kube-sim serve`).
fn known_to_command(binary: &Path, command: &[&str], args: Vec<String>) -> Result<Vec<String>> {
    let help = std::process::Command::new(binary)
        .args(command)
        .arg("--help")
        .output()
        .with_context(|| format!("run {} --help", binary.display()))?;
    let help = String::from_utf8_lossy(&help.stdout);
    Ok(args
        .into_iter()
        .filter(|arg| {
            let flag = arg.split_once('=').map_or(arg.as_str(), |(flag, _)| flag);
            help.contains(&format!("{flag} "))
        })
        .collect())
}

/// Free local ports for the replicas' webhook servers, which bind them themselves. They are
/// taken below the kernel's ephemeral range: a port found by binding `:0` and releasing it is
/// handed out again by the next `:0` bind (this run's proxies, the other job's simulator) and
/// the replica then fails with "Address already in use" (seed 41 did, once). Below that range
/// only explicit binds compete, and within this process a counter keeps jobs apart.
fn free_ports(count: usize) -> Result<Vec<u16>> {
    use std::sync::atomic::{AtomicU16, Ordering};
    const LOWEST: u16 = 20_000;
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(LOWEST).max(1);
    // A random start per process keeps two explorer processes apart too, most of the time.
    let _ = NEXT.compare_exchange(
        0,
        rand::random_range(1..span),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let mut ports = Vec::with_capacity(count);
    for _ in 0..u32::from(span) {
        if ports.len() == count {
            break;
        }
        let port = LOWEST + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    anyhow::ensure!(
        ports.len() == count,
        "no {count} free ports between {LOWEST} and {ephemeral}"
    );
    Ok(ports)
}

/// The programs' flags: timings shortened so a run's histories play out in seconds.
fn arguments(program: Program, index: usize, kubeconfig: &Path, webhook_port: u16) -> Vec<String> {
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--admin-listen=127.0.0.1:0".to_owned(),
        format!("--leader-election-namespace={}", setup::NAMESPACE),
        format!("--leader-election-identity={}-{index}", program.name()),
        "--leader-election-lease-duration=4s".to_owned(),
        "--leader-election-renew-margin=2s".to_owned(),
        "--log-level=info".to_owned(),
    ];
    match program {
        Program::TerminationController => args.extend([
            format!("--webhook-listen=127.0.0.1:{webhook_port}"),
            "--webhook-mode=queue".to_owned(),
            format!("--webhook-secret={}", setup::WEBHOOK_SECRET),
            format!("--webhook-secret-namespace={}", setup::NAMESPACE),
            "--webhook-issue-certificates=true".to_owned(),
            "--webhook-dns-names=127.0.0.1".to_owned(),
            format!("--webhook-configurations={}", setup::WEBHOOK_CONFIGURATION),
            "--eviction-backoff-max=2s".to_owned(),
            "--stuck-terminating-after=5s".to_owned(),
            "--volume-detach-timeout=10s".to_owned(),
            "--drain-timeout=45s".to_owned(),
            "--not-ready-timeout=15s".to_owned(),
            // Above the 1–11 s the Redfish emulator takes to carry out a reset.
            "--terminate-resend-after=15s".to_owned(),
        ]),
        Program::OutOfServiceGc => args.extend([
            "--auto-untaint=true".to_owned(),
            "--auto-taint-after=3s".to_owned(),
            format!("--liveness-guard-window={}s", LIVENESS_WINDOW.as_secs()),
            "--fence-after=4s".to_owned(),
            "--fence-timeout=20s".to_owned(),
            "--recover-after-cleanup=true".to_owned(),
            "--recover-timeout=15s".to_owned(),
            format!("--max-fenced={MAX_FENCED}"),
        ]),
    }
    args
}

/// `history.jsonl`: one line per event, with its time from the start and the wall clock.
struct History {
    file: File,
    lines: Vec<(jiff::Timestamp, String)>,
}

impl History {
    fn create(path: &Path) -> Result<Self> {
        Ok(Self {
            file: File::create(path).with_context(|| format!("create {}", path.display()))?,
            lines: Vec::new(),
        })
    }

    fn write(&mut self, start: Instant, step: &Step, outcome: &Outcome) -> Result<()> {
        let wall = jiff::Timestamp::now();
        let mut line = serde_json::to_value(step)?;
        line["t"] = json!((start.elapsed().as_secs_f64() * 1000.0).round() / 1000.0);
        line["wall"] = json!(wall.to_string());
        let (key, text) = match outcome {
            Outcome::Done(text) => ("done", text),
            Outcome::Skipped(text) => ("skipped", text),
            Outcome::Failed(text) => ("failed", text),
        };
        line[key] = json!(text);
        let text = serde_json::to_string(&line)?;
        writeln!(self.file, "{text}")?;
        self.lines.push((wall, text));
        Ok(())
    }
}

/// `violations.txt`: each violation with the history lines of the 5 s before it.
fn write_violations(
    dir: &Path,
    violations: &[Violation],
    history: &[(jiff::Timestamp, String)],
) -> Result<()> {
    let mut text = String::new();
    for violation in violations {
        let _ = writeln!(
            text,
            "invariant {} at {}: {}",
            violation.invariant, violation.at, violation.what
        );
        if let Ok(at) = violation.at.parse::<jiff::Timestamp>() {
            let from = at - jiff::SignedDuration::from_secs(5);
            for (_, line) in history
                .iter()
                .filter(|(wall, _)| *wall >= from && *wall <= at)
            {
                let _ = writeln!(text, "    {line}");
            }
        }
    }
    std::fs::write(dir.join("violations.txt"), text)?;
    Ok(())
}
