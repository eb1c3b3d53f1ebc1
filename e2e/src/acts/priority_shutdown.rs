//! Act: node-1 powers off through logind. The graceful-shutdown-agent marks the node and stops
//! its pods group by group, lowest priority first, each group within its period; logind goes
//! ahead the moment the last pod is gone. Then the machine is off.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::watcher;

use logind_harness::LogindHarness;

use super::Act;
use crate::observe::{condition_command, describe, inhibitors, node, node_condition};
use crate::stage::{GRACEFUL_SHUTDOWN_AGENT, Stage};
use crate::timeline::{Timeline, millis, seconds};
use crate::wait::{poll_for, poll_until};

pub const ACT: Act = Act {
    slug: "priority-shutdown",
    title: "node-1 powers off: pods stop by priority, then the machine goes",
    play: |stage| Box::pin(play(stage)),
};

const NODE: &str = "node-1";
const SHUTTING_DOWN_TAINT: &str = "nodegrace.io/shutting-down";
/// How long the agent may take to get its drop-in applied by logind.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long our pod watch may lag behind a read of the API server.
const WATCH_CATCH_UP: Duration = Duration::from_secs(5);

/// A pod on the node when the power-off began.
#[derive(Debug, Clone)]
struct Victim {
    name: String,
    group: usize,
}

/// When the pod watch saw a pod start terminating and disappear, in watch order (`seq`).
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    terminating: Option<(u64, SystemTime)>,
    gone: Option<(u64, SystemTime)>,
}

async fn play(stage: &mut Stage) -> Result<()> {
    let groups = stage.shutdown_groups.clone();
    let budget: Duration = groups.iter().map(|(_, period)| *period).sum();
    let host = stage.node(NODE)?;
    let logind = host.logind()?;
    let timeline = &stage.timeline;

    let delay = poll_for(SETTLE_TIMEOUT, || async {
        logind
            .inhibit_delay_max()
            .await
            .ok()
            .filter(|delay| *delay >= budget)
    })
    .await;
    let Some(delay) = delay else {
        let delay = logind.inhibit_delay_max().await.unwrap_or_default();
        bail!(
            "{NODE}'s logind allows {} of inhibit delay, the agent's budget needs {}",
            seconds(delay),
            seconds(budget)
        );
    };
    let Some(lock) = inhibitors(host, "delay").await?.into_iter().next() else {
        bail!("{NODE}'s logind lists no delay inhibitor: nothing will hold its shutdown");
    };
    timeline.event(&format!("{NODE}'s logind holds a {}", describe(&lock)));
    timeline.event(&format!(
        "{NODE}'s InhibitDelayMaxSec is {}: raised from 5 s by the agent's drop-in, to cover its groups",
        seconds(delay)
    ));

    let own_pod = stage.agent_pod(NODE, GRACEFUL_SHUTDOWN_AGENT).await?;
    let victims = pods_on_node(stage, &groups, &own_pod).await?;
    for (index, (priority, period)) in groups.iter().enumerate() {
        let names: Vec<&str> = victims
            .values()
            .filter(|victim| victim.group == index)
            .map(|victim| victim.name.as_str())
            .collect();
        timeline.event(&format!(
            "  group priority ≥ {priority:>10} ({} s): {}",
            period.as_secs(),
            if names.is_empty() {
                "-".to_owned()
            } else {
                names.join(", ")
            }
        ));
    }

    let (powered_off, proceeded, seen) = power_off_watching(stage, logind, delay, &victims).await?;

    let mut last_gone = powered_off;
    // The moment (in watch order) the previous group's last pod was gone, and which pod it was.
    let mut previous_group_done: Option<Moment> = None;
    for (index, (priority, period)) in groups.iter().enumerate() {
        let Some(span) = group_span(&victims, &seen, index) else {
            continue;
        };
        if let Some(previous) = &previous_group_done
            && span.first_terminating.seq < previous.seq
        {
            bail!(
                "{} began terminating before {} of a lower-priority group was gone",
                span.first_terminating.pod,
                previous.pod
            );
        }
        let took = span
            .last_gone
            .at
            .duration_since(span.first_terminating.at)
            .unwrap_or_default();
        if took > *period {
            bail!(
                "group {priority} took {}, more than its {} s",
                seconds(took),
                period.as_secs()
            );
        }
        timeline.event(&format!(
            "group priority ≥ {priority}: {} pod(s) stopped in {} (period {} s)",
            span.pods,
            seconds(took),
            period.as_secs()
        ));
        last_gone = last_gone.max(span.last_gone.at);
        previous_group_done = Some(span.last_gone);
    }
    // Our watch may deliver the last deletion after logind proceeded (see above).
    let released_after = match proceeded.duration_since(last_gone) {
        Ok(after) => format!("{} later", millis(after)),
        Err(_) => "as it went".to_owned(),
    };
    let waited = proceeded.duration_since(powered_off).unwrap_or_default();
    if waited + Duration::from_secs(1) >= delay {
        bail!(
            "logind went ahead only when its {} delay ran out: the agent never released its lock after the last pod",
            seconds(delay)
        );
    }
    timeline.event(&format!(
        "last pod gone → logind went ahead {released_after} ({} after PowerOff; it would have waited up to {})",
        seconds(waited),
        seconds(delay)
    ));
    timeline.pass(
        "pods stopped in priority order within their periods; the lock went with the last pod",
    );

    check_marks(stage).await?;
    stage.power_off(NODE).await?;
    stage.timeline.event(&format!(
        "{NODE} is off: its processes and logind are gone, its kubelet no longer reports (NotReady once its node Lease expires)"
    ));
    stage.timeline.show("kubectl get nodes");
    Ok(())
}

/// Powers the node off through logind while watching its pods. Returns when PowerOff was
/// called, when logind went ahead, and what the watch saw of each pod — once it has seen every
/// victim gone.
async fn power_off_watching(
    stage: &Stage,
    logind: &LogindHarness,
    delay: Duration,
    victims: &HashMap<String, Victim>,
) -> Result<(SystemTime, SystemTime, HashMap<String, Seen>)> {
    let timeline = &stage.timeline;
    let seen: RefCell<HashMap<String, Seen>> = RefCell::default();
    let (synced_tx, synced) = tokio::sync::oneshot::channel();
    let mut watch = Box::pin(record_pods(
        stage.client().clone(),
        victims,
        timeline,
        &seen,
        synced_tx,
    ));
    let shutdown = async {
        synced
            .await
            .context("the pod watch ended before it synced")?;
        let powered_off = SystemTime::now();
        logind.power_off().await.context("call PowerOff")?;
        timeline.event(&format!(
            "PowerOff on {NODE} (as `systemctl poweroff`): logind announces PrepareForShutdown and waits for delay locks"
        ));
        let proceeded = logind
            .wait_for_shutdown_hook(delay + Duration::from_secs(10))
            .await
            .context("logind never went ahead with the shutdown")?;
        timeline.event(&format!("{NODE}'s logind goes ahead with the power-off"));
        anyhow::Ok((powered_off, proceeded))
    };
    let (powered_off, proceeded) = tokio::select! {
        outcome = shutdown => outcome?,
        () = &mut watch => bail!("the pod watch on {NODE} ended"),
    };
    // Our watch is one reader among others: the agent's may see a deletion (and release its
    // lock) before ours delivers it. A read made now is ordered after the shutdown went ahead,
    // so a victim it still finds was not gone when logind proceeded.
    if let Some(left) = victims_left(stage, victims).await?.first() {
        bail!("the shutdown went ahead while {left} was still on {NODE}");
    }
    let caught_up = tokio::select! {
        caught_up = poll_until(WATCH_CATCH_UP, || async {
            let seen = seen.borrow();
            victims.keys().all(|uid| seen.get(uid).is_some_and(|record| record.gone.is_some()))
        }) => caught_up,
        () = &mut watch => bail!("the pod watch on {NODE} ended"),
    };
    if !caught_up {
        bail!("the pod watch on {NODE} did not deliver every deletion the API server had made");
    }
    drop(watch);
    Ok((powered_off, proceeded, seen.into_inner()))
}

/// A watch event about one pod: its place in watch order and when it arrived.
#[derive(Debug, Clone)]
struct Moment {
    seq: u64,
    at: SystemTime,
    pod: String,
}

/// How one priority group's termination went, by the watch.
#[derive(Debug)]
struct GroupSpan {
    pods: usize,
    first_terminating: Moment,
    last_gone: Moment,
}

/// The span of group `index`, or `None` if no pod was in it or the watch missed its deletion.
fn group_span(
    victims: &HashMap<String, Victim>,
    seen: &HashMap<String, Seen>,
    index: usize,
) -> Option<GroupSpan> {
    let mut span: Option<GroupSpan> = None;
    for (uid, victim) in victims.iter().filter(|(_, victim)| victim.group == index) {
        let record = seen.get(uid).copied().unwrap_or_default();
        let gone = record.gone?;
        let moment = |(seq, at): (u64, SystemTime)| Moment {
            seq,
            at,
            pod: victim.name.clone(),
        };
        let terminating = moment(record.terminating.unwrap_or(gone));
        let gone = moment(gone);
        span = Some(match span {
            None => GroupSpan {
                pods: 1,
                first_terminating: terminating,
                last_gone: gone,
            },
            Some(span) => GroupSpan {
                pods: span.pods + 1,
                first_terminating: if terminating.seq < span.first_terminating.seq {
                    terminating
                } else {
                    span.first_terminating
                },
                last_gone: if gone.seq > span.last_gone.seq {
                    gone
                } else {
                    span.last_gone
                },
            },
        });
    }
    span
}

/// The victims (`namespace/name`) a fresh read of the API server still finds on the node.
async fn victims_left(stage: &Stage, victims: &HashMap<String, Victim>) -> Result<Vec<String>> {
    let pods = Api::<Pod>::all(stage.client().clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={NODE}")))
        .await
        .context("list the pods still on the node")?;
    Ok(pods
        .items
        .iter()
        .filter_map(|pod| victims.get(pod.metadata.uid.as_deref()?))
        .map(|victim| victim.name.clone())
        .collect())
}

/// The pods the agent must stop, by UID: everything bound to the node but its own pod and
/// pods already finished.
async fn pods_on_node(
    stage: &Stage,
    groups: &[(i32, Duration)],
    own_pod: &str,
) -> Result<HashMap<String, Victim>> {
    let pods = Api::<Pod>::all(stage.client().clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={NODE}")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|pod| pod.metadata.name.as_deref() != Some(own_pod))
        .filter(|pod| {
            !matches!(
                pod.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .map(|pod| {
            let priority = pod
                .spec
                .as_ref()
                .and_then(|spec| spec.priority)
                .unwrap_or(0);
            let group = group_of(groups, priority);
            let name = format!(
                "{}/{}",
                pod.metadata.namespace.clone().unwrap_or_default(),
                pod.metadata.name.clone().unwrap_or_default()
            );
            (pod.metadata.uid.unwrap_or_default(), Victim { name, group })
        })
        .collect())
}

/// KEP-2712: a pod belongs to the group with the highest priority not above its own; pods
/// below every group fall into the lowest.
fn group_of(groups: &[(i32, Duration)], priority: i32) -> usize {
    groups
        .iter()
        .rposition(|(group_priority, _)| *group_priority <= priority)
        .unwrap_or(0)
}

/// Watches the node's pods, noting (and printing) when each victim starts terminating and when
/// it is gone. Runs until dropped.
async fn record_pods(
    client: kube::Client,
    victims: &HashMap<String, Victim>,
    timeline: &Timeline,
    seen: &RefCell<HashMap<String, Seen>>,
    synced: tokio::sync::oneshot::Sender<()>,
) {
    let config = watcher::Config::default().fields(&format!("spec.nodeName={NODE}"));
    let mut events = watcher(Api::<Pod>::all(client), config).boxed();
    let mut synced = Some(synced);
    let mut seq = 0u64;
    while let Some(event) = events.next().await {
        let now = SystemTime::now();
        seq += 1;
        let (pod, gone) = match event {
            Ok(watcher::Event::InitDone) => {
                if let Some(synced) = synced.take() {
                    let _ = synced.send(());
                }
                continue;
            }
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))
                if pod.metadata.deletion_timestamp.is_some() =>
            {
                (pod, false)
            }
            Ok(watcher::Event::Delete(pod)) => (pod, true),
            _ => continue,
        };
        let uid = pod.metadata.uid.unwrap_or_default();
        let Some(victim) = victims.get(&uid) else {
            continue;
        };
        let mut seen = seen.borrow_mut();
        let record = seen.entry(uid).or_default();
        let slot = if gone {
            &mut record.gone
        } else {
            &mut record.terminating
        };
        if slot.is_none() {
            *slot = Some((seq, now));
            timeline.event(&format!(
                "  {} {}",
                victim.name,
                if gone { "gone" } else { "terminating" }
            ));
        }
    }
}

/// The node carries the agent's marks while it goes down (nothing clears them: the machine is
/// off; a new boot clears them).
async fn check_marks(stage: &Stage) -> Result<()> {
    let node = node(stage.client(), NODE).await?;
    let tainted = node
        .spec
        .and_then(|spec| spec.taints)
        .unwrap_or_default()
        .iter()
        .any(|taint| taint.key == SHUTTING_DOWN_TAINT && taint.effect == "NoSchedule");
    if !tainted {
        bail!("{NODE} lacks the taint {SHUTTING_DOWN_TAINT}:NoSchedule during its shutdown");
    }
    let condition = node_condition(stage.client(), NODE, "GracefulNodeShutdownInProgress").await?;
    let Some(condition) = condition.filter(|c| c.status == "True") else {
        bail!("{NODE} lacks the condition GracefulNodeShutdownInProgress=True during its shutdown");
    };
    stage.timeline.event(&format!(
        "{NODE} is marked: taint {SHUTTING_DOWN_TAINT}:NoSchedule, condition GracefulNodeShutdownInProgress=True ({})",
        condition.reason.unwrap_or_default()
    ));
    let status = stage.nodegrace(&["status", NODE]).await?;
    if !status.contains("shutting down") {
        bail!("kubectl nodegrace status does not show {NODE} shutting down:\n{status}");
    }
    stage
        .timeline
        .show(&condition_command(NODE, "GracefulNodeShutdownInProgress"));
    stage.timeline.show(&format!(
        "kubectl get events --field-selector involvedObject.name={NODE} --sort-by=.metadata.creationTimestamp"
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_join_the_highest_group_not_above_them() {
        let groups = [
            (0, Duration::from_secs(4)),
            (1000, Duration::from_secs(4)),
            (2_000_000_000, Duration::from_secs(3)),
        ];
        assert_eq!(group_of(&groups, -5), 0);
        assert_eq!(group_of(&groups, 100), 0);
        assert_eq!(group_of(&groups, 1000), 1);
        assert_eq!(group_of(&groups, 2_000_001_000), 2);
    }
}
