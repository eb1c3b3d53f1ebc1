//! Act: a backup Job takes a Lease named after node-1; the shutdown-inhibitor-agent turns it
//! into a logind block inhibitor and a `ShutdownInhibited` condition, and lets go when the Lease
//! is released.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::Act;
use crate::observe::{condition_command, describe, inhibitors, node_condition};
use crate::stage::{NODES, Stage};
use crate::timeline::millis;
use crate::wait::{poll_for, poll_until};

pub const ACT: Act = Act {
    slug: "lease-blocks-shutdown",
    title: "A backup holds node-1 up: a Lease becomes a logind block inhibitor",
    play: |stage| Box::pin(play(stage)),
};

const NODE: &str = "node-1";
const NAMESPACE: &str = "backup";
const HOLDER: &str = "nightly-backup-29120";
/// The agent reacts within milliseconds; this only bounds a broken one.
const TIMEOUT: Duration = Duration::from_secs(15);

async fn play(stage: &mut Stage) -> Result<()> {
    let stage = &*stage;
    let timeline = &stage.timeline;
    let host = stage.node(NODE)?;
    if let Some(lock) = inhibitors(host, "block").await?.first() {
        bail!(
            "{NODE} is blocked before any Lease exists: {}",
            describe(lock)
        );
    }
    let leases: Api<Lease> = Api::namespaced(stage.client().clone(), NAMESPACE);
    timeline.event(&format!(
        "the nightly backup Job takes Lease {NAMESPACE}/{NODE} (holder {HOLDER})"
    ));
    let taken = Instant::now();
    leases
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": NODE},
                "spec": {
                    "holderIdentity": HOLDER,
                    "leaseDurationSeconds": 3600,
                    "acquireTime": jiff::Timestamp::now().to_string(),
                },
            }))?,
        )
        .await?;
    timeline.show(&format!("kubectl -n {NAMESPACE} get lease {NODE}"));

    let block = poll_for(TIMEOUT, || async {
        inhibitors(host, "block")
            .await
            .ok()
            .and_then(|l| l.into_iter().next())
    })
    .await;
    let Some(block) = block else {
        bail!("{NODE}'s logind lists no block inhibitor {TIMEOUT:?} after the Lease was taken");
    };
    timeline.event(&format!(
        "{NODE}'s logind holds a {} after {}",
        describe(&block),
        millis(taken.elapsed())
    ));
    timeline.show(&host.inhibitors_command());

    let inhibited = wait_for_condition(stage, "True").await?;
    timeline.event(&format!(
        "{NODE} has condition ShutdownInhibited=True ({}: {})",
        inhibited.0, inhibited.1
    ));
    let status = stage.nodegrace(&["status"]).await?;
    if !status.contains(&format!(
        "Lease {NAMESPACE}/{NODE} holds the shutdown: held by {HOLDER}"
    )) {
        bail!("kubectl nodegrace status does not name the Lease holding {NODE}:\n{status}");
    }
    timeline.show(&condition_command(NODE, "ShutdownInhibited"));
    for index in (0..NODES).filter(|index| format!("node-{index}") != NODE) {
        let other = stage.node(&format!("node-{index}"))?;
        if let Some(lock) = inhibitors(other, "block").await?.first() {
            bail!(
                "{} is blocked too, by a Lease not named after it: {}",
                other.name(),
                describe(lock)
            );
        }
    }
    timeline.pass("a shutdown of node-1 is blocked, and only node-1's");

    timeline.event("the backup finishes and releases the Lease (holderIdentity cleared)");
    let released = Instant::now();
    leases
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"holderIdentity": null}})),
        )
        .await?;
    let unblocked = poll_until(TIMEOUT, || async {
        inhibitors(host, "block")
            .await
            .is_ok_and(|locks| locks.is_empty())
    })
    .await;
    if !unblocked {
        bail!("{NODE} is still blocked {TIMEOUT:?} after the Lease was released");
    }
    timeline.event(&format!(
        "{NODE}'s block inhibitor is gone after {}",
        millis(released.elapsed())
    ));
    let cleared = wait_for_condition(stage, "False").await?;
    timeline.event(&format!(
        "{NODE} has condition ShutdownInhibited=False ({}: {})",
        cleared.0, cleared.1
    ));
    timeline.pass("node-1 may shut down again");
    Ok(())
}

/// Waits until node-1's `ShutdownInhibited` condition has `status`; returns (reason, message).
async fn wait_for_condition(stage: &Stage, status: &str) -> Result<(String, String)> {
    let seen = poll_for(TIMEOUT, || async {
        node_condition(stage.client(), NODE, "ShutdownInhibited")
            .await
            .ok()
            .flatten()
            .filter(|condition| condition.status == status)
    })
    .await;
    match seen {
        Some(condition) => Ok((
            condition.reason.unwrap_or_default(),
            condition.message.unwrap_or_default(),
        )),
        None => bail!("{NODE} has no condition ShutdownInhibited={status} after {TIMEOUT:?}"),
    }
}
