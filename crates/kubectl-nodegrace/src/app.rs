//! Runs one command and prints its answer.

use std::collections::BTreeMap;
use std::io::Write as _;

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use nodegrace_controller::InstanceProviderKind;
use nodegrace_core::k8s::cached_node::CachedNode;
use termination_controller::plan;

use crate::cli::{Cli, Command, Explain, Output};
use crate::connect::connect;
use crate::lifecycle::{NodeLifecycle, Program, State};
use crate::read::Unread;
use crate::render::{self, Style};
use crate::status::{self, Snapshot};
use crate::{explain_node, explain_pod};

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let (client, default_namespace) =
        connect(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    let style = Style::for_stdout();
    let output = cli.output;
    match cli.command {
        Command::Status { nodes, watch } => {
            let answer = status::status(&client, &nodes).await?;
            print(&match output {
                Output::Table => render::status(&answer, style),
                _ => render::document(&answer, output)?,
            })?;
            if watch {
                watch_nodes(&client, &nodes, answer.nodes, output, style).await?;
            }
        }
        Command::Explain {
            what: Explain::Node { node },
        } => {
            let story = explain_node::explain(&client, &node).await?;
            print(&match output {
                Output::Table => render::node_story(&story, style),
                _ => render::document(&story, output)?,
            })?;
        }
        Command::Explain {
            what: Explain::Pod { pod },
        } => {
            let (namespace, name) = match pod.split_once('/') {
                Some((namespace, name)) => (namespace.to_owned(), name.to_owned()),
                None => (cli.namespace.unwrap_or(default_namespace), pod),
            };
            let story = explain_pod::explain(&client, &namespace, &name).await?;
            print(&match output {
                Output::Table => render::pod_story(&story, style),
                _ => render::document(&story, output)?,
            })?;
        }
        Command::Plan {
            node,
            instance_provider,
        } => {
            let mut unread = Unread::default();
            let provider = match instance_provider {
                Some(provider) => provider,
                None => installed_provider(&client, &mut unread).await?,
            };
            let cluster = plan::gather(&client, &node).await?;
            let drain_plan = plan::plan(&cluster, provider, Timestamp::now());
            let mut text = match output {
                Output::Table => drain_plan.table(),
                _ => render::document(&drain_plan, output)?,
            };
            if output == Output::Table {
                for line in unread.0 {
                    text.push_str("! ");
                    text.push_str(&line);
                    text.push('\n');
                }
            }
            print(&text)?;
        }
    }
    Ok(())
}

fn print(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .context("write to stdout")?;
    stdout.flush().context("write to stdout")
}

/// The instance provider the installed termination-controller runs with: the
/// `--instance-provider=` argument or `NODEGRACE_INSTANCE_PROVIDER` of its Deployment; none
/// when it cannot be told.
async fn installed_provider(
    client: &Client,
    unread: &mut Unread,
) -> anyhow::Result<InstanceProviderKind> {
    use clap::ValueEnum as _;
    let deployments =
        status::chart_workloads::<Deployment>(client, &[Program::TerminationController], unread)
            .await?
            .unwrap_or_default();
    let said = deployments
        .iter()
        .filter_map(|deployment| deployment.spec.template.spec.as_ref())
        .flat_map(|pod| &pod.containers)
        .find_map(|container| {
            let from_args = container.args.iter().flatten().find_map(|arg| {
                arg.strip_prefix("--instance-provider=")
                    .map(ToOwned::to_owned)
            });
            let from_env = || {
                container.env.iter().flatten().find_map(|var| {
                    (var.name == "NODEGRACE_INSTANCE_PROVIDER")
                        .then(|| var.value.clone())
                        .flatten()
                })
            };
            from_args.or_else(from_env)
        });
    Ok(said
        .and_then(|kind| InstanceProviderKind::from_str(&kind, true).ok())
        .unwrap_or(InstanceProviderKind::None))
}

/// Prints each node's rows again whenever they change, until interrupted.
async fn watch_nodes(
    client: &Client,
    named: &[String],
    first: Vec<NodeLifecycle>,
    output: Output,
    style: Style,
) -> anyhow::Result<()> {
    let mut shown: BTreeMap<String, Vec<NodeLifecycle>> = BTreeMap::new();
    for row in first {
        shown.entry(row.node.clone()).or_default().push(row);
    }
    let api = Api::<CachedNode>::all(client.clone());
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let event = tokio::select! {
            _ = &mut interrupted => return Ok(()),
            event = events.try_next() => event.context("watch nodes")?,
        };
        let Some(event) = event else { return Ok(()) };
        let (node, gone) = match event {
            watcher::Event::Apply(node) | watcher::Event::InitApply(node) => (node, false),
            watcher::Event::Delete(node) => (node, true),
            watcher::Event::Init | watcher::Event::InitDone => continue,
        };
        let name = node.metadata.name.clone().unwrap_or_default();
        if !named.is_empty() && !named.contains(&name) {
            continue;
        }
        let now = Timestamp::now();
        let rows = if gone {
            vec![ended(&name, State::Gone)]
        } else {
            let mut snapshot = Snapshot {
                nodes: vec![node],
                ..Snapshot::default()
            };
            snapshot.read_around(client).await?;
            let rows = snapshot.rows(true, now);
            let was_shown = shown.get(&name).is_some_and(|rows| !rows.is_empty());
            if rows.iter().all(|row| row.state == State::Healthy) && !was_shown && named.is_empty()
            {
                continue;
            }
            rows
        };
        if shown.get(&name) == Some(&rows) {
            continue;
        }
        let text = match output {
            Output::Table => render::rows_table(&rows, now, false, style),
            Output::Json => {
                rows.iter()
                    .map(serde_json::to_string)
                    .collect::<Result<Vec<_>, _>>()?
                    .join("\n")
                    + "\n"
            }
            Output::Yaml => rows
                .iter()
                .map(|row| serde_yaml_ng::to_string(row).map(|doc| format!("---\n{doc}")))
                .collect::<Result<String, _>>()?,
        };
        print(&text)?;
        if gone {
            shown.remove(&name);
        } else {
            shown.insert(name, rows);
        }
    }
}

fn ended(name: &str, state: State) -> NodeLifecycle {
    NodeLifecycle {
        node: name.to_owned(),
        program: None,
        state,
        step: None,
        since: None,
        blocked_by: None,
        next: None,
    }
}
