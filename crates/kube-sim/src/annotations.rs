//! The annotations a test sets to steer the simulated machines, kubelets and containers. A
//! leaf: the world acts on them and the audit reads them, and neither imports the other for
//! them.

/// Node annotation: `stopped` makes the node's kubelet stop (no lease renewal, no pod changes,
/// its containers killed); `partitioned` cuts it off from the API server (it writes nothing,
/// its containers run on); `booting` (set by a power-on) makes it report, then drop the
/// annotation and run its pods.
pub const KUBELET_ANNOTATION: &str = "sim.nodegrace.io/kubelet";
/// Node annotation `never`: the machine powers on, but its OS never comes up (a broken disk, a
/// kernel that panics): the kubelet stays stopped.
pub const BOOTS_ANNOTATION: &str = "sim.nodegrace.io/boots";
/// Node annotation: seconds (may be negative or fractional) the node's clock is off the true
/// time; its kubelet writes its Lease `renewTime` by that clock.
pub const CLOCK_SKEW_ANNOTATION: &str = "sim.nodegrace.io/clock-skew-seconds";
/// Pod annotation: seconds its containers take to exit after SIGTERM (default 0).
pub const STOP_SECONDS_ANNOTATION: &str = "sim.nodegrace.io/stop-seconds";
/// Pod annotation: seconds from Running to Ready (default 0).
pub const READY_AFTER_ANNOTATION: &str = "sim.nodegrace.io/ready-after-seconds";
