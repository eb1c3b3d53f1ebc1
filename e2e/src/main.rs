//! `nodegrace-demo`: what `cargo xtask demo` runs once the binaries are built.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Parser;
use nodegrace_e2e::demo::{self, Ending, Options};
use nodegrace_e2e::images::ImageBinaries;
use nodegrace_e2e::least_privilege;
use nodegrace_e2e::stage::{CHARTS, Inputs};

#[derive(Debug, Parser)]
#[command(
    name = "nodegrace-demo",
    about = "Plays nodegrace's story on kube-sim with a real elogind per node; exits non-zero if an act fails"
)]
struct Args {
    /// Leave the cluster running at the end and print the KUBECONFIG to explore it; Ctrl-C stops it.
    #[arg(long)]
    keep: bool,
    /// Play only this act (repeatable); all acts by default.
    #[arg(long = "act", value_name = "SLUG")]
    acts: Vec<String>,
    /// Install only this chart (repeatable); all four by default. Acts need the charts they
    /// show.
    #[arg(long = "chart", value_name = "CHART")]
    charts: Vec<String>,
    /// Install the charts, wait until their pods are Ready, and stop: no act is played.
    #[arg(long)]
    install_only: bool,
    /// For each RBAC rule of each chart (those of --chart): a fresh cluster, the chart without
    /// that rule, its scenario, and the rule's 403 in the program's log; prints the rule →
    /// scenario table and fails if a rule is not needed.
    #[arg(long, conflicts_with_all = ["acts", "install_only", "keep"])]
    least_privilege: bool,
    /// Where the program binaries and kube-sim are [default: this binary's directory].
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Run PROGRAM's image with another binary, e.g. a deliberately broken agent.
    #[arg(long = "image-binary", value_name = "PROGRAM=PATH", value_parser = parse_override)]
    image_binaries: Vec<(String, PathBuf)>,
    /// The helm binary [default: target/tools/helm, else helm on PATH].
    #[arg(long)]
    helm: Option<PathBuf>,
    /// Scratch directory for the cluster's kubeconfig, the machines and every process's log
    /// (emptied at start) [default: target/demo].
    #[arg(long)]
    work_dir: Option<PathBuf>,
}

fn parse_override(value: &str) -> Result<(String, PathBuf), String> {
    value
        .split_once('=')
        .filter(|(program, path)| !program.is_empty() && !path.is_empty())
        .map(|(program, path)| (program.to_owned(), PathBuf::from(path)))
        .ok_or_else(|| format!("`{value}` is not PROGRAM=PATH"))
}

fn main() -> ExitCode {
    match run() {
        Ok(Ending::AllPassed) => ExitCode::SUCCESS,
        Ok(Ending::ActFailed(_)) => ExitCode::FAILURE,
        Ok(Ending::Interrupted) => ExitCode::from(130),
        Err(error) => {
            eprintln!("Error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<Ending> {
    let args = Args::parse();
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "the demo needs root: each simulated machine runs elogind in its own PID and mount namespaces. Run: sudo -E env PATH=\"$PATH\" cargo xtask demo"
        );
    }
    let repo = std::fs::canonicalize(nodegrace_e2e::REPO)
        .context("find the repository this demo was built from")?;
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("this binary has a directory")?
            .to_path_buf(),
    };
    let helm = args
        .helm
        .unwrap_or_else(|| nodegrace_e2e::chart::helm_binary(&repo));
    for chart in &args.charts {
        if !CHARTS.contains(&chart.as_str()) {
            bail!(
                "--chart {chart}: no such chart; the charts are {}",
                CHARTS.join(", ")
            );
        }
    }
    let charts = if args.charts.is_empty() {
        CHARTS.iter().map(|chart| (*chart).to_owned()).collect()
    } else {
        args.charts
    };
    let options = Options {
        inputs: Inputs {
            binaries: ImageBinaries {
                dir: bin_dir,
                overrides: args.image_binaries.into_iter().collect::<BTreeMap<_, _>>(),
            },
            helm,
            charts_dir: repo.join("charts"),
            values_dir: repo.join("e2e/demo"),
            work_dir: args.work_dir.unwrap_or_else(|| repo.join("target/demo")),
            charts,
            without_rule: None,
            values_set: Vec::new(),
        },
        acts: args.acts,
        install_only: args.install_only,
        keep: args.keep,
    };
    // One thread: the death signal that ties every child to the demo follows the thread that
    // started it (see processes.rs).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if args.least_privilege {
        return runtime.block_on(least_privilege(&options.inputs));
    }
    runtime.block_on(demo::run(options))
}

/// Every rule of every chosen chart, removed one at a time; the table goes to stdout and to
/// `<work-dir>/least-privilege.md`.
async fn least_privilege(inputs: &Inputs) -> Result<Ending> {
    let mut proofs = Vec::new();
    for chart in &inputs.charts {
        proofs.extend(least_privilege::prove_chart(inputs, chart).await?);
    }
    let (table, all_needed) = least_privilege::table(&proofs);
    std::fs::create_dir_all(&inputs.work_dir)?;
    std::fs::write(inputs.work_dir.join("least-privilege.md"), &table)?;
    println!("\n==> least privilege: every rule removed, one at a time\n{table}");
    Ok(if all_needed {
        Ending::AllPassed
    } else {
        Ending::ActFailed("least-privilege".to_owned())
    })
}
