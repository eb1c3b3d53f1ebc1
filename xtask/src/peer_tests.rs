//! `cargo xtask peer-tests`: kube-rs's own cluster tests (those its crates mark
//! `#[ignore = "needs cluster …"]`), built from the published kube and kube-client sources in
//! the cargo registry and run against a fresh `kube-sim serve`. A test that kube-sim cannot
//! honestly serve (a container runtime, certificate signing) is skipped by name, with why.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::{cargo, project_root, run_command, target_dir};

const KUBE_VERSION: &str = "5.0.0";

struct Suite {
    krate: &'static str,
    features: &'static str,
    /// Appended to the published manifest so its tests build outside kube-rs's workspace.
    manifest_additions: &'static str,
    not_applicable: &'static [(&'static str, &'static str)],
}

const SUITES: [Suite; 2] = [
    Suite {
        krate: "kube",
        features: "derive,runtime",
        manifest_additions: "",
        not_applicable: &[],
    },
    Suite {
        krate: "kube-client",
        features: "client,ws,kubelet-debug,rustls-tls,jsonpatch,gzip",
        // Two tests use the `kube` facade crate, a dev-dependency only inside kube-rs's workspace.
        manifest_additions: "\n[dev-dependencies.kube]\nversion = \"=5.0.0\"\n",
        not_applicable: &[
            (
                "test::pod_can_exec_and_write_to_stdin",
                "exec needs a container runtime",
            ),
            (
                "test::pod_can_exec_and_write_to_stdin_from_node_proxy",
                "exec through the kubelet's debug port needs a container runtime",
            ),
            (
                "test::can_operate_on_ephemeral_containers",
                "ephemeral containers need a container runtime",
            ),
            (
                "test::csr_can_be_approved",
                "kube-sim signs no certificates",
            ),
        ],
    },
];

pub fn run() -> Result<()> {
    run_command(cargo().args(["build", "--quiet", "--package", "kube-sim"]))?;
    run_after_tests()
}

/// The suites against the kube-sim the test command's test build left (see
/// [`crate::demo::Binaries`]: building it alone would rebuild what that build unified).
pub fn run_after_tests() -> Result<()> {
    let simulator = target_dir().join("debug/kube-sim");
    ensure!(
        simulator.is_file(),
        "{} is not built: `cargo build -p kube-sim`",
        simulator.display()
    );
    let work = target_dir().join("peer-tests");
    let mut failures = Vec::new();
    for suite in &SUITES {
        let crate_dir = prepare(suite, &work)?;
        let outcome = run_suite(suite, &crate_dir, &simulator, &work)?;
        println!(
            "peer-tests {} {KUBE_VERSION}: passed={} failed={} not-applicable={}",
            suite.krate,
            outcome.passed,
            outcome.failed,
            suite.not_applicable.len()
        );
        for (test, why) in suite.not_applicable {
            println!("  not applicable: {test} ({why})");
        }
        if outcome.failed > 0 {
            failures.push(suite.krate);
        }
    }
    ensure!(failures.is_empty(), "peer tests failed in {failures:?}");
    Ok(())
}

/// The published crate's sources, as cargo unpacked them for our own build.
fn registry_source(krate: &str) -> Result<PathBuf> {
    let home = std::env::var_os("CARGO_HOME").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cargo"),
        PathBuf::from,
    );
    let wanted = format!("{krate}-{KUBE_VERSION}");
    let find = || -> Option<PathBuf> {
        std::fs::read_dir(home.join("registry/src"))
            .ok()?
            .flatten()
            .map(|index| index.path().join(&wanted))
            .find(|path| path.join("Cargo.toml").is_file())
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    run_command(cargo().args(["fetch", "--quiet"]))?;
    find().with_context(|| {
        format!(
            "{wanted} is not in {}/registry/src after cargo fetch",
            home.display()
        )
    })
}

/// The workspace's `dev` profile tables, as Cargo.toml has them: a crate built outside the
/// workspace must repeat them for its dependencies' builds to be the ones our tests' build left.
fn dev_profile() -> Result<String> {
    let manifest = std::fs::read_to_string(project_root().join("Cargo.toml"))?;
    let mut tables = String::from("\n");
    let mut inside = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            inside = line.starts_with("[profile.dev]") || line.starts_with("[profile.dev.");
        }
        if inside {
            tables.push_str(line);
            tables.push('\n');
        }
    }
    ensure!(
        tables.contains("[profile.dev]"),
        "Cargo.toml has no [profile.dev]"
    );
    Ok(tables)
}

/// A writable copy of the crate, with the manifest additions, outside our workspace.
fn prepare(suite: &Suite, work: &Path) -> Result<PathBuf> {
    let source = registry_source(suite.krate)?;
    let copy = work.join(suite.krate);
    if copy.exists() {
        std::fs::remove_dir_all(&copy)?;
    }
    copy_tree(&source, &copy)?;
    let manifest = copy.join("Cargo.toml");
    let mut text = std::fs::read_to_string(&manifest)?;
    text.push_str(suite.manifest_additions);
    text.push_str("\n[workspace]\n");
    text.push_str(&dev_profile()?);
    std::fs::write(&manifest, text)?;
    // Our lockfile pins the versions kube-rs's tests build with to those we already use.
    std::fs::copy(project_root().join("Cargo.lock"), copy.join("Cargo.lock"))?;
    Ok(copy)
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
            let mut permissions = std::fs::metadata(&target)?.permissions();
            #[allow(clippy::permissions_set_readonly_false)]
            permissions.set_readonly(false);
            std::fs::set_permissions(&target, permissions)?;
        }
    }
    Ok(())
}

struct Outcome {
    passed: usize,
    failed: usize,
}

/// A kube-sim for one suite; killed when dropped.
struct Simulator {
    child: Child,
}

impl Drop for Simulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_simulator(binary: &Path, kubeconfig: &Path) -> Result<Simulator> {
    let _ = std::fs::remove_file(kubeconfig);
    let child = Command::new(binary)
        .args(["serve", "--nodes", "2", "--run-image", "busybox:*=/bin"])
        .arg("--kubeconfig-out")
        .arg(kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("could not start {}", binary.display()))?;
    let mut simulator = Simulator { child };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !kubeconfig.exists() {
        if simulator.child.try_wait()?.is_some() || Instant::now() > deadline {
            bail!("kube-sim did not write its kubeconfig");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(simulator)
}

fn run_suite(suite: &Suite, crate_dir: &Path, simulator: &Path, work: &Path) -> Result<Outcome> {
    let kubeconfig = work.join(format!("{}.kubeconfig", suite.krate));
    let _simulator = start_simulator(simulator, &kubeconfig)?;
    let mut command = cargo();
    command
        .current_dir(crate_dir)
        .env("KUBECONFIG", &kubeconfig)
        // Our target directory: with our lockfile and `dev` profile, every dependency built
        // with the features our tests' build gave it is that build's, not compiled again.
        .env("CARGO_TARGET_DIR", target_dir())
        .args([
            "test",
            "--quiet",
            "--lib",
            "--features",
            suite.features,
            "--",
        ])
        .args(["--ignored", "--test-threads=1"]);
    for (test, _) in suite.not_applicable {
        command.args(["--skip", test]);
    }
    let output = command
        .output()
        .with_context(|| format!("could not run the {} tests", suite.krate))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let summary = stdout
        .lines()
        .find(|line| line.starts_with("test result:"))
        .with_context(|| {
            format!(
                "the {} tests did not run:\n{}",
                suite.krate,
                String::from_utf8_lossy(&output.stderr)
            )
        })?;
    // "test result: ok. 14 passed; 0 failed; 0 ignored; …"
    let count = |label: &str| -> usize {
        summary
            .split(';')
            .find_map(|part| {
                let mut words = part.split_whitespace().rev();
                let (found, number) = (words.next()?, words.next()?);
                (found == label).then(|| number.parse().ok()).flatten()
            })
            .unwrap_or(0)
    };
    let outcome = Outcome {
        passed: count("passed"),
        failed: count("failed"),
    };
    if outcome.failed > 0 {
        println!("{stdout}");
    }
    Ok(outcome)
}
