//! The proof that each chart's RBAC is what its program needs and no more: for every rule of
//! every Role and ClusterRole a chart installs, a fresh cluster gets the chart with that one rule
//! removed, the chart's scenario is played, and the program's log must show the API server's
//! 403 for a verb and resource of exactly that rule. A rule no scenario needs fails the proof.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::acts::{node_termination, out_of_service};
use crate::chart;
use crate::manifests;
use crate::rbac::{RuleRef, role_of};
use crate::stage::{AGENTS_NAMESPACE, Inputs, Stage};
use crate::timeline::Timeline;
use crate::wait::{poll_for, poll_until};

/// How long a scenario may take to reach the removed rule's 403.
const PROOF_TIMEOUT: Duration = Duration::from_secs(45);

/// A rule as rendered: what a 403 for it names.
#[derive(Debug, Clone)]
pub struct Rule {
    pub at: RuleRef,
    pub namespace: Option<String>,
    pub groups: Vec<String>,
    pub resources: Vec<String>,
    pub names: Vec<String>,
    pub verbs: Vec<String>,
}

impl Rule {
    /// The same grant, wherever it is in its role.
    fn grants_same(&self, other: &Rule) -> bool {
        self.at.role == other.at.role
            && self.namespace == other.namespace
            && self.groups == other.groups
            && self.resources == other.resources
            && self.names == other.names
            && self.verbs == other.verbs
    }

    /// `ClusterRole/x: nodes/status [get, patch]` as the table shows it.
    pub fn describe(&self) -> String {
        let groups: Vec<&str> = self
            .groups
            .iter()
            .map(|g| if g.is_empty() { "core" } else { g.as_str() })
            .collect();
        let names = if self.names.is_empty() {
            String::new()
        } else {
            format!(" named {}", self.names.join(", "))
        };
        format!(
            "{} ({}) {}{names} [{}]",
            self.at.role,
            groups.join(", "),
            self.resources.join(", "),
            self.verbs.join(", ")
        )
    }

    /// The log line that shows the API server refusing this rule's request, if any.
    fn refusal<'a>(&self, log: &'a str) -> Option<&'a str> {
        log.lines().find(|line| {
            let line = line.replace("\\\"", "\"");
            let scoped = self.namespace.as_ref().is_none_or(|namespace| {
                line.contains(&format!("in the namespace \"{namespace}\""))
            });
            scoped
                && self.verbs.iter().any(|verb| {
                    self.resources.iter().any(|resource| {
                        self.groups.iter().any(|group| {
                            line.contains(&format!(
                                "cannot {verb} resource \"{resource}\" in API group \"{group}\""
                            ))
                        })
                    })
                })
        })
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// Every rule of the chart's rendered Roles and ClusterRoles, in order.
pub fn rules_of(chart: &str, objects: &[Value]) -> Vec<Rule> {
    let mut rules = Vec::new();
    for object in objects {
        let Some((role, namespace)) = role_of(object, AGENTS_NAMESPACE) else {
            continue;
        };
        for (index, rule) in object["rules"].as_array().into_iter().flatten().enumerate() {
            rules.push(Rule {
                at: RuleRef {
                    chart: chart.to_owned(),
                    role: role.clone(),
                    index,
                },
                namespace: namespace.clone(),
                groups: strings(&rule["apiGroups"]),
                resources: strings(&rule["resources"]),
                names: strings(&rule["resourceNames"]),
                verbs: strings(&rule["verbs"]),
            });
        }
    }
    rules
}

/// What one rule's run showed.
#[derive(Debug)]
pub struct Proof {
    pub rule: Rule,
    pub scenario: String,
    pub refusal: Option<String>,
    pub took: Duration,
}

/// The values a chart's RBAC depends on beyond its demo values: each variant's own rules (those
/// the demo values do not render) are proven with the variant installed.
fn variants(chart: &str) -> &'static [&'static str] {
    match chart {
        "termination-controller" => &["eviction.api=eviction-request"],
        _ => &[],
    }
}

/// Runs every rule of `chart` (installed with its demo values), then the rules its variants
/// add, and returns what each showed.
pub async fn prove_chart(inputs: &Inputs, chart: &str) -> Result<Vec<Proof>> {
    let rendered = |set: &[String]| -> Result<Vec<Rule>> {
        let values = inputs.values_dir.join(format!("{chart}.values.yaml"));
        let objects = chart::render(
            &inputs.helm,
            &inputs.charts_dir.join(chart),
            chart,
            AGENTS_NAMESPACE,
            &values,
            set,
        )?;
        Ok(rules_of(chart, &objects))
    };
    let demo = rendered(&[])?;
    let mut proofs = prove_rules(inputs, chart, &[], demo.clone()).await?;
    for setting in variants(chart) {
        let set = [(*setting).to_owned()];
        let added: Vec<Rule> = rendered(&set)?
            .into_iter()
            .filter(|rule| !demo.iter().any(|shown| shown.grants_same(rule)))
            .collect();
        proofs.extend(prove_rules(inputs, chart, &set, added).await?);
    }
    Ok(proofs)
}

/// Each of `rules`, removed from `chart` installed with `set`, in a cluster of its own.
async fn prove_rules(
    inputs: &Inputs,
    chart: &str,
    set: &[String],
    rules: Vec<Rule>,
) -> Result<Vec<Proof>> {
    let settings = chart::set_flags(set);
    let mut proofs = Vec::new();
    for (number, rule) in rules.into_iter().enumerate() {
        let mut run = inputs.clone();
        run.charts = vec![chart.to_owned()];
        run.without_rule = Some(rule.at.clone());
        run.values_set = set.to_vec();
        run.work_dir = inputs.work_dir.join(format!(
            "{chart}{}-{number}",
            settings.replace([' ', '=', '.'], "-")
        ));
        println!(
            "\n==> least privilege: {chart}{settings} without {}",
            rule.describe()
        );
        let started = Instant::now();
        let mut stage = Stage::build(&run, Timeline::new()).await?;
        let refusal = play_until_refused(&mut stage, chart, &rule).await?;
        stage.tear_down();
        let scenario = if settings.is_empty() {
            scenario_name(chart).to_owned()
        } else {
            format!("with{settings}: {}", scenario_name(chart))
        };
        proofs.push(Proof {
            rule,
            scenario,
            refusal,
            took: started.elapsed(),
        });
    }
    Ok(proofs)
}

/// Plays the chart's scenario while watching its pods' logs for the rule's 403.
async fn play_until_refused(stage: &mut Stage, chart: &str, rule: &Rule) -> Result<Option<String>> {
    let client = stage.client().clone();
    let refused = poll_for(PROOF_TIMEOUT, || refusal(&client, chart, rule));
    tokio::pin!(refused);
    let played = play(stage, chart);
    tokio::pin!(played);
    let mut playing = true;
    loop {
        tokio::select! {
            found = &mut refused => return Ok(found),
            outcome = &mut played, if playing => {
                if let Err(error) = outcome {
                    println!("(the scenario stopped: {error:#})");
                }
                playing = false;
            }
        }
    }
}

async fn refusal(client: &Client, chart: &str, rule: &Rule) -> Option<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), AGENTS_NAMESPACE);
    let listed = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={chart}")))
        .await
        .ok()?;
    for pod in listed.items {
        let name = pod.metadata.name.unwrap_or_default();
        // A program that exits on the refusal is read from its previous container's log.
        for previous in [false, true] {
            let params = LogParams {
                previous,
                ..LogParams::default()
            };
            if let Ok(log) = pods.logs(&name, &params).await
                && let Some(line) = rule.refusal(&log)
            {
                return Some(refusal_message(line));
            }
        }
    }
    None
}

/// The refusal as the API server words it: `User "…" cannot <verb> resource "…" in API group
/// "…" at the cluster scope` (or `in the namespace "…"`).
fn refusal_message(line: &str) -> String {
    let line = line.replace("\\\"", "\"");
    let Some(start) = line.find("User \"") else {
        return line.trim().to_owned();
    };
    let rest = &line[start..];
    let end = ["at the cluster scope", "in the namespace \""]
        .iter()
        .filter_map(|scope| rest.find(scope).map(|at| (at, *scope)))
        .min()
        .map_or(rest.len(), |(at, scope)| {
            let after = at + scope.len();
            if scope.ends_with('"') {
                rest[after..]
                    .find('"')
                    .map_or(rest.len(), |close| after + close + 1)
            } else {
                after
            }
        });
    rest[..end].to_owned()
}

fn scenario_name(chart: &str) -> &'static str {
    match chart {
        "shutdown-inhibitor-agent" => {
            "install; a Lease backup/node-1 is taken (act lease-blocks-shutdown)"
        }
        "graceful-shutdown-agent" => {
            "install; node-1 powers off through logind (act priority-shutdown)"
        }
        "out-of-service-gc" => {
            "install; the ledger and a pod tolerating the taint with a claim run on node-2, node-2 loses power, is tainted out-of-service, boots again (act out-of-service)"
        }
        _ => {
            "install; the fleet (PDBs, an NDB) and a pod tolerating the disrupted taint with a claim run on node-2, `kubectl delete node node-2` (act node-termination)"
        }
    }
}

/// A pod with a volume claim that stays on node-2 through a drain and an out-of-service
/// cleanup (it tolerates both taints): the programs read its claim to keep its volume attached.
async fn keeper_on_node_2(client: &Client) -> Result<()> {
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "keeper", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    });
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "keeper", "namespace": "default"},
        "spec": {
            "nodeName": "node-2",
            "tolerations": [
                {"key": "node.kubernetes.io/out-of-service", "operator": "Exists"},
                {"key": "nodegrace.io/disrupted", "operator": "Exists"},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
            ],
            "containers": [{"name": "keeper", "image": "keeper"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "keeper"}}],
        },
    });
    for object in [claim, pod] {
        manifests::create(client, &object, "default").await?;
    }
    Ok(())
}

/// The chart's scenario, without judging its outcome (the proof judges the 403): each step
/// waits for what the next needs, briefly, and goes on regardless.
async fn play(stage: &mut Stage, chart: &str) -> Result<()> {
    let client = stage.client().clone();
    match chart {
        "shutdown-inhibitor-agent" => {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": "node-1"},
                "spec": {"holderIdentity": "backup-job", "acquireTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()},
            }))?;
            Api::<Lease>::namespaced(client, "backup")
                .create(&PostParams::default(), &lease)
                .await?;
        }
        "graceful-shutdown-agent" => {
            // The agent takes its lock once it runs; without it logind would not wait.
            let logind = stage.node("node-1")?.logind()?;
            poll_until(Duration::from_secs(10), || async {
                logind
                    .list_inhibitors()
                    .await
                    .is_ok_and(|rows| rows.iter().any(|row| row.3 == "delay"))
            })
            .await;
            logind.power_off().await?;
        }
        "out-of-service-gc" => {
            keeper_on_node_2(&client).await?;
            for object in manifests::parse_documents(out_of_service::LEDGER)? {
                manifests::create(&client, &object, "default").await?;
            }
            // Each step's outcome is the proof's to judge: a wait that times out goes on.
            let _ = out_of_service::running_ledger(&client, |node| node == "node-2").await;
            stage.power_off("node-2").await?;
            let _ = out_of_service::wait_not_ready(&client).await;
            out_of_service::taint_out_of_service(&client).await?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), "payments");
            poll_until(Duration::from_secs(10), || async {
                pods.list(&ListParams::default()).await.is_ok_and(|listed| {
                    !listed.items.iter().any(|pod| {
                        pod.spec.as_ref().and_then(|spec| spec.node_name.as_deref())
                            == Some("node-2")
                    })
                })
            })
            .await;
            stage.power_on("node-2").await?;
        }
        _ => {
            keeper_on_node_2(&client).await?;
            for object in manifests::parse_documents(node_termination::FLEET)? {
                manifests::create(&client, &object, "default").await?;
            }
            let _ = node_termination::wait_pods_on_node(&client).await;
            // Deleted before the controller put its finalizer on it, the node would just go.
            let nodes: Api<Node> = Api::all(client);
            poll_until(Duration::from_secs(15), || async {
                nodes.get("node-2").await.is_ok_and(|node| {
                    node.metadata
                        .finalizers
                        .is_some_and(|f| f.iter().any(|f| f == "nodegrace.io/termination"))
                })
            })
            .await;
            nodes.delete("node-2", &DeleteParams::default()).await?;
        }
    }
    Ok(())
}

/// The rule → scenario table (markdown), and whether every rule was shown needed.
pub fn table(proofs: &[Proof]) -> (String, bool) {
    let mut out = String::from(
        "| chart | rule removed | scenario | the 403 in the program's log |\n|---|---|---|---|\n",
    );
    let mut all = true;
    for proof in proofs {
        let shown = proof.refusal.as_deref().map_or_else(
            || {
                all = false;
                format!(
                    "**none within {}s: the rule is not needed by this scenario**",
                    PROOF_TIMEOUT.as_secs()
                )
            },
            |message| format!("`{}`", message.replace('|', "\\|")),
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {shown} |",
            proof.rule.at.chart,
            proof.rule.describe().replace('|', "\\|"),
            proof.scenario
        );
    }
    (out, all)
}
