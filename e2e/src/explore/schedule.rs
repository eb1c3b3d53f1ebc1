//! A run's schedule: what happens to the cluster and when, drawn from the seed alone, so the
//! same seed (with the same binary) gives the same schedule. Events name nodes, replicas and
//! budgets; whether one still applies when its time comes (the node may be gone) is decided
//! then, and recorded with it.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The cluster's machines: node-0..NODES-1.
pub const NODES: usize = 5;
/// Replicas of each program.
pub const REPLICAS: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    TerminationController,
    OutOfServiceGc,
}

impl Program {
    pub fn name(self) -> &'static str {
        match self {
            Self::TerminationController => "termination-controller",
            Self::OutOfServiceGc => "out-of-service-gc",
        }
    }
}

/// Which programs a run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Programs {
    All,
    Termination,
    Oos,
}

impl Programs {
    pub fn list(self) -> Vec<Program> {
        match self {
            Self::All => vec![Program::TerminationController, Program::OutOfServiceGc],
            Self::Termination => vec![Program::TerminationController],
            Self::Oos => vec![Program::OutOfServiceGc],
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Provider {
    /// kube-sim's cloud (`--instance-provider=sim`).
    Sim,
    /// moto's EC2 behind an interposer of faults (`--instance-provider=aws`).
    Aws,
    /// sushy-tools' Redfish emulator behind an interposer of faults, one per program
    /// (`--instance-provider=redfish`): bare metal, where a termination is a power-off.
    Redfish,
    /// Cluster API Machines in the cluster itself, deleted by the explorer's machine
    /// controller (`--instance-provider=cluster-api` for termination-controller;
    /// out-of-service-gc, which Cluster API cannot serve, fences on kube-sim's cloud).
    ClusterApi,
}

/// A fault between the programs and EC2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderFault {
    /// 503 `RequestLimitExceeded`, nothing forwarded.
    Throttle,
    /// 500 `InternalError`, nothing forwarded.
    InternalError,
    /// Forwarded and carried out, the answer never comes: the client times out.
    LoseAnswers,
    /// One action answered 403 `UnauthorizedOperation`, not forwarded: an IAM policy without
    /// it. The others are forwarded.
    Refuse(RefusedAction),
    /// Redfish: every request answered 401 (the BMC's account changed under the Secret).
    Unauthorized,
    /// Redfish: a `ComputerSystem.Reset` answered 204 and never carried out.
    ResetIgnored,
    /// Redfish: a `ComputerSystem.Reset` answered 403 `InsufficientPrivilege` (an account of a
    /// role that may read but not power: a ReadOnly BMC user); reads are answered.
    ResetRefused,
    /// Redfish: the BMC answers nothing; requests time out.
    NotAnswering,
    /// Cluster API: the controller's access to Machines revoked (its RoleBinding deleted), so
    /// the API server answers 403.
    MachinesForbidden,
    /// Cluster API: the machine controller stalls, so a deleted Machine stays deleting.
    MachinesStuck,
}

/// The EC2 actions an IAM policy may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RefusedAction {
    TerminateInstances,
    StopInstances,
    StartInstances,
}

impl RefusedAction {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TerminateInstances => "TerminateInstances",
            Self::StopInstances => "StopInstances",
            Self::StartInstances => "StartInstances",
        }
    }
}

/// A NodeDisruptionBudget's or a PodDisruptionBudget's numbers: exactly one is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Numbers {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_available: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// `kubectl delete node` of one or several at once.
    DeleteNodes {
        nodes: Vec<String>,
    },
    /// An impatient operator removes our finalizer from a node being deleted (`kubectl patch`).
    ForceRemoveFinalizer {
        node: String,
    },
    /// A Node registered anew under a name whose Node is gone: by the same machine (its
    /// providerID) or by a new one.
    RecreateNode {
        node: String,
        same_machine: bool,
    },
    PowerOff {
        node: String,
    },
    PowerOn {
        node: String,
    },
    /// The cloud ends the node's machine (a spot reclaim, an operator in the console).
    TerminateInstance {
        node: String,
    },
    /// The kubelet keeps running its pods but reaches the API server no more.
    Partition {
        node: String,
    },
    /// The machine hangs: its kubelet and containers stop, but the cloud still says running,
    /// until someone power-cycles it.
    Hang {
        node: String,
    },
    Heal {
        node: String,
    },
    /// The node's clock (its Lease `renewTime`) runs this far off.
    SkewClock {
        node: String,
        seconds: i64,
    },
    /// The operator marks a node whose machine is off out of service (only then: KEP-2268 asks
    /// the operator to confirm the shutdown first).
    TaintOutOfService {
        node: String,
        time_added: bool,
    },
    UntaintOutOfService {
        node: String,
    },
    /// A fencing agent confirms the machine is off (`nodegrace.io/fenced=<now>`), only when it
    /// is.
    Fence {
        node: String,
    },
    /// A PodDisruptionBudget created or changed (server-side apply), selecting `app`.
    ApplyPdb {
        name: String,
        app: String,
        numbers: Numbers,
    },
    DeletePdb {
        name: String,
    },
    /// A NodeDisruptionBudget created or changed, selecting nodes labelled `label`.
    ApplyNdb {
        name: String,
        label: (String, String),
        numbers: Numbers,
    },
    DeleteNdb {
        name: String,
    },
    /// A pod that must not be evicted (`nodegrace.io/do-not-evict: "true"`) bound to a node.
    CreateDoNotEvictPod {
        name: String,
        node: String,
    },
    /// A pod with a finalizer only the explorer removes.
    CreateFinalizerPod {
        name: String,
        node: String,
    },
    DeletePod {
        name: String,
    },
    RemovePodFinalizer {
        name: String,
    },
    Scale {
        deployment: String,
        replicas: i32,
    },
    /// SIGKILL of a controller replica, and its restart.
    KillReplica {
        program: Program,
        replica: usize,
    },
    StartReplica {
        program: Program,
        replica: usize,
    },
    /// A replica's API traffic cut (its proxy drops every connection), and restored.
    CutReplica {
        program: Program,
        replica: usize,
    },
    RestoreReplica {
        program: Program,
        replica: usize,
    },
    Latency {
        milliseconds: u64,
    },
    /// A share of every request fails (`internalError` 500 or `tooManyRequests` 429).
    ApiErrors {
        rate: f64,
        failure: String,
    },
    CloseWatches,
    Outage {
        seconds: f64,
    },
    ExpireHistory,
    ClearFaults,
    /// A fault between the programs and EC2 (`--provider aws`), until the next heal.
    ProviderFault {
        fault: ProviderFault,
    },
    ProviderHeal,
    /// DescribeInstances does not know the node's machine for `seconds`: EC2's eventual
    /// consistency, shorter than `--instance-not-found-confirm` (`--provider aws`).
    HideMachine {
        node: String,
        seconds: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// From the schedule's start.
    #[serde(serialize_with = "as_seconds")]
    pub at: Duration,
    #[serde(flatten)]
    pub event: Event,
}

fn as_seconds<S: serde::Serializer>(at: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64((at.as_secs_f64() * 1000.0).round() / 1000.0)
}

/// Kinds of events with their weights; a drawn kind becomes one event (and its undoing, where
/// it has one, at a later time).
#[derive(Debug, Clone, Copy)]
enum Kind {
    DeleteNodes,
    ForceRemoveFinalizer,
    RecreateNode,
    PowerCycle,
    TerminateInstance,
    Partition,
    Hang,
    SkewClock,
    Taint,
    Untaint,
    Fence,
    Pdb,
    Ndb,
    DoNotEvict,
    FinalizerPod,
    Scale,
    Kill,
    Cut,
    Fault,
}

const WEIGHTS: [(Kind, u32); 19] = [
    (Kind::DeleteNodes, 10),
    (Kind::ForceRemoveFinalizer, 2),
    (Kind::RecreateNode, 8),
    (Kind::PowerCycle, 8),
    (Kind::TerminateInstance, 2),
    (Kind::Partition, 4),
    (Kind::Hang, 3),
    (Kind::SkewClock, 2),
    (Kind::Taint, 6),
    (Kind::Untaint, 2),
    (Kind::Fence, 3),
    (Kind::Pdb, 5),
    (Kind::Ndb, 5),
    (Kind::DoNotEvict, 4),
    (Kind::FinalizerPod, 3),
    (Kind::Scale, 2),
    (Kind::Kill, 5),
    (Kind::Cut, 4),
    (Kind::Fault, 6),
];

/// About one event every `PACE` on average.
const PACE: Duration = Duration::from_millis(700);

pub fn node(index: usize) -> String {
    format!("node-{index}")
}

/// What the schedule expects the cluster to be, so that it draws events that apply: deletes
/// leave at least two nodes, names come back after their Node went, the operator marks out of
/// service the machines it powered off. Only a guide: what applies is decided at run time.
#[derive(Debug)]
struct Model {
    live: Vec<usize>,
    gone: Vec<usize>,
    off: Vec<usize>,
}

impl Model {
    fn pick(rng: &mut StdRng, from: &[usize]) -> String {
        node(
            from.choose(rng)
                .copied()
                .unwrap_or_else(|| rng.random_range(0..NODES)),
        )
    }
}

/// The schedule of `seed` over `duration`, for a run of `programs` on `provider`'s machines.
/// A provider's faults come from a stream of their own: a seed's cluster history is the same
/// on either provider.
pub fn generate(
    seed: u64,
    duration: Duration,
    programs: &[Program],
    provider: Provider,
) -> Vec<Step> {
    let mut steps = cluster_history(seed, duration, programs);
    let faults = match provider {
        Provider::Sim => return steps,
        Provider::Aws => {
            let mut faults = provider_faults(seed, duration, &steps);
            faults.extend(iam_refusals(seed, duration));
            faults
        }
        Provider::Redfish => draw_windows(
            &mut StdRng::seed_from_u64(seed ^ 0x626d_635f_6661_756c),
            duration,
            &BMC_FAULTS,
            &[
                ProviderFault::Unauthorized,
                ProviderFault::InternalError,
                ProviderFault::ResetIgnored,
                ProviderFault::ResetRefused,
                ProviderFault::NotAnswering,
            ],
        ),
        Provider::ClusterApi => draw_windows(
            &mut StdRng::seed_from_u64(seed ^ 0x6361_7069_5f66_6175),
            duration,
            &MACHINE_API_FAULTS,
            &[
                ProviderFault::MachinesForbidden,
                ProviderFault::MachinesStuck,
            ],
        ),
    };
    steps.extend(faults);
    steps.sort_by_key(|step| step.at);
    steps
}

/// How a provider's faults are drawn: gaps of `pace` times a factor from `spread`, each fault
/// lasting a number of seconds from `lasting`, then healed.
struct Windows {
    pace: Duration,
    spread: std::ops::Range<f64>,
    lasting: std::ops::Range<f64>,
}

/// EC2's throttling, 500s and lost answers: about one every 3 s, 1–6 s each.
const EC2_FAULTS: Windows = Windows {
    pace: Duration::from_secs(3),
    spread: 0.2..1.8,
    lasting: 1.0..6.0,
};
/// IAM refusals: about one every 8 s, 2–8 s each, from a stream of their own, so the other
/// faults of a seed stay as they were drawn before them.
const IAM_REFUSALS: Windows = Windows {
    pace: Duration::from_secs(8),
    spread: 0.3..1.7,
    lasting: 2.0..8.0,
};
/// A BMC's faults: about one every 5 s, 2–8 s each.
const BMC_FAULTS: Windows = Windows {
    pace: Duration::from_secs(5),
    spread: 0.3..1.7,
    lasting: 2.0..8.0,
};
/// Cluster API's faults: about one every 6 s, 2–8 s each.
const MACHINE_API_FAULTS: Windows = Windows {
    pace: Duration::from_secs(6),
    spread: 0.3..1.7,
    lasting: 2.0..8.0,
};

/// Faults drawn from `kinds` over `duration` as `windows` says, each ended by a heal.
fn draw_windows(
    rng: &mut StdRng,
    duration: Duration,
    windows: &Windows,
    kinds: &[ProviderFault],
) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut at = Duration::ZERO;
    loop {
        at += windows
            .pace
            .mul_f64(rng.random_range(windows.spread.clone()));
        if at >= duration {
            break;
        }
        let Some(&fault) = kinds.choose(rng) else {
            break;
        };
        steps.push(Step {
            at,
            event: Event::ProviderFault { fault },
        });
        steps.push(Step {
            at: at + Duration::from_secs_f64(rng.random_range(windows.lasting.clone())),
            event: Event::ProviderHeal,
        });
    }
    steps
}

fn iam_refusals(seed: u64, duration: Duration) -> Vec<Step> {
    let refused = [
        RefusedAction::TerminateInstances,
        RefusedAction::StopInstances,
        RefusedAction::StartInstances,
    ]
    .map(ProviderFault::Refuse);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6961_6d5f_7265_6675);
    draw_windows(&mut rng, duration, &IAM_REFUSALS, &refused)
}

fn provider_faults(seed: u64, duration: Duration, cluster: &[Step]) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6563_325f_6661_756c);
    let mut steps = draw_windows(
        &mut rng,
        duration,
        &EC2_FAULTS,
        &[
            ProviderFault::Throttle,
            ProviderFault::InternalError,
            ProviderFault::LoseAnswers,
        ],
    );
    // A false NotFound matters while termination-controller asks about a machine: after its
    // Node's deletion.
    for step in cluster {
        let Event::DeleteNodes { nodes } = &step.event else {
            continue;
        };
        if rng.random_bool(0.6)
            && let Some(node) = nodes.choose(&mut rng)
        {
            steps.push(Step {
                at: step.at + Duration::from_secs_f64(rng.random_range(0.0..3.0)),
                event: Event::HideMachine {
                    node: node.clone(),
                    seconds: rng.random_range(2..=8),
                },
            });
        }
    }
    steps
}

fn cluster_history(seed: u64, duration: Duration, programs: &[Program]) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut model = Model {
        live: (0..NODES).collect(),
        gone: Vec::new(),
        off: Vec::new(),
    };
    let mut steps = Vec::new();
    let mut at = Duration::ZERO;
    let mut serial = 0_u32;
    loop {
        at += PACE.mul_f64(rng.random_range(0.2..1.8));
        if at >= duration {
            break;
        }
        serial += 1;
        let kind = WEIGHTS
            .choose_weighted(&mut rng, |(_, weight)| *weight)
            .map_or(Kind::DeleteNodes, |(kind, _)| *kind);
        draw(&mut rng, &mut model, kind, at, serial, programs, &mut steps);
    }
    steps.sort_by_key(|step| step.at);
    steps
}

fn draw(
    rng: &mut StdRng,
    model: &mut Model,
    kind: Kind,
    at: Duration,
    serial: u32,
    programs: &[Program],
    steps: &mut Vec<Step>,
) {
    let any_node = |rng: &mut StdRng| node(rng.random_range(0..NODES));
    let later = |rng: &mut StdRng, from: f64, to: f64| {
        at + Duration::from_secs_f64(rng.random_range(from..to))
    };
    let mut push = |at: Duration, event: Event| steps.push(Step { at, event });
    match kind {
        Kind::DeleteNodes => {
            let count = if rng.random_bool(0.25) { 2 } else { 1 };
            let count = count.min(model.live.len().saturating_sub(2)).max(1);
            model.live.sort_by_key(|_| rng.random::<u32>());
            let chosen: Vec<usize> = model.live.iter().copied().take(count).collect();
            if model.live.len() > 2 {
                model.live.retain(|n| !chosen.contains(n));
                model.gone.extend(&chosen);
            }
            let nodes = if chosen.is_empty() {
                vec![any_node(rng)]
            } else {
                chosen.into_iter().map(node).collect()
            };
            push(at, Event::DeleteNodes { nodes });
        }
        Kind::ForceRemoveFinalizer => {
            let node = Model::pick(rng, &model.gone);
            push(at, Event::ForceRemoveFinalizer { node });
        }
        Kind::RecreateNode => {
            let index = model.gone.choose(rng).copied();
            if let Some(index) = index {
                model.gone.retain(|n| *n != index);
                model.live.push(index);
            }
            push(
                at,
                Event::RecreateNode {
                    node: index.map_or_else(|| any_node(rng), node),
                    same_machine: rng.random_bool(0.3),
                },
            );
        }
        Kind::PowerCycle => {
            let node = any_node(rng);
            if let Some(index) = node.strip_prefix("node-").and_then(|i| i.parse().ok()) {
                model.off.push(index);
            }
            push(at, Event::PowerOff { node: node.clone() });
            // Some machines stay off: their nodes must be cleaned and released all the same.
            if rng.random_bool(0.6) {
                let back = later(rng, 4.0, 14.0);
                push(back, Event::PowerOn { node });
            }
        }
        Kind::TerminateInstance => push(
            at,
            Event::TerminateInstance {
                node: any_node(rng),
            },
        ),
        Kind::Partition => {
            let node = any_node(rng);
            push(at, Event::Partition { node: node.clone() });
            let healed = later(rng, 2.0, 10.0);
            push(healed, Event::Heal { node });
        }
        Kind::Hang => push(
            at,
            Event::Hang {
                node: any_node(rng),
            },
        ),
        Kind::SkewClock => {
            let seconds = *[-3600, -30, 30, 3600].choose(rng).unwrap_or(&30);
            push(
                at,
                Event::SkewClock {
                    node: any_node(rng),
                    seconds,
                },
            );
        }
        Kind::Taint => push(
            at,
            Event::TaintOutOfService {
                node: Model::pick(rng, &model.off),
                time_added: rng.random_bool(0.5),
            },
        ),
        Kind::Untaint => push(
            at,
            Event::UntaintOutOfService {
                node: Model::pick(rng, &model.off),
            },
        ),
        Kind::Fence => push(
            at,
            Event::Fence {
                node: Model::pick(rng, &model.off),
            },
        ),
        Kind::Pdb => {
            let name = (*["web", "api", "db"].choose(rng).unwrap_or(&"web")).to_owned();
            if rng.random_bool(0.2) {
                push(at, Event::DeletePdb { name });
            } else {
                let app = if rng.random_bool(0.8) {
                    name.clone()
                } else {
                    (*["web", "api", "db"].choose(rng).unwrap_or(&"web")).to_owned()
                };
                let numbers = numbers(rng, &["0", "1", "2", "50%"], &["1", "2", "3", "60%"]);
                push(at, Event::ApplyPdb { name, app, numbers });
            }
        }
        Kind::Ndb => {
            let name = (*["workers", "zone-a", "zone-b"]
                .choose(rng)
                .unwrap_or(&"workers"))
            .to_owned();
            if rng.random_bool(0.2) {
                push(at, Event::DeleteNdb { name });
            } else {
                let label = match rng.random_range(0..3) {
                    0 => ("pool".to_owned(), "workers".to_owned()),
                    1 => ("zone".to_owned(), "a".to_owned()),
                    _ => ("zone".to_owned(), "b".to_owned()),
                };
                let numbers = numbers(rng, &["0", "1", "2", "40%"], &["1", "2", "3", "60%"]);
                push(
                    at,
                    Event::ApplyNdb {
                        name,
                        label,
                        numbers,
                    },
                );
            }
        }
        Kind::DoNotEvict => {
            let name = format!("pinned-{serial}");
            push(
                at,
                Event::CreateDoNotEvictPod {
                    name: name.clone(),
                    node: any_node(rng),
                },
            );
            let gone = later(rng, 2.0, 12.0);
            push(gone, Event::DeletePod { name });
        }
        Kind::FinalizerPod => {
            let name = format!("held-{serial}");
            push(
                at,
                Event::CreateFinalizerPod {
                    name: name.clone(),
                    node: any_node(rng),
                },
            );
            if rng.random_bool(0.7) {
                let released = later(rng, 2.0, 12.0);
                push(released, Event::RemovePodFinalizer { name });
            }
        }
        Kind::Scale => push(
            at,
            Event::Scale {
                deployment: (*["web", "api"].choose(rng).unwrap_or(&"web")).to_owned(),
                replicas: rng.random_range(2..9),
            },
        ),
        Kind::Kill | Kind::Cut => {
            let Some(&program) = programs.choose(rng) else {
                return;
            };
            let replica = rng.random_range(0..REPLICAS);
            let back = later(rng, 1.0, 8.0);
            if matches!(kind, Kind::Kill) {
                push(at, Event::KillReplica { program, replica });
                push(back, Event::StartReplica { program, replica });
            } else {
                push(at, Event::CutReplica { program, replica });
                push(back, Event::RestoreReplica { program, replica });
            }
        }
        Kind::Fault => {
            let cleared = later(rng, 1.0, 5.0);
            match rng.random_range(0..5) {
                0 => {
                    push(
                        at,
                        Event::Latency {
                            milliseconds: rng.random_range(20..400),
                        },
                    );
                    push(cleared, Event::ClearFaults);
                }
                1 => {
                    let failure = if rng.random_bool(0.5) {
                        "internalError"
                    } else {
                        "tooManyRequests"
                    };
                    push(
                        at,
                        Event::ApiErrors {
                            rate: rng.random_range(0.05..0.4),
                            failure: failure.to_owned(),
                        },
                    );
                    push(cleared, Event::ClearFaults);
                }
                2 => push(at, Event::CloseWatches),
                3 => push(
                    at,
                    Event::Outage {
                        seconds: rng.random_range(0.5..3.0),
                    },
                ),
                _ => push(at, Event::ExpireHistory),
            }
        }
    }
}

fn numbers(rng: &mut StdRng, max_unavailable: &[&str], min_available: &[&str]) -> Numbers {
    if rng.random_bool(0.5) {
        Numbers {
            min_available: None,
            max_unavailable: max_unavailable.choose(rng).map(|n| (*n).to_owned()),
        }
    } else {
        Numbers {
            min_available: min_available.choose(rng).map(|n| (*n).to_owned()),
            max_unavailable: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_schedule_and_another_seed_another() {
        let programs = Programs::All.list();
        let first = generate(7, Duration::from_secs(20), &programs, Provider::Sim);
        assert_eq!(
            first,
            generate(7, Duration::from_secs(20), &programs, Provider::Sim)
        );
        assert_ne!(
            first,
            generate(8, Duration::from_secs(20), &programs, Provider::Sim)
        );
        assert!(first.len() > 10, "{} events", first.len());
        assert!(first.windows(2).all(|pair| pair[0].at <= pair[1].at));
    }

    #[test]
    fn the_provider_adds_its_faults_to_the_same_cluster_history() {
        let programs = Programs::All.list();
        let duration = Duration::from_secs(20);
        let sim = generate(3, duration, &programs, Provider::Sim);
        for provider in [Provider::Aws, Provider::Redfish, Provider::ClusterApi] {
            let faulty = generate(3, duration, &programs, provider);
            let cluster_part: Vec<&Step> = faulty
                .iter()
                .filter(|step| {
                    !matches!(
                        step.event,
                        Event::ProviderFault { .. }
                            | Event::ProviderHeal
                            | Event::HideMachine { .. }
                    )
                })
                .collect();
            assert_eq!(cluster_part, sim.iter().collect::<Vec<_>>(), "{provider:?}");
            assert!(faulty.len() > sim.len(), "{provider:?}");
            assert!(faulty.windows(2).all(|pair| pair[0].at <= pair[1].at));
            assert!(faulty.iter().all(|step| match &step.event {
                Event::HideMachine { seconds, .. } =>
                    provider == Provider::Aws && (2..=8).contains(seconds),
                _ => true,
            }));
        }
    }

    #[test]
    fn a_run_of_one_program_never_touches_the_other() {
        let programs = Programs::Oos.list();
        for seed in 0..20 {
            for step in generate(seed, Duration::from_secs(30), &programs, Provider::Aws) {
                if let Event::KillReplica { program, .. } | Event::CutReplica { program, .. } =
                    step.event
                {
                    assert_eq!(program, Program::OutOfServiceGc);
                }
            }
        }
    }
}
