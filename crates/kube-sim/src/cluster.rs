//! A test cluster with workloads, built once for the controllers' tests, their benches and the
//! explorer alike: nodes, CustomResourceDefinitions, and Deployments under PodDisruptionBudgets,
//! DaemonSets and StatefulSets with claims — created through the API as any client would (so
//! defaults, admission and the world's controllers treat them as theirs), then waited on until
//! every workload says it is ready.
//!
//! ```no_run
//! # async fn example() -> Result<(), kube_sim::cluster::ClusterError> {
//! use kube_sim::cluster::{Cluster, deployment, statefulset};
//! let sim = Cluster::new(3)
//!     .with(deployment("web", 6).budget(serde_json::json!({"maxUnavailable": 1})))
//!     .with(statefulset("db", 1).claim("data", "1Gi"))
//!     .start()
//!     .await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::{KubeSim, SimError, SimOptions, WorldOptions};

/// How long [`Cluster::start`] waits for its workloads by default.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How often readiness is asked for while waiting.
const POLL: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("start the simulator: {0}")]
    Sim(#[from] SimError),
    #[error("create {what}: {source}")]
    Create {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("read {what}: {source}")]
    Read {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{what} not ready within {within:?}")]
    NotReady { what: String, within: Duration },
    #[error("{what}: {source}")]
    Manifest {
        what: String,
        #[source]
        source: serde_json::Error,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Deployment,
    StatefulSet,
    DaemonSet,
}

/// A workload (its pods labelled `app=<name>`) and, if asked, the PodDisruptionBudget over it.
#[derive(Debug, Clone)]
pub struct Workload {
    kind: Kind,
    name: String,
    namespace: String,
    replicas: i32,
    /// The pod template; `app=<name>` and one container named after the workload.
    template: Value,
    budget: Option<Value>,
    claims: Vec<(String, String)>,
}

/// A Deployment of `replicas` pods.
pub fn deployment(name: &str, replicas: i32) -> Workload {
    Workload::new(Kind::Deployment, name, replicas)
}

/// A StatefulSet of `replicas` pods (`<name>-0`, …); give it claims with [`Workload::claim`].
pub fn statefulset(name: &str, replicas: i32) -> Workload {
    Workload::new(Kind::StatefulSet, name, replicas)
}

/// A DaemonSet: a pod on every node it tolerates.
pub fn daemonset(name: &str) -> Workload {
    Workload::new(Kind::DaemonSet, name, 0)
}

impl Workload {
    fn new(kind: Kind, name: &str, replicas: i32) -> Self {
        Self {
            kind,
            name: name.to_owned(),
            namespace: "default".to_owned(),
            replicas,
            template: json!({
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": name, "image": "app"}]},
            }),
            budget: None,
            claims: Vec::new(),
        }
    }

    #[must_use]
    pub fn namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.namespace);
        self
    }

    /// The container's image (its name decides what the world runs, see `ImageRule`).
    #[must_use]
    pub fn image(mut self, image: &str) -> Self {
        self.template["spec"]["containers"][0]["image"] = json!(image);
        self
    }

    /// The container's name (the workload's name unless set).
    #[must_use]
    pub fn container(mut self, name: &str) -> Self {
        self.template["spec"]["containers"][0]["name"] = json!(name);
        self
    }

    /// Merged into the pod template: labels, annotations, tolerations, priority…
    #[must_use]
    pub fn pod(mut self, extra: &Value) -> Self {
        merge(&mut self.template, extra);
        self
    }

    /// How the world times its pods: Ready `ready_after` seconds after they start, gone
    /// `stop` seconds after their deletion (`sim.nodegrace.io/*-seconds`).
    #[must_use]
    pub fn timing(self, ready_after: f64, stop: f64) -> Self {
        self.pod(&json!({"metadata": {"annotations": {
            "sim.nodegrace.io/ready-after-seconds": ready_after.to_string(),
            "sim.nodegrace.io/stop-seconds": stop.to_string(),
        }}}))
    }

    /// A PodDisruptionBudget named after the workload over its pods; `spec` is the rest of
    /// its spec (`{"maxUnavailable": 1}`, `{"minAvailable": 2}`).
    #[must_use]
    pub fn budget(mut self, spec: Value) -> Self {
        self.budget = Some(spec);
        self
    }

    /// A StatefulSet's volume claim template of `size` (ReadWriteOnce), mounted at
    /// `/<name>` in its container.
    #[must_use]
    pub fn claim(mut self, name: &str, size: &str) -> Self {
        self.claims.push((name.to_owned(), size.to_owned()));
        let mounts = &mut self.template["spec"]["containers"][0]["volumeMounts"];
        if !mounts.is_array() {
            *mounts = json!([]);
        }
        if let Some(mounts) = mounts.as_array_mut() {
            mounts.push(json!({"name": name, "mountPath": format!("/{name}")}));
        }
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The workload's own manifest.
    pub fn manifest(&self) -> Value {
        let selector = json!({"matchLabels": {"app": self.name}});
        let metadata = json!({"name": self.name, "namespace": self.namespace});
        let (kind, spec) = match self.kind {
            Kind::Deployment => (
                "Deployment",
                json!({"replicas": self.replicas, "selector": selector, "template": self.template}),
            ),
            Kind::StatefulSet => {
                let claims: Vec<Value> = self
                    .claims
                    .iter()
                    .map(|(name, size)| {
                        json!({"metadata": {"name": name}, "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": size}},
                        }})
                    })
                    .collect();
                (
                    "StatefulSet",
                    json!({"replicas": self.replicas, "serviceName": self.name, "selector": selector,
                        "template": self.template, "volumeClaimTemplates": claims}),
                )
            }
            Kind::DaemonSet => (
                "DaemonSet",
                json!({"selector": selector, "template": self.template}),
            ),
        };
        json!({"apiVersion": "apps/v1", "kind": kind, "metadata": metadata, "spec": spec})
    }

    /// The PodDisruptionBudget's manifest, if it has one.
    pub fn budget_manifest(&self) -> Option<Value> {
        let mut spec = json!({"selector": {"matchLabels": {"app": self.name}}});
        merge(&mut spec, self.budget.as_ref()?);
        Some(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }))
    }

    /// Creates the workload, then its budget.
    pub async fn create(&self, client: &Client) -> Result<(), ClusterError> {
        let (what, manifest) = (self.to_string(), self.manifest());
        match self.kind {
            Kind::Deployment => self.create_as::<Deployment>(client, manifest, &what).await,
            Kind::StatefulSet => self.create_as::<StatefulSet>(client, manifest, &what).await,
            Kind::DaemonSet => self.create_as::<DaemonSet>(client, manifest, &what).await,
        }?;
        if let Some(budget) = self.budget_manifest() {
            let what = format!("the PodDisruptionBudget of {what}");
            self.create_as::<PodDisruptionBudget>(client, budget, &what)
                .await?;
        }
        Ok(())
    }

    async fn create_as<K>(
        &self,
        client: &Client,
        manifest: Value,
        what: &str,
    ) -> Result<(), ClusterError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
        K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        let object: K =
            serde_json::from_value(manifest).map_err(|source| ClusterError::Manifest {
                what: what.to_owned(),
                source,
            })?;
        self.api::<K>(client)
            .create(&PostParams::default(), &object)
            .await
            .map_err(|source| ClusterError::Create {
                what: what.to_owned(),
                source,
            })?;
        Ok(())
    }

    /// Whether every pod the workload wants is Ready, as its status says (what `kubectl
    /// rollout status` reads); a DaemonSet wants at least one.
    pub async fn ready(&self, client: &Client) -> Result<bool, ClusterError> {
        let read = |source| ClusterError::Read {
            what: self.to_string(),
            source,
        };
        Ok(match self.kind {
            Kind::Deployment => {
                let status = self.api::<Deployment>(client).get_status(&self.name).await;
                let status = status.map_err(read)?.status.unwrap_or_default();
                status.ready_replicas.unwrap_or(0) >= self.replicas
            }
            Kind::StatefulSet => {
                let status = self.api::<StatefulSet>(client).get_status(&self.name).await;
                let status = status.map_err(read)?.status.unwrap_or_default();
                status.ready_replicas.unwrap_or(0) >= self.replicas
            }
            Kind::DaemonSet => {
                let status = self.api::<DaemonSet>(client).get_status(&self.name).await;
                let status = status.map_err(read)?.status.unwrap_or_default();
                status.desired_number_scheduled > 0
                    && status.number_ready >= status.desired_number_scheduled
            }
        })
    }

    /// Waits until [`Self::ready`], for at most `within`.
    pub async fn wait_ready(&self, client: &Client, within: Duration) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + within;
        while !self.ready(client).await? {
            if tokio::time::Instant::now() >= deadline {
                return Err(ClusterError::NotReady {
                    what: self.to_string(),
                    within,
                });
            }
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    fn api<K>(&self, client: &Client) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(client.clone(), &self.namespace)
    }
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// A simulator with nodes, CRDs and workloads, started and waited on as one.
#[derive(Debug, Clone)]
pub struct Cluster {
    options: SimOptions,
    crds: Vec<CustomResourceDefinition>,
    workloads: Vec<Workload>,
    ready_within: Duration,
}

impl Cluster {
    /// `nodes` Ready nodes, `node-0` …, and the world's default timings.
    pub fn new(nodes: usize) -> Self {
        Self {
            options: SimOptions {
                nodes,
                ..SimOptions::default()
            },
            crds: Vec::new(),
            workloads: Vec::new(),
            ready_within: READY_WITHIN,
        }
    }

    #[must_use]
    pub fn world(mut self, world: WorldOptions) -> Self {
        self.options.world = world;
        self
    }

    /// The rest of the simulator's options (its `nodes` stay as given to [`Cluster::new`]).
    #[must_use]
    pub fn options(mut self, options: SimOptions) -> Self {
        self.options = SimOptions {
            nodes: self.options.nodes,
            ..options
        };
        self
    }

    #[must_use]
    pub fn crd(mut self, crd: CustomResourceDefinition) -> Self {
        self.crds.push(crd);
        self
    }

    #[must_use]
    pub fn with(mut self, workload: Workload) -> Self {
        self.workloads.push(workload);
        self
    }

    /// How long [`Cluster::start`] waits for the workloads (60 s unless set).
    #[must_use]
    pub fn ready_within(mut self, within: Duration) -> Self {
        self.ready_within = within;
        self
    }

    /// Starts the simulator, creates the CRDs and the workloads, and waits until every
    /// workload is ready.
    pub async fn start(self) -> Result<KubeSim, ClusterError> {
        let sim = KubeSim::start(self.options).await?;
        let client = sim.client();
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in &self.crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crds.create(&PostParams::default(), crd)
                .await
                .map_err(|source| ClusterError::Create {
                    what: format!("CustomResourceDefinition {name}"),
                    source,
                })?;
        }
        for workload in &self.workloads {
            workload.create(&client).await?;
        }
        let deadline = tokio::time::Instant::now() + self.ready_within;
        for workload in &self.workloads {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            workload.wait_ready(&client, left).await?;
        }
        Ok(sim)
    }
}

/// Merges `patch` into `base` as a JSON merge patch would, except that null is a value.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(base), Value::Object(patch)) => {
            for (key, value) in patch {
                merge(base.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (base, patch) => *base = patch.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statefulset_with_a_claim_mounts_it_and_its_budget_selects_its_pods() {
        let db = statefulset("db", 2)
            .image("postgres")
            .claim("data", "1Gi")
            .budget(json!({"maxUnavailable": 1}));
        let manifest = db.manifest();
        assert_eq!(manifest["kind"], "StatefulSet");
        assert_eq!(manifest["spec"]["serviceName"], "db");
        assert_eq!(
            manifest["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
            "1Gi"
        );
        let container = &manifest["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "postgres");
        assert_eq!(container["volumeMounts"][0]["mountPath"], "/data");
        let budget = db.budget_manifest().unwrap();
        assert_eq!(budget["spec"]["maxUnavailable"], 1);
        assert_eq!(budget["spec"]["selector"]["matchLabels"]["app"], "db");
        assert!(deployment("web", 1).budget_manifest().is_none());
    }
}
