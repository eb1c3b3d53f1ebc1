//! The NodeDisruptionBudget API (`nodedisruptionbudgets.nodegrace.io/v1alpha1`) and the names
//! this controller writes onto nodes and reads from pods.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::member::Member;

/// Holds a managed Node until its machine is terminated.
pub const FINALIZER: &str = "nodegrace.io/termination";
/// Keeps new pods off a node being drained (with `spec.unschedulable`).
pub const DISRUPTED_TAINT: &str = "nodegrace.io/disrupted";
/// Takes the node out of external load balancers' backends (service controller).
pub const EXCLUDE_FROM_LOAD_BALANCERS: &str =
    "node.kubernetes.io/exclude-from-external-load-balancers";
/// Node annotations `pre-drain.nodegrace.io/<name>`: the node waits before its cordon until
/// every one is removed (by the controller `<name>` stands for).
pub const PRE_DRAIN_HOOK_PREFIX: &str = "pre-drain.nodegrace.io/";
/// Node annotations `pre-terminate.nodegrace.io/<name>`: the machine is not terminated until
/// every one is removed.
pub const PRE_TERMINATE_HOOK_PREFIX: &str = "pre-terminate.nodegrace.io/";
/// On a pod, as a label or an annotation: `"true"` never evicts it, a duration (`"30m"`) not
/// before that long after it started. The node waits for such pods to be gone.
pub const DO_NOT_EVICT: &str = "nodegrace.io/do-not-evict";

/// A PodDisruptionBudget for nodes: how many of the nodes it selects must stay available while
/// nodes are deleted. A node being deleted waits until every budget selecting it grants its
/// disruption.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "nodegrace.io",
    version = "v1alpha1",
    kind = "NodeDisruptionBudget",
    shortname = "ndb",
    status = "NodeDisruptionBudgetStatus",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Min Available","type":"string","jsonPath":".spec.minAvailable"}"#,
    printcolumn = r#"{"name":"Max Unavailable","type":"string","jsonPath":".spec.maxUnavailable"}"#,
    printcolumn = r#"{"name":"Allowed Disruptions","type":"integer","jsonPath":".status.disruptionsAllowed"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("has(self.minAvailable) != has(self.maxUnavailable)").message("set exactly one of spec.minAvailable and spec.maxUnavailable"))]
#[x_kube(validation = Rule::new("!has(self.maxPerWindow) || (has(self.windows) && size(self.windows) > 0)").message("spec.maxPerWindow needs spec.windows"))]
#[x_kube(validation = Rule::new("!has(self.windows) || self.windows.all(w, w.schedule.matches('^ *[^ ]+( +[^ ]+){4} *$'))").message("spec.windows[*].schedule must be a cron expression of five fields, such as \"0 2 * * 1-5\""))]
#[x_kube(validation = Rule::new("!has(self.windows) || self.windows.all(w, w.duration.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$'))").message("spec.windows[*].duration must be a duration such as \"3h\" or \"90m\""))]
#[serde(rename_all = "camelCase")]
pub struct NodeDisruptionBudgetSpec {
    /// The nodes this budget covers. Unlike a PodDisruptionBudget's, a null or an empty
    /// selector selects no nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// How many of the selected nodes (a number, or a percentage rounded up) must stay
    /// available after a disruption. Exactly one of minAvailable and maxUnavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<IntOrString>,
    /// How many of the selected nodes (a number, or a percentage rounded up) may be
    /// unavailable after a disruption. Exactly one of minAvailable and maxUnavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// When set, a Ready node of this budget starts its disruption only inside one of these
    /// windows (a disruption started inside one finishes after it closes). NotReady nodes are
    /// not held: they take nothing from availability.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<MaintenanceWindow>,
    /// At most this many disruptions of Ready nodes start in one window. Needs windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_window: Option<i32>,
}

/// A recurring maintenance window.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// When each window opens: a cron expression of five fields (minute hour day-of-month
    /// month day-of-week), such as "0 2 * * 1-5" for 02:00 on weekdays. A start in the hour
    /// skipped by a daylight-saving change opens right after it; one in a repeated hour opens
    /// once.
    pub schedule: String,
    /// How long each window stays open, such as "3h" or "90m".
    pub duration: String,
    /// The IANA time zone the schedule is read in, such as "Europe/Berlin". UTC when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
}

/// The maintenance window open now, and what it has started.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ActiveWindow {
    /// When this window opened.
    pub start: Time,
    /// When it closes.
    pub end: Time,
    /// Disruptions of Ready nodes granted in it (counted against maxPerWindow).
    #[serde(default)]
    pub disruptions_started: i32,
}

/// Observed like a PodDisruptionBudget's status. Grants are recorded in `disruptedNodes`
/// through updates that carry the resourceVersion, so two writers never take the same unit.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeDisruptionBudgetStatus {
    /// The generation of the spec these numbers were computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes the selector selects.
    #[serde(default)]
    pub expected_nodes: i32,
    /// Selected nodes that are Ready and not disrupted.
    #[serde(default)]
    pub current_available: i32,
    /// How many must stay available.
    #[serde(default)]
    pub desired_available: i32,
    /// How many more nodes may be disrupted now.
    #[serde(default)]
    pub disruptions_allowed: i32,
    /// The grants: node name → the Node object (by UID) granted and when. A grant ends when
    /// that object is gone (or, for a node that was never deleted, two minutes after it was
    /// given); it never passes to a namesake.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub disrupted_nodes: BTreeMap<String, Grant>,
    /// The maintenance window open now (with windows set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_window: Option<ActiveWindow>,
    /// When the next maintenance window opens (with windows set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_window: Option<Time>,
    /// `DisruptionAllowed`: True when a disruption may be granted now; False with reason
    /// `InsufficientNodes`, `OutsideMaintenanceWindow`, `MaintenanceWindowSpent` or
    /// `InvalidSpec`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// One node's grant: which Node object it is for, and when it was given.
#[derive(Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Grant {
    /// The UID of the Node granted: a namesake created later is not granted by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// When the disruption was granted.
    pub granted_at: Time,
}

impl Grant {
    /// Whether this grant is for `node` (name already matched). A grant written before grants
    /// carried a UID (a bare time) counts for a node created before it was given: a namesake
    /// registered later cannot have been its subject.
    pub fn is_for(&self, node: &impl Member) -> bool {
        match &self.uid {
            Some(uid) => node.uid() == Some(uid.as_str()),
            None => node
                .created()
                .is_some_and(|created| created <= self.granted_at.0),
        }
    }
}

impl<'de> Deserialize<'de> for Grant {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Stored {
            Current {
                #[serde(default)]
                uid: Option<String>,
                #[serde(rename = "grantedAt")]
                granted_at: Time,
            },
            /// v0.1's bare grant time.
            Legacy(Time),
        }
        Ok(match Stored::deserialize(deserializer)? {
            Stored::Current { uid, granted_at } => Self { uid, granted_at },
            Stored::Legacy(granted_at) => Self {
                uid: None,
                granted_at,
            },
        })
    }
}

impl NodeDisruptionBudget {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn grants(&self) -> Option<&BTreeMap<String, Grant>> {
        self.status.as_ref().map(|status| &status.disrupted_nodes)
    }

    /// Whether this budget has granted `node` (this Node object, not a namesake).
    pub fn has_granted(&self, node: &impl Member) -> bool {
        granted_in(self.grants(), node)
    }
}

/// Whether `grants` (a budget's, by node name) hold one for `node`, this Node object.
pub fn granted_in(grants: Option<&BTreeMap<String, Grant>>, node: &impl Member) -> bool {
    grants
        .and_then(|grants| grants.get(node.facts().name))
        .is_some_and(|grant| grant.is_for(node))
}

/// What the drain does with the pods a NodeDrainRule selects, on the nodes it selects.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "nodegrace.io",
    version = "v1alpha1",
    kind = "NodeDrainRule",
    shortname = "ndr",
    derive = "PartialEq",
    printcolumn = r#"{"name":"Behavior","type":"string","jsonPath":".spec.drain.behavior"}"#,
    printcolumn = r#"{"name":"Order","type":"integer","jsonPath":".spec.drain.order"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(validation = Rule::new("self.drain.behavior == 'Drain' || !has(self.drain.order)").message("spec.drain.order applies only to behavior Drain"))]
#[serde(rename_all = "camelCase")]
pub struct NodeDrainRuleSpec {
    /// What happens to the selected pods.
    pub drain: DrainSettings,
    /// The nodes the rule applies to: a node matches when any term does. Empty: every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeSelectorTerm>,
    /// The pods the rule applies to: a pod matches when any term does. Empty: every pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<PodSelectorTerm>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainSettings {
    /// Drain: evicted, in `order`. Skip: never evicted and not waited for (it goes with the
    /// machine). WaitCompleted: never evicted; the drain waits for it to finish.
    pub behavior: DrainBehavior,
    /// With Drain: within its tier, pods of a lower order are gone before those of a higher
    /// order are evicted. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<i32>,
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum DrainBehavior {
    #[default]
    Drain,
    Skip,
    WaitCompleted,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    /// The nodes' labels. Null or empty: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSelectorTerm {
    /// The pods' labels. Null or empty: every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// The labels of the pods' namespaces. Null or empty: every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// On a pod, as a label or an annotation (the label wins): `skip` or `wait-completed` overrides
/// every NodeDrainRule for it; another value reads as `wait-completed` (the safe reading of a
/// typo: the pod is never evicted).
pub const DRAIN_OVERRIDE: &str = "nodegrace.io/drain";

impl NodeDrainRule {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

/// The CRDs as the chart installs them (`cargo xtask crd` writes them there).
pub fn crds_yaml() -> Vec<(&'static str, String)> {
    vec![
        ("nodedisruptionbudgets.nodegrace.io.yaml", crd_yaml()),
        ("nodedrainrules.nodegrace.io.yaml", drain_rule_crd_yaml()),
    ]
}

/// The NodeDrainRule CRD as the chart installs it.
pub fn drain_rule_crd_yaml() -> String {
    use kube::CustomResourceExt;
    described(
        NodeDrainRule::crd(),
        "What the drain of a deleted node does with the pods it selects: evict them in an order \
         within their tier, skip them, or wait for them to finish.",
        "The nodes and pods the rule applies to, and what the drain does with those pods.",
    )
}

/// `crd` with its own words for the object and its spec: the derive describes the object as
/// "Auto-generated derived type …" and gives the spec the type's words, and `kubectl explain`
/// shows these to users.
fn described(
    mut crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    object: &str,
    spec: &str,
) -> String {
    for version in &mut crd.spec.versions {
        let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|schema| schema.open_api_v3_schema.as_mut())
        else {
            continue;
        };
        schema.description = Some(object.to_owned());
        if let Some(properties) = schema
            .properties
            .as_mut()
            .and_then(|properties| properties.get_mut("spec"))
        {
            properties.description = Some(spec.to_owned());
        }
    }
    let body = serde_yaml_ng::to_string(&crd).unwrap_or_default();
    format!(
        "# Generated from crates/termination-controller/src/api.rs by `cargo xtask crd`; do not edit.\n{body}"
    )
}

/// The CRD as the chart installs it (`cargo xtask crd` writes it there).
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    described(
        NodeDisruptionBudget::crd(),
        "A PodDisruptionBudget for nodes: how many of the nodes it selects must stay available \
         while nodes are deleted. A node being deleted waits until every budget selecting it \
         grants its disruption.",
        "Which nodes the budget covers, and how many of them must stay available (or may be \
         unavailable) at once.",
    )
}
