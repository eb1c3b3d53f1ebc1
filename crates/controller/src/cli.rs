//! The options of the cluster-wide controllers: leader election and who answers for the
//! machines behind nodes, beside every program's common ones.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use nodegrace_core::cli::{CommonArgs, KubeArgs, duration_flag};

use crate::instances::aws::{AwsOptions, AwsSetupError};
use crate::instances::redfish::RedfishSetupError;
use crate::instances::{
    AwsInstances, ClusterApiInstances, ExecInstances, InstanceProvider, RedfishInstances,
    SimInstances,
};
use crate::leader::LeaderConfig;

/// The options of a cluster-wide controller: the common ones, leader election, and who
/// answers for the machines.
#[derive(Debug, Clone, Args)]
pub struct ControllerArgs<const ADMIN_PORT: u16> {
    #[command(flatten)]
    pub common: CommonArgs<ADMIN_PORT>,
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub instances: InstanceArgs,
}

/// For the cluster-wide controllers: leader election on a Lease, so one replica acts at a time.
#[derive(Debug, Clone, Args)]
pub struct LeaderArgs {
    /// Elect a leader among the replicas; only the leader acts. Off: this replica always acts
    /// (run one replica only).
    #[arg(long, env = "NODEGRACE_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the election Lease; in a pod, set it to the pod's namespace.
    #[arg(
        long,
        env = "NODEGRACE_LEADER_ELECTION_NAMESPACE",
        default_value = "kube-system"
    )]
    pub leader_election_namespace: String,
    /// Name of the election Lease (default: the program's name).
    #[arg(long, env = "NODEGRACE_LEADER_ELECTION_LEASE_NAME")]
    pub leader_election_lease_name: Option<String>,
    /// This replica's name in the Lease (default: the host name, which in a pod is its name).
    #[arg(long, env = "NODEGRACE_LEADER_ELECTION_IDENTITY")]
    pub leader_election_identity: Option<String>,
    /// How long a leader's claim lasts without renewal (a duration, whole seconds: 15s).
    #[arg(long, env = "NODEGRACE_LEADER_ELECTION_LEASE_DURATION", default_value = "15s", value_parser = duration_flag)]
    pub leader_election_lease_duration: Duration,
    /// How long before its claim expires the leader renews it (a duration, whole seconds: 5s).
    #[arg(long, env = "NODEGRACE_LEADER_ELECTION_RENEW_MARGIN", default_value = "5s", value_parser = duration_flag)]
    pub leader_election_renew_margin: Duration,
}

impl LeaderArgs {
    /// The election to join, or `None` when leader election is off.
    pub fn config(&self, program: &str) -> Option<LeaderConfig> {
        let Self {
            leader_elect,
            leader_election_namespace,
            leader_election_lease_name,
            leader_election_identity,
            leader_election_lease_duration,
            leader_election_renew_margin,
        } = self;
        leader_elect.then(|| LeaderConfig {
            namespace: leader_election_namespace.clone(),
            lease_name: leader_election_lease_name
                .clone()
                .unwrap_or_else(|| program.to_owned()),
            identity: leader_election_identity.clone().unwrap_or_else(host_name),
            lease_duration_seconds: leader_election_lease_duration.as_secs(),
            renew_margin_seconds: leader_election_renew_margin.as_secs(),
        })
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "unknown".to_owned(), |name| name.trim().to_owned())
}

/// Where the machines behind nodes are asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InstanceProviderKind {
    /// No provider: nothing is confirmed or terminated through a cloud.
    None,
    /// kube-sim's cloud (`/sim/v1/instances` on the API server's address).
    Sim,
    /// A command: `<command> state <providerID> <node>` prints running, stopping, stopped,
    /// terminated or not-found; `<command> terminate <providerID> <node>` exits 0 once the cloud
    /// accepted.
    Exec,
    /// AWS EC2 (`aws:///<zone>/<instance-id>`), with the credentials a pod gets (IRSA, EKS Pod
    /// Identity, or static keys).
    Aws,
    /// Cluster API: the Machine a node's annotations name, deleted in the management cluster
    /// (--cluster-api-kubeconfig).
    #[value(name = "cluster-api")]
    ClusterApi,
    /// Bare metal through Redfish BMCs, as --redfish-config maps nodes to them.
    Redfish,
}

/// For the controllers that ask a cloud about machines (`spec.providerID`).
#[derive(Debug, Clone, Args)]
pub struct InstanceArgs {
    /// Who answers for the machines behind nodes: none, sim, exec (runs
    /// --instance-provider-command), aws (EC2), cluster-api (Machines) or redfish (BMCs).
    #[arg(long, env = "NODEGRACE_INSTANCE_PROVIDER", value_enum, default_value_t = InstanceProviderKind::None)]
    pub instance_provider: InstanceProviderKind,
    /// For --instance-provider=exec: the command, run as `<command> state|terminate
    /// <providerID> <node>`.
    #[arg(long, env = "NODEGRACE_INSTANCE_PROVIDER_COMMAND")]
    pub instance_provider_command: Option<PathBuf>,
    /// How long one call to the provider may take before it counts as failed (a duration,
    /// e.g. 30s); an exec command is killed then.
    #[arg(long, env = "NODEGRACE_INSTANCE_PROVIDER_TIMEOUT", default_value = "30s", value_parser = duration_flag)]
    pub instance_provider_timeout: Duration,
    /// For --instance-provider=aws: one EC2 endpoint for every call (a VPC endpoint, another
    /// partition); it serves --aws-region only. Default: `https://ec2.<region>.amazonaws.com`.
    #[arg(long, env = "NODEGRACE_AWS_ENDPOINT_URL", value_parser = url_flag)]
    pub aws_endpoint_url: Option<http::Uri>,
    /// For --instance-provider=aws: the region of machines whose providerID names no zone, and
    /// the one --aws-endpoint-url serves (default: AWS_REGION).
    #[arg(long, env = "NODEGRACE_AWS_REGION")]
    pub aws_region: Option<String>,
    /// For --instance-provider=aws with a web identity (IRSA): the STS endpoint. Default:
    /// `https://sts.<--aws-region>.amazonaws.com`.
    #[arg(long, env = "NODEGRACE_AWS_STS_ENDPOINT_URL", value_parser = url_flag)]
    pub aws_sts_endpoint_url: Option<http::Uri>,
    /// For --instance-provider=cluster-api: the management cluster's kubeconfig, where the
    /// Machines are. Default: this cluster.
    #[arg(long, env = "NODEGRACE_CLUSTER_API_KUBECONFIG")]
    pub cluster_api_kubeconfig: Option<PathBuf>,
    /// For --instance-provider=redfish: the map of nodes to BMCs (YAML: `machines:` with node
    /// or providerID, endpoint, system, credentials, caBundle; see docs/providers/redfish.md).
    #[arg(long, env = "NODEGRACE_REDFISH_CONFIG")]
    pub redfish_config: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum InstanceArgsError {
    #[error(
        "--instance-provider=exec needs --instance-provider-command: the command to run as \
         `<command> state|terminate <providerID> <node>`"
    )]
    MissingCommand,
    #[error(
        "--instance-provider-command is only used with --instance-provider=exec; set both, or \
         neither"
    )]
    CommandWithoutExec,
    #[error("{flag} is only used with --instance-provider={kind}; set both, or neither")]
    FlagOfAnotherProvider {
        flag: &'static str,
        kind: &'static str,
    },
    #[error("--instance-provider=aws")]
    Aws(#[source] AwsSetupError),
    #[error(
        "--instance-provider=redfish needs --redfish-config: the map of nodes to their BMCs \
         (docs/providers/redfish.md)"
    )]
    MissingRedfishConfig,
    #[error("--instance-provider=redfish")]
    Redfish(#[source] RedfishSetupError),
    #[error("--cluster-api-kubeconfig")]
    ClusterApi(#[source] nodegrace_core::k8s::client::ClientError),
}

impl InstanceArgs {
    /// The provider the flags ask for; `None` for `none`. `kube` builds the management
    /// cluster's client for `cluster-api` (this cluster's `client` without its own kubeconfig).
    pub async fn provider(
        &self,
        client: &kube::Client,
        kube: &KubeArgs,
    ) -> Result<Option<std::sync::Arc<dyn InstanceProvider>>, InstanceArgsError> {
        use std::sync::Arc;
        self.refuse_stray_flags()?;
        let provider: Arc<dyn InstanceProvider> = match self.instance_provider {
            InstanceProviderKind::None => return Ok(None),
            InstanceProviderKind::Exec => {
                let command = self
                    .instance_provider_command
                    .clone()
                    .ok_or(InstanceArgsError::MissingCommand)?;
                Arc::new(ExecInstances::new(command, self.instance_provider_timeout))
            }
            InstanceProviderKind::Sim => Arc::new(SimInstances::new(client.clone())),
            InstanceProviderKind::Aws => {
                let options = AwsOptions {
                    endpoint_url: self.aws_endpoint_url.clone(),
                    region: self
                        .aws_region
                        .clone()
                        .or_else(|| std::env::var("AWS_REGION").ok()),
                    sts_endpoint_url: self.aws_sts_endpoint_url.clone(),
                    timeout: self.instance_provider_timeout,
                };
                let aws = AwsInstances::new(&options, |name| std::env::var(name).ok())
                    .map_err(InstanceArgsError::Aws)?;
                tracing::info!(credentials = aws.credentials(), endpoint = ?self.aws_endpoint_url, region = ?options.region, "EC2 instance provider");
                Arc::new(aws)
            }
            InstanceProviderKind::ClusterApi => {
                let management = match &self.cluster_api_kubeconfig {
                    Some(path) => {
                        let args = KubeArgs {
                            kubeconfig: Some(path.clone()),
                            context: None,
                            ..kube.clone()
                        };
                        nodegrace_core::k8s::client::client(&args, "nodegrace-cluster-api")
                            .await
                            .map_err(InstanceArgsError::ClusterApi)?
                    }
                    None => client.clone(),
                };
                Arc::new(ClusterApiInstances::new(
                    management,
                    self.instance_provider_timeout,
                ))
            }
            InstanceProviderKind::Redfish => {
                let path = self
                    .redfish_config
                    .as_ref()
                    .ok_or(InstanceArgsError::MissingRedfishConfig)?;
                Arc::new(
                    RedfishInstances::from_file(path, self.instance_provider_timeout)
                        .map_err(InstanceArgsError::Redfish)?,
                )
            }
        };
        Ok(Some(provider))
    }

    /// A flag of one provider given with another is a mistake the operator should hear of.
    fn refuse_stray_flags(&self) -> Result<(), InstanceArgsError> {
        use InstanceProviderKind::{Aws, ClusterApi, Exec, Redfish};
        let flags = [
            (
                "--instance-provider-command",
                Exec,
                "exec",
                self.instance_provider_command.is_some(),
            ),
            (
                "--aws-endpoint-url",
                Aws,
                "aws",
                self.aws_endpoint_url.is_some(),
            ),
            (
                "--aws-sts-endpoint-url",
                Aws,
                "aws",
                self.aws_sts_endpoint_url.is_some(),
            ),
            (
                "--cluster-api-kubeconfig",
                ClusterApi,
                "cluster-api",
                self.cluster_api_kubeconfig.is_some(),
            ),
            (
                "--redfish-config",
                Redfish,
                "redfish",
                self.redfish_config.is_some(),
            ),
        ];
        for (flag, owner, kind, set) in flags {
            if set && self.instance_provider != owner {
                if owner == Exec {
                    return Err(InstanceArgsError::CommandWithoutExec);
                }
                return Err(InstanceArgsError::FlagOfAnotherProvider { flag, kind });
            }
        }
        Ok(())
    }
}

/// A clap value parser for endpoint URLs: http or https, with a host.
pub fn url_flag(text: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|error| format!("{text:?} is not a URL: {error}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(uri),
        _ => Err(format!(
            "{text:?} is not an http(s) URL with a host, e.g. https://ec2.eu-west-1.amazonaws.com"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Controller {
        #[command(flatten)]
        leader: LeaderArgs,
    }

    #[test]
    fn leader_election_defaults_to_on_with_the_program_as_lease() {
        let on = Controller::try_parse_from(["c", "--leader-election-identity=pod-1"]).unwrap();
        let config = on.leader.config("termination-controller").unwrap();
        assert_eq!(config.lease_name, "termination-controller");
        assert_eq!(config.identity, "pod-1");
        assert_eq!(
            (config.lease_duration_seconds, config.renew_margin_seconds),
            (15, 5)
        );
        let off = Controller::try_parse_from(["c", "--leader-elect=false"]).unwrap();
        assert!(off.leader.config("x").is_none());
        let error = Controller::try_parse_from(["c", "--leader-election-lease-duration=soon"])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("--leader-election-lease-duration"),
            "{error}"
        );
    }
}
