//! The `logind-harness` command as people (and the test command's first step) run it.

use std::process::Command;

fn harness() -> Command {
    Command::new(env!("CARGO_BIN_EXE_logind-harness"))
}

#[test]
fn provision_unpacks_elogind_and_names_the_daemon() {
    let output = harness().arg("provision").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let daemon = stdout
        .trim()
        .strip_prefix("elogind ready: ")
        .unwrap_or_else(|| panic!("no daemon path in {stdout:?}"));
    assert!(
        std::path::Path::new(daemon).is_file(),
        "{daemon} is not a file"
    );
}

#[test]
fn an_unknown_command_is_refused_by_name_with_the_way_to_the_known_ones() {
    let output = harness().arg("start").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("unrecognized subcommand 'start'"),
        "{stderr}"
    );
    assert!(stderr.contains("--help"), "{stderr}");
    let help = harness().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for command in ["provision", "up", "down"] {
        assert!(help.contains(command), "{help}");
    }
}
