//! Bare metal: sushy-tools' Redfish emulator, one system per machine, reached by each program
//! through an interposer of its own that adds a BMC's faults (401, 500, a reset refused, a reset
//! taken and never carried out, no answer). A termination on bare metal is a power-off that stays off: the
//! interposer it passed tells termination-controller's `ForceOff` (mirrored as a terminate)
//! from out-of-service-gc's (a fence's power-off).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, Client};
use kube_sim::world::machine_id;
use provider_testbed::interposer::{Forwarding, Interposer, Mode, Seen};
use provider_testbed::sushy::{Sushy, System};

use super::{Act, PROVIDER_TIMEOUT, sim_path, world_path};
use crate::explore::invariants::Instance;
use crate::explore::schedule::{NODES, Program, ProviderFault};
use crate::explore::sim::{Outcome, sim_call, sim_get};
use crate::wait::poll_until;

/// Longer than sushy's fake driver takes to apply a reset (at most 11 s).
const WORLD_ACT_APPLIED: std::time::Duration = std::time::Duration::from_secs(15);

/// Systems racked beyond the first nodes, powered on and waiting, for the machines a run
/// launches (a node registered again on a new machine).
const SPARES: usize = 16;
const SCHEME: &str = "metal:///";

/// One program's way to the BMCs.
struct Path {
    interposer: Interposer,
    /// Its `--redfish-config`.
    config: PathBuf,
}

pub struct BareMetal {
    sushy: Sushy,
    termination: Path,
    fencing: Path,
    systems: Vec<System>,
    /// Systems given to a node so far (the first ones).
    assigned: usize,
}

impl BareMetal {
    pub async fn start(client: &Client) -> Result<Self> {
        let systems: Vec<System> = (0..NODES + SPARES).map(|n| System::new(n, true)).collect();
        let sushy = Sushy::start_plain(&systems).await?;
        let termination = Path::start(&sushy, &systems, "termination-controller").await?;
        termination
            .interposer
            .set_hook(mirror(client.clone(), Program::TerminationController));
        let fencing = Path::start(&sushy, &systems, "out-of-service-gc").await?;
        fencing
            .interposer
            .set_hook(mirror(client.clone(), Program::OutOfServiceGc));
        Ok(Self {
            sushy,
            termination,
            fencing,
            systems,
            assigned: 0,
        })
    }

    /// The next system nobody uses yet.
    pub fn assign(&mut self) -> Result<String> {
        let Some(system) = self.systems.get(self.assigned) else {
            bail!("all {} systems are in use", self.systems.len());
        };
        self.assigned += 1;
        Ok(format!("{SCHEME}{}", system.uuid))
    }

    fn of_this_run(&self, id: &str) -> bool {
        self.systems[..self.assigned]
            .iter()
            .any(|system| system.uuid == id)
    }

    /// The world acts on a machine itself (a person at the console, a power cut): mirrored
    /// first, then asked of the BMC as the test's own.
    pub async fn act(&self, client: &Client, id: &str, act: Act) -> Result<Outcome> {
        ensure!(self.of_this_run(id), "{id} is not a machine of this run");
        let instances: Vec<Instance> =
            serde_json::from_str(&sim_get(client, "/sim/v1/instances").await?)?;
        if instances
            .iter()
            .any(|instance| instance.id == id && instance.state == "terminated")
        {
            return Ok(Outcome::Skipped("its machine is terminated".to_owned()));
        }
        if act == Act::PowerOn && !named_by_a_node(client, id).await? {
            // Off with its Node gone is what a termination on bare metal ends in: nobody
            // powers such a machine on but a person who means to reuse it.
            return Ok(Outcome::Skipped(
                "its Node is gone: the machine is left off".to_owned(),
            ));
        }
        let outcome = sim_call(client, "POST", &world_path(id, act), None).await?;
        let (reset_type, shown) = match act {
            Act::PowerOff | Act::Reclaim => ("ForceOff", "Off"),
            Act::PowerOn => ("On", "On"),
        };
        self.sushy.reset(id, reset_type).await?;
        // sushy's fake driver applies a reset 1 to 11 s after it is asked for. The world's act
        // (a person at the console, a power cut) is over only once the BMC shows it. Otherwise
        // a program could read a state the world had already left: a termination that read Off
        // between a person's power-on and the BMC's would leave the machine running with its
        // Node gone.
        let applied = poll_until(WORLD_ACT_APPLIED, || async {
            self.sushy
                .power_state(id)
                .await
                .is_ok_and(|power| power == shown)
        })
        .await;
        Ok(match (applied, outcome) {
            (false, Outcome::Done(done)) => Outcome::Done(format!(
                "{done}; the BMC did not show {shown} within {}s (a program's reset since?)",
                WORLD_ACT_APPLIED.as_secs()
            )),
            (_, outcome) => outcome,
        })
    }

    /// A fault of the BMCs, seen by both programs.
    pub fn fault(&self, fault: ProviderFault) -> Outcome {
        let mode = match fault {
            ProviderFault::Unauthorized => Mode::Unauthorized,
            ProviderFault::InternalError => Mode::InternalError,
            ProviderFault::ResetIgnored => Mode::Swallow("ComputerSystem.Reset".to_owned()),
            ProviderFault::ResetRefused => Mode::Refuse("ComputerSystem.Reset".to_owned()),
            ProviderFault::NotAnswering => Mode::Hang("/redfish".to_owned()),
            other => return Outcome::Skipped(format!("{other:?} is not a BMC fault")),
        };
        for path in [&self.termination, &self.fencing] {
            path.interposer.set(mode.clone());
        }
        Outcome::Done(format!("BMC {fault:?}"))
    }

    pub fn heal(&self) -> Outcome {
        for path in [&self.termination, &self.fencing] {
            path.interposer.set(Mode::Forward);
        }
        Outcome::Done("the BMCs answer".to_owned())
    }

    pub fn seen(&self) -> Vec<Seen> {
        let mut seen = self.termination.interposer.seen();
        seen.extend(self.fencing.interposer.seen());
        seen
    }

    pub fn traffic(&self) -> String {
        format!(
            "redfish: {} requests from termination-controller, {} from out-of-service-gc, {} failed",
            self.termination.interposer.seen().len(),
            self.fencing.interposer.seen().len(),
            self.termination.interposer.failed() + self.fencing.interposer.failed()
        )
    }

    pub fn args(&self, program: Program) -> Vec<String> {
        let path = match program {
            Program::TerminationController => &self.termination,
            Program::OutOfServiceGc => &self.fencing,
        };
        vec![
            "--instance-provider=redfish".to_owned(),
            format!("--redfish-config={}", path.config.display()),
            format!("--instance-provider-timeout={PROVIDER_TIMEOUT}"),
        ]
    }

    /// Every machine's power as its BMC says it, by providerID. Off reads `terminated`: on
    /// bare metal, off and left off is what a termination ends in.
    pub async fn states(&self) -> Result<BTreeMap<String, String>> {
        let mut states = BTreeMap::new();
        for system in &self.systems[..self.assigned] {
            let power = self.sushy.power_state(&system.uuid).await?;
            let state = if power == "Off" {
                "terminated"
            } else {
                "running"
            };
            states.insert(format!("{SCHEME}{}", system.uuid), state.to_owned());
        }
        Ok(states)
    }
}

/// Whether a Node names the machine `id` now.
async fn named_by_a_node(client: &Client, id: &str) -> Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    Ok(nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|node| {
            node.spec
                .as_ref()
                .and_then(|spec| spec.provider_id.as_deref())
                .and_then(machine_id)
                == Some(id)
        }))
}

impl Path {
    async fn start(sushy: &Sushy, systems: &[System], program: &str) -> Result<Self> {
        let interposer = Interposer::start(&sushy.url).await?;
        let machines: Vec<serde_json::Value> = systems
            .iter()
            .map(|system| {
                serde_json::json!({
                    "providerID": format!("{SCHEME}{}", system.uuid),
                    "endpoint": interposer.url(),
                    "system": system.path(),
                    "credentials": sushy.credentials(),
                })
            })
            .collect();
        let config = sushy.dir.path().join(format!("{program}.yaml"));
        std::fs::write(
            &config,
            serde_json::json!({ "machines": machines }).to_string(),
        )
        .with_context(|| format!("write {}", config.display()))?;
        Ok(Self { interposer, config })
    }
}

/// The hook that mirrors one program's resets into kube-sim's cloud: termination-controller's
/// `ForceOff` is a terminate (invariant 1 counts it), out-of-service-gc's a power-off; `On`
/// powers the machine on.
fn mirror(client: Client, program: Program) -> provider_testbed::interposer::Hook {
    Arc::new(move |forwarding: Forwarding| {
        let client = client.clone();
        Box::pin(async move {
            let Some((system, reset_type)) = forwarding.redfish_reset() else {
                return;
            };
            let Some(id) = machine_id(&format!("{SCHEME}{system}")).map(str::to_owned) else {
                return;
            };
            let (method, path) = match (reset_type.as_str(), program) {
                ("ForceOff", Program::TerminationController) => {
                    ("DELETE", format!("/sim/v1/instances/{id}"))
                }
                ("ForceOff", Program::OutOfServiceGc) => ("POST", sim_path(&id, Act::PowerOff)),
                ("On", _) => ("POST", sim_path(&id, Act::PowerOn)),
                _ => return,
            };
            super::mirror_call(&client, method, &path, &reset_type, &id).await;
        })
    })
}
