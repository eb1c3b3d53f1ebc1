//! Which shutdown requests a `block` inhibitor stops, measured against the real elogind of the
//! test command (246.10): a block lock is held, then root asks for the shutdown the way each
//! client does, each in a fresh elogind (a shutdown that went through leaves logind shutting
//! down). "Proceeds" means logind went on to its last step (the shutdown hook ran; the hook
//! cancels the power-off). The table in docs/shutdown-inhibitor-agent.md is this test's.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use logind_harness::{LogindHarness, ScenarioOptions};
use nodegrace_logind::{InhibitMode, Logind};

/// How long a shutdown that goes through takes to reach the hook (milliseconds in practice).
const PROCEEDS_WITHIN: Duration = Duration::from_secs(10);

/// A fresh elogind with a shutdown block lock held; `None` where logind tests cannot run.
async fn blocked() -> Result<Option<(LogindHarness, nodegrace_logind::InhibitorLock)>> {
    let Some(logind) = LogindHarness::start_or_skip(ScenarioOptions::default()).await? else {
        return Ok(None);
    };
    let client = Logind::connect_to(logind.bus_address()).await?;
    let lock = client
        .inhibit("shutdown", "test", "a Lease is held", InhibitMode::Block)
        .await?;
    let rows = logind.list_inhibitors().await?;
    ensure!(
        rows.iter()
            .any(|row| row.0 == "shutdown" && row.3 == "block"),
        "{rows:?}"
    );
    Ok(Some((logind, lock)))
}

async fn proceeds(logind: &LogindHarness) -> Result<()> {
    logind
        .wait_for_shutdown_hook(PROCEEDS_WITHIN)
        .await
        .context("the shutdown should have gone through the block lock")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_powers_off_and_reboots_through_a_block_lock_over_d_bus() -> Result<()> {
    for (method, interactive) in [("PowerOff", false), ("PowerOff", true), ("Reboot", false)] {
        let Some((logind, _lock)) = blocked().await? else {
            return Ok(());
        };
        logind
            .call_manager(method, &(interactive,))
            .await
            .with_context(|| format!("{method}({interactive})"))?;
        proceeds(&logind)
            .await
            .with_context(|| format!("{method}({interactive})"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elogind_has_no_flags_method_so_no_client_can_ask_root_to_be_checked() -> Result<()> {
    let Some((logind, _lock)) = blocked().await? else {
        return Ok(());
    };
    // What `systemctl --check-inhibitors=yes` sends (SD_LOGIND_ROOT_CHECK_INHIBITORS = 1).
    let refused = logind
        .call_manager("PowerOffWithFlags", &(1_u64,))
        .await
        .err()
        .context("elogind 246 has no PowerOffWithFlags")?;
    ensure!(refused.to_string().contains("Unknown method"), "{refused}");
    ensure!(logind.shutdown_hook_runs().is_empty(), "nothing went ahead");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loginctl_as_root_powers_off_through_a_block_lock_with_or_without_a_terminal() -> Result<()>
{
    for on_terminal in [false, true] {
        let Some((logind, _lock)) = blocked().await? else {
            return Ok(());
        };
        let (bin, library_path) = logind.elogind_tools();
        let loginctl = bin.join("loginctl");
        let mut command = if on_terminal {
            // `script` gives loginctl a terminal, as an operator at a console has.
            let mut script = Command::new("script");
            script.args([
                "-qec",
                &format!("{} poweroff", loginctl.display()),
                "/dev/null",
            ]);
            script
        } else {
            let mut direct = Command::new(&loginctl);
            direct.arg("poweroff");
            direct
        };
        let output = command
            .env("LD_LIBRARY_PATH", &library_path)
            .env("DBUS_SYSTEM_BUS_ADDRESS", logind.bus_address())
            .stdin(std::process::Stdio::null())
            .output()
            .context("run loginctl")?;
        if !output.status.success() {
            bail!(
                "loginctl poweroff (terminal: {on_terminal}) failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        proceeds(&logind)
            .await
            .with_context(|| format!("loginctl poweroff, terminal: {on_terminal}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elogind_knows_no_block_weak_mode_which_the_agent_reads_as_root_passes() -> Result<()> {
    let Some(logind) = LogindHarness::start_or_skip(ScenarioOptions::default()).await? else {
        return Ok(());
    };
    let refused = logind
        .call_manager("Inhibit", &("idle", "test", "probe", "block-weak"))
        .await
        .err()
        .context("elogind 246 refuses block-weak")?;
    ensure!(
        refused
            .to_string()
            .contains("Invalid mode specification block-weak"),
        "{refused}"
    );
    let client = Logind::connect_to(logind.bus_address()).await?;
    ensure!(
        !client.block_binds_root().await?,
        "the probe reads an older logind"
    );
    ensure!(
        logind.list_inhibitors().await?.is_empty(),
        "the probe leaves no lock behind"
    );
    Ok(())
}
