//! `cargo xtask logind demo`: the logind side of nodegrace, against a real elogind.
//!
//! Starts elogind on a private bus, raises its InhibitDelayMaxSec through a drop-in, takes a
//! delay and a block inhibitor, powers off, and shows the shutdown waiting for the delay lock.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use logind_harness::{LogindHarness, ScenarioOptions};
use nodegrace_logind::{DelayConfig, InhibitMode, Logind, ensure_inhibit_delay};

#[tokio::main]
async fn main() -> Result<()> {
    if let Some(reason) = logind_harness::skip_reason() {
        bail!("the demo needs a real logind: {reason}");
    }
    let started = Instant::now();
    let step = |what: &str| println!("[{:>6.3}s] {what}", started.elapsed().as_secs_f64());

    let harness = LogindHarness::start(ScenarioOptions {
        inhibit_delay_max: Duration::from_secs(2),
        ..ScenarioOptions::default()
    })
    .await
    .context("start elogind")?;
    step(&format!(
        "elogind {} is up on {}",
        harness.elogind_pid().await?,
        harness.bus_address()
    ));
    let logind = Logind::connect_to(harness.bus_address()).await?;
    step(&format!(
        "InhibitDelayMaxSec = {:?}",
        logind.inhibit_delay_max().await?
    ));

    let delay = DelayConfig {
        drop_in_dir: harness.drop_in_dir(),
        ..DelayConfig::default()
    };
    let outcome = ensure_inhibit_delay(&logind, Duration::from_secs(10), &delay).await?;
    step(&format!(
        "wrote {}/99-nodegrace.conf and reloaded elogind: InhibitDelayMaxSec = {:?}",
        harness.drop_in_dir().display(),
        outcome.reported
    ));

    let delay_lock = logind
        .inhibit(
            "shutdown",
            "nodegrace demo",
            "pods need time to stop",
            InhibitMode::Delay,
        )
        .await?;
    let block_lock = logind
        .inhibit(
            "sleep",
            "nodegrace demo",
            "a lease holder is busy",
            InhibitMode::Block,
        )
        .await?;
    step("inhibitors held:");
    for inhibitor in logind.list_inhibitors().await? {
        println!(
            "           {:<6} {:<9} who={:?} why={:?} pid={}",
            inhibitor.mode, inhibitor.what, inhibitor.who, inhibitor.why, inhibitor.pid
        );
    }

    let mut events = logind.shutdown_events().await?;
    step("PowerOff()");
    harness.power_off().await?;
    let event = tokio::time::timeout(Duration::from_secs(10), events.next())
        .await
        .context("no PrepareForShutdown within 10 s")?
        .context("the event stream ended")?;
    step(&format!("signal received: {event:?}"));
    step("shutdown is held by the delay lock while pods would stop (1 s here)");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let hook_ran_before_release = !harness.shutdown_hook_runs().is_empty();
    step(&format!(
        "shutdown proceeded yet? {}",
        if hook_ran_before_release {
            "yes (unexpected)"
        } else {
            "no"
        }
    ));

    let released = std::time::SystemTime::now();
    drop(delay_lock);
    step("delay lock released");
    let hook = harness
        .wait_for_shutdown_hook(Duration::from_secs(15))
        .await?;
    step(&format!(
        "shutdown hook ran {:.1} ms after the release (and cancelled the power-off)",
        hook.duration_since(released)
            .unwrap_or_default()
            .as_secs_f64()
            * 1000.0
    ));
    drop(block_lock);
    drop(harness);
    step("elogind and its bus stopped; nothing left running");
    Ok(())
}
