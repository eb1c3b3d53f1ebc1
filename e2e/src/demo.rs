//! The demo from start to end: set the stage, play the acts in order (stopping at the first that
//! fails), report, optionally keep the cluster for exploring, and stop everything.

use anyhow::{Result, bail};

use crate::acts::{self, Act};
use crate::stage::{Inputs, Stage};
use crate::timeline::{Timeline, seconds};

#[derive(Debug, Clone)]
pub struct Options {
    pub inputs: Inputs,
    /// Slugs of the acts to play; empty = all.
    pub acts: Vec<String>,
    /// Leave the cluster running until Ctrl-C.
    pub keep: bool,
    /// Set the stage (install the charts, pods Ready) and play no act.
    pub install_only: bool,
}

/// How the demo ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    AllPassed,
    /// The slug of the act that failed.
    ActFailed(String),
    Interrupted,
}

pub async fn run(options: Options) -> Result<Ending> {
    let acts = if options.install_only {
        Vec::new()
    } else {
        chosen_acts(&options.acts)?
    };
    let timeline = Timeline::new();
    let interrupted = interrupt();
    tokio::pin!(interrupted);
    let stage = tokio::select! {
        stage = Stage::build(&options.inputs, timeline) => stage?,
        () = &mut interrupted => return Ok(stopped()),
    };
    let mut stage = stage;
    let mut ending = Ending::AllPassed;
    for act in &acts {
        let number = acts::number(act);
        stage
            .timeline
            .heading(&format!("Act {number} · {}", act.title));
        let outcome = tokio::select! {
            outcome = (act.play)(&mut stage) => outcome,
            () = &mut interrupted => {
                stage.tear_down();
                return Ok(stopped());
            }
        };
        if let Err(error) = outcome {
            stage
                .timeline
                .fail(&format!("act {number} ({}): {error:#}", act.slug));
            println!(
                "Our pods when the act failed:\n{}",
                stage.pods_report().await
            );
            ending = Ending::ActFailed(act.slug.to_owned());
            break;
        }
    }
    summarize(&stage, &acts, &ending);
    if options.keep {
        keep(&stage, &mut interrupted).await;
    }
    stage.tear_down();
    Ok(ending)
}

fn chosen_acts(slugs: &[String]) -> Result<Vec<&'static Act>> {
    if slugs.is_empty() {
        return Ok(acts::ALL.iter().collect());
    }
    slugs
        .iter()
        .map(|slug| match acts::find(slug) {
            Some(act) => Ok(act),
            None => bail!(
                "--act {slug}: no such act; the acts are {}",
                acts::ALL
                    .iter()
                    .chain(acts::EXTRA)
                    .map(|act| act.slug)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })
        .collect()
}

fn summarize(stage: &Stage, acts: &[&Act], ending: &Ending) {
    let took = seconds(stage.timeline.elapsed());
    match ending {
        Ending::AllPassed if acts.is_empty() => {
            stage.timeline.heading(&format!(
                "The charts are installed and their pods Ready ({took})"
            ));
        }
        Ending::AllPassed => {
            let played = match acts.len() {
                1 => "The act".to_owned(),
                count => format!("All {count} acts"),
            };
            stage
                .timeline
                .heading(&format!("{played} passed in {took}"));
        }
        Ending::ActFailed(slug) => {
            stage.timeline.heading(&format!(
                "Act `{slug}` failed ({took}); later acts not played"
            ));
        }
        Ending::Interrupted => {}
    }
    println!("Logs of every process: {}", stage.work_dir.display());
}

/// Waits for Ctrl-C while the user explores the cluster.
async fn keep(stage: &Stage, interrupted: &mut std::pin::Pin<&mut impl Future<Output = ()>>) {
    println!("The cluster keeps running. In another shell:");
    println!("    export KUBECONFIG={}", stage.kubeconfig().display());
    println!("    kubectl get nodes,pods -A");
    println!("Press Ctrl-C to stop everything.");
    interrupted.as_mut().await;
}

fn stopped() -> Ending {
    println!("\nInterrupted: stopping every process the demo started.");
    Ending::Interrupted
}

/// Resolves on Ctrl-C or SIGTERM.
async fn interrupt() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
