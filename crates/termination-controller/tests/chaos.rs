//! The controller killed (SIGKILL) at random points during three drains, smaller than the
//! bench's run (`cargo xtask bench termination`): every drain completes, no budget is broken,
//! each machine is terminated once, no finalizer is left.

#[path = "proofs/chaos.rs"]
mod proof;

use anyhow::{Result, ensure};

async fn proves(chaos: proof::Chaos) -> Result<()> {
    let report = proof::run(chaos).await?;
    println!("{report}");
    ensure!(report.kills == chaos.kills, "{report}");
    ensure!(report.drains_completed == 3, "{report}");
    ensure!(report.violations == 0, "{report}");
    ensure!(report.terminations_per_instance_max == 1, "{report}");
    ensure!(report.finalizers_left == 0, "{report}");
    ensure!(report.requests_left == 0, "{report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_survive_the_controller_killed_at_random_points() -> Result<()> {
    proves(proof::Chaos {
        kills: 8,
        replicas: 1,
        web_replicas: 15,
        seed: 14,
        eviction_requests: false,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drains_survive_the_leader_of_two_replicas_killed() -> Result<()> {
    proves(proof::Chaos {
        kills: 3,
        replicas: 2,
        web_replicas: 15,
        seed: 41,
        eviction_requests: false,
    })
    .await
}

/// The same, draining through EvictionRequests: no request outlives its node's termination.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_request_drains_survive_the_controller_killed_at_random_points() -> Result<()> {
    proves(proof::Chaos {
        kills: 6,
        replicas: 1,
        web_replicas: 15,
        seed: 15,
        eviction_requests: true,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_request_drains_survive_the_leader_of_two_replicas_killed() -> Result<()> {
    proves(proof::Chaos {
        kills: 3,
        replicas: 2,
        web_replicas: 15,
        seed: 42,
        eviction_requests: true,
    })
    .await
}
