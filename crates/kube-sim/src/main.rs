//! `kube-sim serve`: the simulator as a process, for kubectl and the e2e scenarios.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use kube_sim::{KubeSim, SimOptions};

#[derive(Debug, Parser)]
#[command(
    name = "kube-sim",
    version,
    about = "An in-memory Kubernetes API server with a simulated kubelet and control plane"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serves until SIGTERM or SIGINT.
    Serve {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Written (atomically) once the server accepts requests and its URL is on stdout, so a
        /// script that waits for this file can read the URL at once.
        #[arg(long)]
        kubeconfig_out: PathBuf,
        /// Ready nodes node-0..N-1 to create.
        #[arg(long, default_value_t = 0)]
        nodes: usize,
        /// Running ReplicaSet pods on each created node.
        #[arg(long, default_value_t = 0)]
        pods_per_node: usize,
        /// Serve HTTPS with a generated CA (put in the kubeconfig).
        #[arg(long)]
        tls: bool,
        /// PATTERN=DIR: run containers whose image matches PATTERN (exact, or a prefix ending
        /// in '*') as local processes, their command[0] (or the image name) taken from DIR;
        /// `kubectl logs` shows their output. Repeatable. Example: 'busybox:*=/bin'.
        #[arg(long = "run-image", value_name = "PATTERN=DIR")]
        run_images: Vec<kube_sim::ImageRule>,
    },
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let Command::Serve {
        listen,
        kubeconfig_out,
        nodes,
        pods_per_node,
        tls,
        run_images,
    } = Cli::parse().command;
    let sim = KubeSim::start(SimOptions {
        listen,
        tls,
        nodes,
        pods_per_node,
        world: kube_sim::WorldOptions {
            run_images,
            ..kube_sim::WorldOptions::default()
        },
        ..SimOptions::default()
    })
    .await
    .context("start kube-sim")?;
    println!("{}", sim.url());
    sim.write_kubeconfig_to(&kubeconfig_out)?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    sim.stop();
    Ok(())
}
