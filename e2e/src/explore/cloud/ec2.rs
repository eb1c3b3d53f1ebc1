//! EC2 on moto's server, reached by the programs through an interposer that adds the cloud's
//! faults: throttling, 500s, lost answers, IAM refusals, machines not yet known.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use kube::Client;
use kube_sim::world::machine_id;
use provider_testbed::interposer::{Forwarding, Interposer, Mode, Seen};
use provider_testbed::moto::Moto;
use tokio::time::Instant;

use super::{Act, PROVIDER_TIMEOUT, sim_path, world_path};
use crate::explore::schedule::ProviderFault;
use crate::explore::setup::zone;
use crate::explore::sim::{Outcome, sim_call};

/// The region every aws machine of a run is in; zone `a` and `b` nodes in its `a` and `b`.
const REGION: &str = "us-east-1";
/// How long DescribeInstances does not know a machine just launched: EC2's eventual
/// consistency, which AWS documents as "may take a few seconds".
pub const LAUNCH_LAG: Duration = Duration::from_secs(5);

pub struct Ec2 {
    moto: Moto,
    interposer: Interposer,
    /// Every machine of the run, by instance id, with its zone.
    zones: BTreeMap<String, String>,
    /// Machines hidden from DescribeInstances once already: at most once each, so no machine
    /// is ever unknown for longer than one hide (below `--instance-not-found-confirm`).
    hidden: HashSet<String>,
}

impl Ec2 {
    /// moto and its interposer running, the interposer's forwarded calls mirrored into
    /// kube-sim's cloud.
    pub async fn start(client: &Client) -> Result<Self> {
        let moto = Moto::start().await?;
        let interposer = Interposer::start(&moto.url).await?;
        interposer.set_hook(mirror(client.clone()));
        Ok(Self {
            moto,
            interposer,
            zones: BTreeMap::new(),
            hidden: HashSet::new(),
        })
    }

    pub async fn launch(&mut self, index: usize) -> Result<String> {
        let zone = format!("{REGION}{}", zone(index));
        let ids = self.moto.run_instances(&zone, 1).await?;
        let Some(id) = ids.into_iter().next() else {
            bail!("RunInstances launched nothing in {zone}");
        };
        let provider_id = format!("aws:///{zone}/{id}");
        self.zones.insert(id, zone);
        Ok(provider_id)
    }

    pub fn hide_for(&mut self, id: &str, lag: Duration) {
        self.hidden.insert(id.to_owned());
        self.interposer.hide(id, Instant::now() + lag);
    }

    /// The cloud acts on a machine on its own: mirrored first, as a kubelet runs only on a
    /// machine that moto also runs.
    pub async fn act(&self, client: &Client, id: &str, act: Act) -> Result<Outcome> {
        ensure!(
            self.zones.contains_key(id),
            "{id} is not a machine of this run"
        );
        let state = self.moto.state(REGION, id).await?;
        if state.as_deref() == Some("terminated") {
            return Ok(Outcome::Skipped("its machine is terminated".to_owned()));
        }
        let outcome = sim_call(client, "POST", &world_path(id, act), None).await?;
        self.moto
            .ec2(REGION, act.ec2_action(), &[("InstanceId.1", id)])
            .await?;
        Ok(outcome)
    }

    pub fn fault(&self, fault: ProviderFault) -> Outcome {
        let mode = match fault {
            ProviderFault::Throttle => Mode::Throttle,
            ProviderFault::InternalError => Mode::InternalError,
            ProviderFault::LoseAnswers => Mode::LoseAnswers,
            ProviderFault::Refuse(action) => Mode::Refuse(action.as_str().to_owned()),
            other => return Outcome::Skipped(format!("{other:?} is not an EC2 fault")),
        };
        self.interposer.set(mode);
        Outcome::Done(format!("EC2 {fault:?}"))
    }

    pub fn heal(&self) -> Outcome {
        self.interposer.set(Mode::Forward);
        Outcome::Done("EC2 answers".to_owned())
    }

    /// DescribeInstances leaves the machine out for `seconds`, once per machine.
    pub fn hide(&mut self, provider_id: &str, seconds: u64) -> Outcome {
        let Some(id) = machine_id(provider_id).filter(|id| self.zones.contains_key(*id)) else {
            return Outcome::Skipped("no machine".to_owned());
        };
        if self.hidden.contains(id) {
            return Outcome::Skipped("hidden once already".to_owned());
        }
        let id = id.to_owned();
        self.hide_for(&id, Duration::from_secs(seconds));
        Outcome::Done(format!("EC2 does not know {id} for {seconds} s"))
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.interposer.seen()
    }

    pub fn traffic(&self) -> String {
        format!(
            "ec2: {} requests, {} failed, {} hid a machine",
            self.interposer.seen().len(),
            self.interposer.failed(),
            self.interposer.hiding_answers()
        )
    }

    /// Both programs' flags and environment.
    pub fn args(&self) -> (Vec<String>, Vec<(String, String)>) {
        (
            vec![
                "--instance-provider=aws".to_owned(),
                format!("--aws-endpoint-url={}", self.interposer.url()),
                format!("--aws-region={REGION}"),
                format!("--instance-provider-timeout={PROVIDER_TIMEOUT}"),
            ],
            vec![
                ("AWS_ACCESS_KEY_ID".to_owned(), "AKIAEXPLORE".to_owned()),
                ("AWS_SECRET_ACCESS_KEY".to_owned(), "explore".to_owned()),
            ],
        )
    }

    /// Every machine's state as moto says it, by providerID.
    pub async fn states(&self) -> Result<BTreeMap<String, String>> {
        let mut states = BTreeMap::new();
        for (id, zone) in &self.zones {
            let state = self.moto.state(REGION, id).await?;
            states.insert(
                format!("aws:///{zone}/{id}"),
                state.unwrap_or_else(|| "not-found".to_owned()),
            );
        }
        Ok(states)
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
                super::mirror_call(&client, method, &path, &forwarding.action, id).await;
            }
        })
    })
}
