//! The logind client against a real elogind (see the logind-harness crate).

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use futures::StreamExt;
use logind_harness::{LogindHarness, ScenarioOptions};
use nodegrace_logind::{
    DelayConfig, InhibitMode, Logind, ShutdownEvent, ShutdownEvents, ensure_inhibit_delay,
};
use nodegrace_testing::wait_for;

const WHO: &str = "nodegrace test";

async fn scenario(inhibit_delay_max_sec: u64) -> Result<Option<(LogindHarness, Logind)>> {
    let options = ScenarioOptions {
        inhibit_delay_max: Duration::from_secs(inhibit_delay_max_sec),
        ..ScenarioOptions::default()
    };
    let Some(harness) = LogindHarness::start_or_skip(options).await? else {
        return Ok(None);
    };
    let logind = Logind::connect_to(harness.bus_address()).await?;
    Ok(Some((harness, logind)))
}

async fn next_event(events: &mut ShutdownEvents) -> Result<ShutdownEvent> {
    tokio::time::timeout(Duration::from_secs(20), events.next())
        .await
        .context("no shutdown event within 20 s")?
        .context("the shutdown event stream ended")
}

async fn wait_for_inhibitors(
    harness: &LogindHarness,
    what_we_expect: impl Fn(&[(String, String, String, String, u32, u32)]) -> bool,
) -> Result<()> {
    let what_we_expect = &what_we_expect;
    wait_for("the expected inhibitors", || async move {
        Ok(what_we_expect(&harness.list_inhibitors().await?))
    })
    .await
}

#[tokio::test]
async fn released_delay_lock_lets_shutdown_proceed_at_once() -> Result<()> {
    let Some((harness, logind)) = scenario(30).await? else {
        return Ok(());
    };
    let lock = logind
        .inhibit("shutdown", WHO, "stopping pods", InhibitMode::Delay)
        .await?;
    let mut events = logind.shutdown_events().await?;
    harness.power_off().await?;
    assert_eq!(
        next_event(&mut events).await?,
        ShutdownEvent::PrepareForShutdown(true)
    );
    assert!(logind.preparing_for_shutdown().await?);
    assert!(
        harness.shutdown_hook_runs().is_empty(),
        "the delay lock must hold shutdown"
    );

    let released_at = SystemTime::now();
    drop(lock);
    let hook_ran_at = harness
        .wait_for_shutdown_hook(Duration::from_secs(10))
        .await?;
    // logind would hold the shutdown for 30 s; proceeding within the 10 s wait, and only after
    // the release, shows the release let it go. How fast is measured by `cargo xtask bench`.
    assert!(
        hook_ran_at >= released_at,
        "shutdown proceeded before the lock was released"
    );
    Ok(())
}

#[tokio::test]
async fn unreleased_delay_lock_holds_shutdown_for_inhibit_delay_max() -> Result<()> {
    let Some((harness, logind)) = scenario(2).await? else {
        return Ok(());
    };
    let _lock = logind
        .inhibit("shutdown", WHO, "never lets go", InhibitMode::Delay)
        .await?;
    let powered_off_at = SystemTime::now();
    harness.power_off().await?;
    let hook_ran_at = harness
        .wait_for_shutdown_hook(Duration::from_secs(20))
        .await?;
    let held_for = hook_ran_at.duration_since(powered_off_at)?;
    assert!(
        held_for >= Duration::from_millis(1900) && held_for < Duration::from_secs(10),
        "shutdown was held {held_for:?}, expected about InhibitDelayMaxSec = 2 s"
    );
    Ok(())
}

#[tokio::test]
async fn delay_configuration_raises_a_small_inhibit_delay_through_a_drop_in() -> Result<()> {
    let Some((harness, logind)) = scenario(1).await? else {
        return Ok(());
    };
    assert_eq!(logind.inhibit_delay_max().await?, Duration::from_secs(1));
    let config = DelayConfig {
        drop_in_dir: harness.drop_in_dir(),
        file_name: "99-nodegrace.conf".to_owned(),
        reload_timeout: Duration::from_secs(10),
    };
    let outcome = ensure_inhibit_delay(&logind, Duration::from_secs(42), &config).await?;
    assert!(outcome.drop_in_written);
    assert_eq!(outcome.reported, Duration::from_secs(42));
    assert_eq!(outcome.effective, Duration::from_secs(42));
    assert_eq!(logind.inhibit_delay_max().await?, Duration::from_secs(42));
    let written = std::fs::read_to_string(harness.drop_in_dir().join("99-nodegrace.conf"))?;
    assert!(written.contains("[Login]\nInhibitDelayMaxSec=42\n"));

    // Already enough: nothing is written again.
    let again = ensure_inhibit_delay(&logind, Duration::from_secs(30), &config).await?;
    assert!(!again.drop_in_written);
    assert_eq!(again.effective, Duration::from_secs(30));
    Ok(())
}

#[tokio::test]
async fn delay_configuration_reports_a_reduced_budget_when_logind_does_not_follow() -> Result<()> {
    let Some((_harness, logind)) = scenario(3).await? else {
        return Ok(());
    };
    // A directory elogind never reads stands for a drop-in that a later one overrides.
    let ignored = tempfile::tempdir()?;
    let config = DelayConfig {
        drop_in_dir: ignored.path().to_path_buf(),
        file_name: "99-nodegrace.conf".to_owned(),
        reload_timeout: Duration::from_millis(300),
    };
    let outcome = ensure_inhibit_delay(&logind, Duration::from_secs(60), &config).await?;
    assert!(outcome.drop_in_written);
    assert!(outcome.is_reduced());
    assert_eq!(outcome.effective, Duration::from_secs(3));
    Ok(())
}

#[tokio::test]
async fn block_lock_is_listed_and_goes_away_on_drop() -> Result<()> {
    let Some((harness, logind)) = scenario(5).await? else {
        return Ok(());
    };
    let lock = logind
        .inhibit("shutdown", WHO, "a backup is running", InhibitMode::Block)
        .await?;
    let listed = logind.list_inhibitors().await?;
    let ours: Vec<_> = listed.iter().filter(|i| i.who == WHO).collect();
    assert_eq!(ours.len(), 1, "{listed:?}");
    assert_eq!(ours[0].mode, "block");
    assert_eq!(ours[0].what, "shutdown");
    assert_eq!(ours[0].why, "a backup is running");
    assert_eq!(ours[0].pid, std::process::id());

    drop(lock);
    wait_for_inhibitors(&harness, |rows| rows.iter().all(|row| row.1 != WHO)).await
}

#[tokio::test]
async fn the_event_stream_and_open_locks_survive_a_logind_restart() -> Result<()> {
    let Some((mut harness, logind)) = scenario(30).await? else {
        return Ok(());
    };
    let mut events = logind.shutdown_events().await?;
    let before = harness.elogind_pid().await?;
    let kept_open = logind
        .inhibit("shutdown", WHO, "before the restart", InhibitMode::Delay)
        .await?;
    let closed_while_down = logind
        .inhibit(
            "shutdown",
            WHO,
            "closed while logind is down",
            InhibitMode::Block,
        )
        .await?;

    harness.stop_elogind().await?;
    drop(closed_while_down);
    harness.restart().await?;
    assert_eq!(next_event(&mut events).await?, ShutdownEvent::LogindStopped);
    assert_eq!(next_event(&mut events).await?, ShutdownEvent::LogindStarted);
    assert_ne!(harness.elogind_pid().await?, before);
    assert_eq!(logind.owner_pid().await?, harness.elogind_pid().await?);
    // elogind restores the inhibitors in /run/systemd/inhibit whose fd is still open: a lock
    // survives a logind restart, and goes when its holder closes it.
    let listed = harness.list_inhibitors().await?;
    let ours: Vec<&str> = listed
        .iter()
        .filter(|row| row.1 == WHO)
        .map(|row| row.2.as_str())
        .collect();
    assert_eq!(ours, ["before the restart"], "{listed:?}");
    drop(kept_open);
    wait_for_inhibitors(&harness, |rows| !rows.iter().any(|row| row.1 == WHO)).await?;

    let lock = logind
        .inhibit("shutdown", WHO, "after the restart", InhibitMode::Delay)
        .await?;
    wait_for_inhibitors(&harness, |rows| {
        rows.iter()
            .any(|row| row.1 == WHO && row.2 == "after the restart")
    })
    .await?;
    harness.power_off().await?;
    assert_eq!(
        next_event(&mut events).await?,
        ShutdownEvent::PrepareForShutdown(true)
    );
    drop(lock);
    harness
        .wait_for_shutdown_hook(Duration::from_secs(10))
        .await?;
    Ok(())
}
