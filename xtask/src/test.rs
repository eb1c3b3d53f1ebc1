//! `cargo xtask test`: the one command CI and people run. It installs what the tests need
//! (idempotently), then runs every check a change must pass.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::{
    actionlint, cargo, disk, e2e, explore, helm, image, peer_tests, run_command, setup, target_dir,
};

/// The workspace's libraries, whose docs must build without a warning.
const LIBRARIES: [&str; 4] = [
    "nodegrace-core",
    "nodegrace-logind",
    "nodegrace-controller",
    "nodegrace-testing",
];

pub fn run() -> Result<()> {
    let mut steps = Steps::default();
    let result = run_steps(&mut steps);
    steps.print();
    result
}

fn run_steps(steps: &mut Steps) -> Result<()> {
    let mut step = |name, body: &mut dyn FnMut() -> Result<()>| steps.run(name, body);
    step("disk", &mut disk::ensure_room_for_a_test_run)?;
    step("system packages", &mut setup::ensure_system_packages)?;
    step("nextest", &mut ensure_nextest)?;
    step("helm", &mut || helm::ensure_helm().map(drop))?;
    step("format", &mut || {
        run_command(cargo().args(["fmt", "--all", "--", "--check"]))
    })?;
    // The images' build (their size-optimised profile: fat LTO, one codegen unit) starts
    // first, at nice 19: it takes what the other steps leave of the cores. As their equal
    // beside the compile steps it took half of them there and then finished with the cores
    // idle (from nothing 902 s in all, against 750 s started after the tests' build).
    let images_build = image::start_binaries_build(&image::PROGRAMS)?;
    step("clippy", &mut || {
        run_command(cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("docs", &mut || {
        run_command(
            cargo()
                .args(["doc", "--no-deps"])
                .args(LIBRARIES.iter().flat_map(|library| ["--package", library]))
                .env("RUSTDOCFLAGS", "-D warnings"),
        )
    })?;
    step("charts", &mut helm::check_charts)?;
    step("workflows", &mut actionlint::check_workflows)?;
    // Built apart from the run (nextest builds exactly this) so the two times show apart.
    step("build tests", &mut || {
        run_command(cargo().args(["test", "--workspace", "--no-run", "--quiet"]))
    })?;
    // Unpacking elogind once up front keeps that download out of the first test's time. The
    // command is the one the tests' build made (its own `cargo run` compiled a dozen crates
    // again, with the features of that package alone: 17 s from nothing).
    step("provision elogind", &mut || {
        run_command(Command::new(crate::demo::binary("logind-harness")).arg("provision"))
    })?;
    // From here on the steps mostly wait (kube-sim's timers, real elogind, the explorer's
    // histories): the images' build, still going, takes the cores they leave.
    // termination-controller's `providers` suite runs once, in the e2e step (against the same
    // built binary), where its figures are printed: running it here as well cost ~20 s.
    // Four at once on two cores: two at once kept the cores 39 % busy (the tests wait on
    // kube-sim's timers, real elogind and child processes far more than they compute).
    step("tests", &mut || {
        nextest(
            4,
            "not (package(termination-controller) and test(/^providers::/)) and not test(/^storms::/)",
        )
    })?;
    // The storm tests each watch a refusing provider for 24 s of real time and compute almost
    // nothing meanwhile: eight at once (they passed so on two cores, and each bound is an upper
    // bound that a slow machine only makes easier).
    step("storm tests", &mut || nextest(8, "test(/^storms::/)"))?;
    step("peer tests", &mut peer_tests::run_after_tests)?;
    // The README's first command is the e2e's story with all four charts; e2e adds each chart
    // alone and the least-privilege proof, against the built binaries.
    step("e2e", &mut e2e::run_after_tests)?;
    // Random histories of the seeds on record, against the same binaries.
    step("explore", &mut explore::fixed_seeds_after_tests)?;
    // What the images ship: the programs built with the size-optimised `image` profile.
    let mut images_build = Some(images_build);
    step("images", &mut || {
        if let Some(build) = images_build.take() {
            build.wait()?;
        }
        let built = image::build_all(&image::PROGRAMS)?;
        image::check_all(&built)
    })?;
    step("stray processes", &mut check_no_stray_processes)?;
    Ok(())
}

/// The workspace's tests that `filter` selects, `threads` at once, every failure reported.
fn nextest(threads: usize, filter: &str) -> Result<()> {
    run_command(cargo().args([
        "nextest",
        "run",
        "--workspace",
        "--no-fail-fast",
        &format!("--test-threads={threads}"),
        "-E",
        filter,
    ]))
}

fn ensure_nextest() -> Result<()> {
    let have = cargo()
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !have {
        run_command(cargo().args(["install", "cargo-nextest", "--locked"]))?;
    }
    Ok(())
}

/// Each step's wall time and how busy it kept the machine's cores, printed at the end (also
/// after a failure): what a run from nothing spends its time on, and whether a step waits
/// (cores idle: run more at once) or computes (cores full: do less).
#[derive(Default)]
struct Steps {
    took: Vec<(&'static str, Duration, Option<f64>)>,
    started: Option<Instant>,
}

impl Steps {
    fn run(&mut self, name: &'static str, body: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        println!("==> {name}");
        self.started.get_or_insert_with(Instant::now);
        let started = Instant::now();
        let before = CpuTicks::now();
        let result = body();
        let busy = before.zip(CpuTicks::now()).map(|(a, b)| a.busy_until(&b));
        self.took.push((name, started.elapsed(), busy));
        result.map_err(|e| e.context(format!("step `{name}` failed")))
    }

    fn print(&self) {
        println!("\n==> time per step (cores busy: the whole machine's, the background build too)");
        for (name, took, busy) in &self.took {
            let busy = busy.map_or_else(String::new, |busy| format!("{:>4.0} %", busy * 100.0));
            println!("{:>8.1} s  {busy:>6}  {name}", took.as_secs_f64());
        }
        if let Some(started) = self.started {
            println!("{:>8.1} s  in all", started.elapsed().as_secs_f64());
        }
    }
}

/// The logind harness and the demo promise a clean teardown; a leftover elogind, bus daemon,
/// cluster or agent from the suite is a bug, so it fails the run.
fn check_no_stray_processes() -> Result<()> {
    const OURS: [&str; 9] = [
        "elogind",
        "dbus-daemon",
        "kube-sim",
        "graceful-shutdown-agent",
        "shutdown-inhibitor-agent",
        "out-of-service-gc",
        "termination-controller",
        "nodegrace-demo",
        "nodegrace-explore",
    ];
    let target = target_dir();
    let out = Command::new("ps").args(["-eo", "pid,args"]).output()?;
    let listing = String::from_utf8_lossy(&out.stdout);
    let strays: Vec<&str> = listing
        .lines()
        .filter(|line| line.contains(&*target.to_string_lossy()))
        .filter(|line| OURS.iter().any(|name| line.contains(name)))
        .collect();
    if strays.is_empty() {
        println!("no stray processes");
        Ok(())
    } else {
        bail!(
            "processes left behind by the test suite:\n{}",
            strays.join("\n")
        )
    }
}

/// The machine's CPU time so far, from the `cpu` line of /proc/stat.
struct CpuTicks {
    busy: u64,
    all: u64,
}

impl CpuTicks {
    fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> = stat
            .lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        // user nice system idle iowait irq softirq steal: idle and iowait are the waiting.
        let all: u64 = fields.iter().take(8).sum();
        let waiting = fields.get(3)? + fields.get(4)?;
        Some(Self {
            busy: all - waiting,
            all,
        })
    }

    /// The share of the cores busy between `self` and `later`.
    #[allow(clippy::cast_precision_loss)]
    fn busy_until(&self, later: &Self) -> f64 {
        let all = later.all.saturating_sub(self.all);
        if all == 0 {
            return 0.0;
        }
        later.busy.saturating_sub(self.busy) as f64 / all as f64
    }
}
