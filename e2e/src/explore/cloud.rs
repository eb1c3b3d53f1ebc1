//! The machines under a run's nodes, by `--provider`: kube-sim's own cloud (`sim`), EC2 on
//! moto's server (`aws`), bare metal behind sushy-tools' Redfish emulator (`redfish`), or
//! Cluster API Machines (`cluster-api`). The programs reach a provider's server through an
//! interposer that adds its faults. kube-sim's cloud stays the switch of each machine's
//! kubelet, so what a program's call does to a machine is mirrored there before the server
//! acts (a terminated or stopped machine's kubelet stops), and the explorer's own cloud-side
//! acts (a power-off, a spot reclaim) go to both.

mod bare_metal;
mod ec2;
mod machine_api;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use anyhow::Result;
use kube::Client;
use kube_sim::world::machine_id;
use provider_testbed::interposer::Seen;

use super::invariants::Instance;
use super::schedule::{Program, Provider, ProviderFault};
use super::sim::{Outcome, sim_call, sim_get};

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
    provider: Backend,
    /// New machines launched so far (a sim machine's id is numbered by it).
    launched: u32,
}

enum Backend {
    Sim,
    Ec2(ec2::Ec2),
    BareMetal(bare_metal::BareMetal),
    MachineApi(machine_api::MachineApi),
}

impl std::fmt::Debug for Machines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Machines")
            .field("launched", &self.launched)
            .finish_non_exhaustive()
    }
}

impl Machines {
    /// The cloud of `provider`, its server and interposers running; `api` is kube-sim's
    /// address and `dir` the run's.
    pub async fn start(
        provider: Provider,
        client: &Client,
        api: SocketAddr,
        dir: &Path,
    ) -> Result<Self> {
        let provider = match provider {
            Provider::Sim => Backend::Sim,
            Provider::Aws => Backend::Ec2(ec2::Ec2::start(client).await?),
            Provider::Redfish => Backend::BareMetal(bare_metal::BareMetal::start(client).await?),
            Provider::ClusterApi => {
                Backend::MachineApi(machine_api::MachineApi::start(client, api, dir).await?)
            }
        };
        Ok(Self {
            client: client.clone(),
            provider,
            launched: 0,
        })
    }

    /// kube-sim's own nodes need no machine of ours: `serve --nodes` registers them on
    /// `sim:///node-i`.
    pub fn registers_nodes(provider: Provider) -> bool {
        provider != Provider::Sim
    }

    /// A machine for node `index` at the start of a run.
    pub async fn first(&mut self, index: usize) -> Result<String> {
        let node = super::schedule::node(index);
        match &mut self.provider {
            Backend::Sim => Ok(format!("sim:///{node}")),
            Backend::Ec2(ec2) => ec2.launch(index).await,
            Backend::BareMetal(metal) => metal.assign(),
            Backend::MachineApi(machines) => {
                let provider_id = format!("sim:///{node}");
                machines.create(&node, &provider_id).await?;
                Ok(provider_id)
            }
        }
    }

    /// A new machine for node `index`, registering under a gone name. EC2 does not know it for
    /// its first seconds.
    pub async fn launch(&mut self, index: usize) -> Result<String> {
        self.launched += 1;
        let node = super::schedule::node(index);
        let sim_machine = format!("sim:///{node}-m{}", self.launched);
        match &mut self.provider {
            Backend::Sim => Ok(sim_machine),
            Backend::Ec2(ec2) => {
                let provider_id = ec2.launch(index).await?;
                ec2.hide_for(
                    machine_id(&provider_id).unwrap_or_default(),
                    ec2::LAUNCH_LAG,
                );
                Ok(provider_id)
            }
            Backend::BareMetal(metal) => metal.assign(),
            Backend::MachineApi(machines) => {
                machines.create(&node, &sim_machine).await?;
                Ok(sim_machine)
            }
        }
    }

    /// The annotations the provider puts on the Node of `provider_id` (Cluster API's, naming
    /// its Machine).
    pub fn node_annotations(&self, provider_id: &str) -> BTreeMap<String, String> {
        match &self.provider {
            Backend::MachineApi(machines) => machines.node_annotations(provider_id),
            _ => BTreeMap::new(),
        }
    }

    /// The cloud acts on a machine on its own.
    pub async fn act(&self, provider_id: &str, act: Act) -> Result<Outcome> {
        let Some(id) = machine_id(provider_id) else {
            return Ok(Outcome::Skipped("no machine".to_owned()));
        };
        match &self.provider {
            Backend::Ec2(ec2) => ec2.act(&self.client, id, act).await,
            Backend::BareMetal(metal) => metal.act(&self.client, id, act).await,
            Backend::Sim | Backend::MachineApi(_) => {
                sim_call(&self.client, "POST", &world_path(id, act), None).await
            }
        }
    }

    /// Puts a fault between the programs and the provider.
    pub async fn fault(&self, fault: ProviderFault) -> Result<Outcome> {
        Ok(match &self.provider {
            Backend::Sim => Outcome::Skipped("no provider to fault".to_owned()),
            Backend::Ec2(ec2) => ec2.fault(fault),
            Backend::BareMetal(metal) => metal.fault(fault),
            Backend::MachineApi(machines) => machines.fault(fault).await?,
        })
    }

    pub async fn heal(&self) -> Result<Outcome> {
        Ok(match &self.provider {
            Backend::Sim => Outcome::Skipped("no provider to heal".to_owned()),
            Backend::Ec2(ec2) => ec2.heal(),
            Backend::BareMetal(metal) => metal.heal(),
            Backend::MachineApi(machines) => machines.heal().await?,
        })
    }

    /// DescribeInstances leaves the machine out for `seconds`, once per machine (aws only).
    pub fn hide(&mut self, provider_id: &str, seconds: u64) -> Outcome {
        match &mut self.provider {
            Backend::Ec2(ec2) => ec2.hide(provider_id, seconds),
            _ => Outcome::Skipped("no provider that hides machines".to_owned()),
        }
    }

    /// Every request that reached the provider's interposers, for invariant 13.
    pub fn provider_requests(&self) -> Vec<Seen> {
        match &self.provider {
            Backend::Sim => Vec::new(),
            Backend::Ec2(ec2) => ec2.seen(),
            Backend::BareMetal(metal) => metal.seen(),
            Backend::MachineApi(machines) => machines.seen(),
        }
    }

    /// What reached the provider's server in this run.
    pub fn traffic(&self) -> Option<String> {
        match &self.provider {
            Backend::Sim => None,
            Backend::Ec2(ec2) => Some(ec2.traffic()),
            Backend::BareMetal(metal) => Some(metal.traffic()),
            Backend::MachineApi(machines) => Some(machines.traffic()),
        }
    }

    /// `program`'s provider flags, and its environment.
    pub fn program_args(&self, program: Program) -> (Vec<String>, Vec<(String, String)>) {
        match &self.provider {
            Backend::Sim => (vec!["--instance-provider=sim".to_owned()], Vec::new()),
            Backend::Ec2(ec2) => ec2.args(),
            Backend::BareMetal(metal) => (metal.args(program), Vec::new()),
            Backend::MachineApi(machines) => (machines.args(program), Vec::new()),
        }
    }

    /// Every machine's state in the cloud of record (moto for aws, the BMCs for redfish,
    /// kube-sim's cloud otherwise), by providerID.
    pub async fn states(&self) -> Result<BTreeMap<String, String>> {
        match &self.provider {
            Backend::Ec2(ec2) => ec2.states().await,
            Backend::BareMetal(metal) => metal.states().await,
            Backend::Sim | Backend::MachineApi(_) => {
                let instances: Vec<Instance> =
                    serde_json::from_str(&sim_get(&self.client, "/sim/v1/instances").await?)?;
                Ok(instances
                    .into_iter()
                    .map(|instance| (instance.provider_id, instance.state))
                    .collect())
            }
        }
    }
}

/// Mirrors one program call into kube-sim's cloud. kube-sim's `/sim/v1` routes take no
/// injected faults: one call does.
async fn mirror_call(client: &Client, method: &str, path: &str, what: &str, id: &str) {
    if let Err(error) = sim_call(client, method, path, None).await {
        eprintln!("explore: mirroring {what} of {id}: {error:#}");
    }
}

fn sim_path(id: &str, act: Act) -> String {
    format!("/sim/v1/instances/{id}/{}", act.sim_path())
}

/// The world's own act, which kube-sim's power log tells from a program's call (invariant 9).
fn world_path(id: &str, act: Act) -> String {
    format!("{}?by=world", sim_path(id, act))
}
