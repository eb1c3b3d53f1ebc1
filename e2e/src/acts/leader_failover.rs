//! Act: the termination-controller's leader pod is deleted, as a node drain or an operator
//! would delete it; the other replica takes the Lease and leads, and the Deployment brings a
//! replacement, which follows.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use super::Act;
use crate::stage::{AGENTS_NAMESPACE, Stage, TERMINATION_CONTROLLER};
use crate::timeline::millis;
use crate::wait::poll_for;

pub const ACT: Act = Act {
    slug: "leader-failover",
    title: "The termination-controller's leader pod is deleted; the other replica leads",
    play: |stage| Box::pin(play(stage)),
};

/// The chart's lease duration is 15 s. The deleted leader lets the Lease go on SIGTERM, but a
/// follower (kube-lease-manager) reads the Lease again only when the holder's last renewal
/// would expire, so the handover takes anywhere up to a lease duration; the replacement pod, a
/// fresh candidate, may take it first.
const TIMEOUT: Duration = Duration::from_secs(40);

/// Who holds termination-controller's Lease, if anyone.
pub(crate) async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get(TERMINATION_CONTROLLER)
        .await
        .ok()?
        .spec?
        .holder_identity
        .filter(|holder| !holder.is_empty())
}

async fn play(stage: &mut Stage) -> Result<()> {
    let stage = &*stage;
    let timeline = &stage.timeline;
    let leases: Api<Lease> = Api::namespaced(stage.client().clone(), AGENTS_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(stage.client().clone(), AGENTS_NAMESPACE);
    let leader = holder(&leases)
        .await
        .context("the termination-controller's Lease has no holder")?;
    timeline.event(&format!(
        "{leader} leads (Lease {AGENTS_NAMESPACE}/{TERMINATION_CONTROLLER})"
    ));
    timeline.show(&format!(
        "kubectl -n {AGENTS_NAMESPACE} get lease {TERMINATION_CONTROLLER}"
    ));
    let deleted = Instant::now();
    pods.delete(&leader, &DeleteParams::default())
        .await
        .with_context(|| format!("delete the leader pod {leader}"))?;
    timeline.event(&format!(
        "kubectl -n {AGENTS_NAMESPACE} delete pod {leader}"
    ));
    let successor = poll_for(TIMEOUT, || async {
        let live: Vec<String> = pods
            .list(
                &ListParams::default()
                    .labels(&format!("app.kubernetes.io/name={TERMINATION_CONTROLLER}")),
            )
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter_map(|pod| pod.metadata.name)
            .collect();
        holder(&leases)
            .await
            .filter(|holder| *holder != leader && live.contains(holder))
    })
    .await;
    let Some(successor) = successor else {
        bail!(
            "no other replica took the Lease within {TIMEOUT:?} of deleting {leader} (holder now: {:?})",
            holder(&leases).await
        );
    };
    timeline.event(&format!(
        "{successor} took the Lease {} after {leader} was deleted",
        millis(deleted.elapsed())
    ));
    let replaced = poll_for(TIMEOUT, || async {
        let listed = pods
            .list(
                &ListParams::default()
                    .labels(&format!("app.kubernetes.io/name={TERMINATION_CONTROLLER}")),
            )
            .await
            .ok()?
            .items;
        let ready = listed
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_none())
            .filter(|pod| {
                pod.status
                    .as_ref()
                    .and_then(|status| status.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        (ready == 2).then_some(())
    })
    .await;
    if replaced.is_none() {
        bail!("the Deployment did not bring back a second Ready replica within {TIMEOUT:?}");
    }
    timeline.show(&format!(
        "kubectl -n {AGENTS_NAMESPACE} get pods -l app.kubernetes.io/name={TERMINATION_CONTROLLER}"
    ));
    timeline.pass(&format!(
        "{successor} leads; a replacement replica is Ready and follows"
    ));
    Ok(())
}
