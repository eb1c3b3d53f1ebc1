//! The machines under a run's nodes: kube-sim's own cloud (`--provider sim`), or EC2
//! (`--provider aws`): moto's server, reached by the programs through an interposer that adds
//! the cloud's faults. kube-sim's cloud stays the switch of each machine's kubelet, so what
//! reaches moto is mirrored there before moto acts (a terminated or stopped machine's kubelet
//! stops), and the explorer's own cloud-side acts (a power-off, a spot reclaim) go to both.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use kube::Client;
use kube_sim::world::machine_id;
use provider_testbed::interposer::{Forwarding, Interposer, Mode};
use provider_testbed::moto::Moto;
use tokio::time::Instant;

use super::invariants::Instance;
use super::schedule::{Provider, ProviderFault};
use super::setup::zone;
use super::sim::{Outcome, sim_call, sim_get};

/// The region every aws machine of a run is in; zone `a` and `b` nodes in its `a` and `b`.
const REGION: &str = "us-east-1";
/// How long DescribeInstances does not know a machine just launched: EC2's eventual
/// consistency, which AWS documents as "may take a few seconds".
const LAUNCH_LAG: Duration = Duration::from_secs(5);
/// The programs' timeout per provider call: a lost answer costs this long.
const PROVIDER_TIMEOUT: &str = "2s";

/// A cloud-side act on a machine, not a client's call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    PowerOff,
    PowerOn,
    /// A spot reclaim, a console click.
    Reclaim,
}

impl Act {
    fn sim_path(self) -> &'static str {
        match self {
            Self::PowerOff => "power-off",
            Self::PowerOn => "power-on",
            Self::Reclaim => "reclaim",
        }
    }

    fn ec2_action(self) -> &'static str {
        match self {
            Self::PowerOff => "StopInstances",
            Self::PowerOn => "StartInstances",
            Self::Reclaim => "TerminateInstances",
        }
    }
}

pub struct Machines {
    client: Client,
    aws: Option<Aws>,
    /// New machines launched so far (a sim machine's id is numbered by it).
    launched: u32,
}

struct Aws {
    moto: Moto,
    interposer: Interposer,
    /// Every machine of the run, by instance id, with its zone.
    zones: BTreeMap<String, String>,
    /// Machines hidden from DescribeInstances once already: at most once each, so no machine
    /// is ever unknown for longer than one hide (below `--instance-not-found-confirm`).
    hidden: HashSet<String>,
}

impl std::fmt::Debug for Machines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machines")
            .field("aws", &self.aws.as_ref().map(|aws| aws.moto.url.clone()))
            .finish_non_exhaustive()
    }
}

impl Machines {
    /// The cloud of `provider`; for aws, moto and its interposer running, the interposer's
    /// forwarded calls mirrored into kube-sim's cloud.
    pub async fn start(provider: Provider, client: &Client) -> Result<Self> {
        let aws = match provider {
            Provider::Sim => None,
            Provider::Aws => {
                let moto = Moto::start().await?;
                let interposer = Interposer::start(&moto.url).await?;
                interposer.set_hook(mirror(client.clone()));
                Some(Aws {
                    moto,
                    interposer,
                    zones: BTreeMap::new(),
                    hidden: HashSet::new(),
                })
            }
        };
        Ok(Self {
            client: client.clone(),
            aws,
            launched: 0,
        })
    }

    /// kube-sim's own nodes need no machine of ours: `serve --nodes` registers them on
    /// `sim:///node-i`.
    pub fn registers_nodes(&self) -> bool {
        self.aws.is_some()
    }

    /// A machine for node `index` at the start of a run.
    pub async fn first(&mut self, index: usize) -> Result<String> {
        match &mut self.aws {
            None => Ok(format!("sim:///{}", super::schedule::node(index))),
            Some(aws) => aws.launch(index).await,
        }
    }

    /// A new machine for node `index`, registering under a gone name. EC2 does not know it for
    /// its first seconds.
    pub async fn launch(&mut self, index: usize) -> Result<String> {
        self.launched += 1;
        match &mut self.aws {
            None => Ok(format!(
                "sim:///{}-m{}",
                super::schedule::node(index),
                self.launched
            )),
            Some(aws) => {
                let provider_id = aws.launch(index).await?;
                aws.hide(machine_id(&provider_id).unwrap_or_default(), LAUNCH_LAG);
                Ok(provider_id)
            }
        }
    }

    /// The cloud acts on a machine on its own.
    pub async fn act(&self, provider_id: &str, act: Act) -> Result<Outcome> {
        let Some(id) = machine_id(provider_id) else {
            return Ok(Outcome::Skipped("no machine".to_owned()));
        };
        if let Some(aws) = &self.aws {
            ensure!(
                aws.zones.contains_key(id),
                "{id} is not a machine of this run"
            );
            let state = aws.moto.state(REGION, id).await?;
            if state.as_deref() == Some("terminated") {
                return Ok(Outcome::Skipped("its machine is terminated".to_owned()));
            }
            // Mirrored first: a kubelet runs only on a machine that moto also runs.
            let outcome = sim_call(&self.client, "POST", &world_path(id, act), None).await?;
            aws.moto
                .ec2(REGION, act.ec2_action(), &[("InstanceId.1", id)])
                .await?;
            return Ok(outcome);
        }
        sim_call(&self.client, "POST", &world_path(id, act), None).await
    }

    /// Puts a fault between the programs and EC2 (aws only).
    pub fn fault(&self, fault: ProviderFault) -> Outcome {
        let Some(aws) = &self.aws else {
            return Outcome::Skipped("no provider to fault".to_owned());
        };
        aws.interposer.set(match fault {
            ProviderFault::Throttle => Mode::Throttle,
            ProviderFault::InternalError => Mode::InternalError,
            ProviderFault::LoseAnswers => Mode::LoseAnswers,
            ProviderFault::Refuse(action) => Mode::Refuse(action.as_str().to_owned()),
        });
        Outcome::Done(format!("EC2 {fault:?}"))
    }

    pub fn heal(&self) -> Outcome {
        match &self.aws {
            Some(aws) => {
                aws.interposer.set(Mode::Forward);
                Outcome::Done("EC2 answers".to_owned())
            }
            None => Outcome::Skipped("no provider to heal".to_owned()),
        }
    }

    /// DescribeInstances leaves the machine out for `seconds`, once per machine.
    pub fn hide(&mut self, provider_id: &str, seconds: u64) -> Outcome {
        let Some(aws) = &mut self.aws else {
            return Outcome::Skipped("no provider".to_owned());
        };
        let Some(id) = machine_id(provider_id).filter(|id| aws.zones.contains_key(*id)) else {
            return Outcome::Skipped("no machine".to_owned());
        };
        if aws.hidden.contains(id) {
            return Outcome::Skipped("hidden once already".to_owned());
        }
        aws.hide(id, Duration::from_secs(seconds));
        Outcome::Done(format!("EC2 does not know {id} for {seconds} s"))
    }

    /// Every request that reached the interposer (aws only), for invariant 13.
    pub fn provider_requests(&self) -> Vec<provider_testbed::interposer::Seen> {
        self.aws
            .as_ref()
            .map(|aws| aws.interposer.seen())
            .unwrap_or_default()
    }

    /// What reached EC2 in this run (aws only): requests, failed ones, answers that left a
    /// machine out.
    pub fn traffic(&self) -> Option<String> {
        let aws = self.aws.as_ref()?;
        Some(format!(
            "ec2: {} requests, {} failed, {} hid a machine",
            aws.interposer.seen().len(),
            aws.interposer.failed(),
            aws.interposer.hiding_answers()
        ))
    }

    /// The programs' provider flags, and their environment.
    pub fn program_args(&self) -> (Vec<String>, Vec<(String, String)>) {
        let Some(aws) = &self.aws else {
            return (vec!["--instance-provider=sim".to_owned()], Vec::new());
        };
        (
            vec![
                "--instance-provider=aws".to_owned(),
                format!("--aws-endpoint-url={}", aws.interposer.url()),
                format!("--aws-region={REGION}"),
                format!("--instance-provider-timeout={PROVIDER_TIMEOUT}"),
            ],
            vec![
                ("AWS_ACCESS_KEY_ID".to_owned(), "AKIAEXPLORE".to_owned()),
                ("AWS_SECRET_ACCESS_KEY".to_owned(), "explore".to_owned()),
            ],
        )
    }

    /// Every machine's state in the cloud of record (moto for aws), by providerID.
    pub async fn states(&self) -> Result<BTreeMap<String, String>> {
        let Some(aws) = &self.aws else {
            let instances: Vec<Instance> =
                serde_json::from_str(&sim_get(&self.client, "/sim/v1/instances").await?)?;
            return Ok(instances
                .into_iter()
                .map(|instance| (instance.provider_id, instance.state))
                .collect());
        };
        let mut states = BTreeMap::new();
        for (id, zone) in &aws.zones {
            let state = aws.moto.state(REGION, id).await?;
            states.insert(
                format!("aws:///{zone}/{id}"),
                state.unwrap_or_else(|| "not-found".to_owned()),
            );
        }
        Ok(states)
    }
}

impl Aws {
    async fn launch(&mut self, index: usize) -> Result<String> {
        let zone = format!("{REGION}{}", zone(index));
        let ids = self.moto.run_instances(&zone, 1).await?;
        let Some(id) = ids.into_iter().next() else {
            bail!("RunInstances launched nothing in {zone}");
        };
        let provider_id = format!("aws:///{zone}/{id}");
        self.zones.insert(id, zone);
        Ok(provider_id)
    }

    fn hide(&mut self, id: &str, lag: Duration) {
        self.hidden.insert(id.to_owned());
        self.interposer.hide(id, Instant::now() + lag);
    }
}

/// The hook that mirrors the programs' calls reaching moto into kube-sim's cloud. A
/// TerminateInstances counts as a client's terminate call there (invariant 1 judges those),
/// except the retry of a call whose answer was lost: the client could not know it had acted.
fn mirror(client: Client) -> provider_testbed::interposer::Hook {
    let lost_answers: Arc<Mutex<HashSet<String>>> = Arc::default();
    Arc::new(move |forwarding: Forwarding| {
        let client = client.clone();
        let lost_answers = Arc::clone(&lost_answers);
        Box::pin(async move {
            for id in &forwarding.instance_ids {
                let (method, path) = match forwarding.action.as_str() {
                    "TerminateInstances" => {
                        let mut lost = lost_answers.lock().unwrap_or_else(PoisonError::into_inner);
                        let retry = lost.contains(id);
                        if forwarding.answer_lost {
                            lost.insert(id.clone());
                        }
                        if retry {
                            ("POST", sim_path(id, Act::Reclaim))
                        } else {
                            ("DELETE", format!("/sim/v1/instances/{id}"))
                        }
                    }
                    "StopInstances" => ("POST", sim_path(id, Act::PowerOff)),
                    "StartInstances" => ("POST", sim_path(id, Act::PowerOn)),
                    _ => continue,
                };
                // kube-sim's /sim/v1 routes take no injected faults: one call does.
                if let Err(error) = sim_call(&client, method, &path, None).await {
                    eprintln!(
                        "explore: mirroring {} of {id}: {error:#}",
                        forwarding.action
                    );
                }
            }
        })
    })
}

fn sim_path(id: &str, act: Act) -> String {
    format!("/sim/v1/instances/{id}/{}", act.sim_path())
}

/// The world's own act, which kube-sim's power log tells from a program's call (invariant 9).
fn world_path(id: &str, act: Act) -> String {
    format!("{}?by=world", sim_path(id, act))
}
