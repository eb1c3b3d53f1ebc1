//! Every name this controller writes on objects or reads from them: the taint it acts on, the
//! Node labels and annotations of a fence, the conditions. A name seen on a node leads here.

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The taint an operator (or `--auto-taint-after`, or a fence) puts on a node that is shut
/// down for good.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
/// The effect the KEP asks for: it also makes the taint manager evict and keeps new pods off.
pub const EXPECTED_EFFECT: &str = "NoExecute";
/// The value `--auto-taint-after` and a fence give the taint, as the KEP's example.
pub const AUTO_TAINT_VALUE: &str = "nodeshutdown";

/// The taint `--auto-taint-after` and a fence put on a node, added at `added`.
pub fn auto_taint(added: jiff::Timestamp) -> Taint {
    Taint {
        key: OUT_OF_SERVICE_TAINT.to_owned(),
        value: Some(AUTO_TAINT_VALUE.to_owned()),
        effect: EXPECTED_EFFECT.to_owned(),
        time_added: Some(Time(added)),
    }
}

/// Set by an external fencing agent, or by our fence: the node's machine is powered off for
/// sure (its value is when).
pub const FENCED_ANNOTATION: &str = "nodegrace.io/fenced";
/// Where a fence stands (`fencing`, `fenced`, `recovering`, `recovery-failed`): a label, so
/// `--max-fenced` counts them with one fresh list by selector.
pub const FENCE_LABEL: &str = "nodegrace.io/fence";
/// When the fence's step began (RFC 3339).
pub const FENCE_SINCE_ANNOTATION: &str = "nodegrace.io/fence-since";
/// Set by an operator: never fence this node, only report that it would have been.
pub const DO_NOT_FENCE_ANNOTATION: &str = "nodegrace.io/do-not-fence";

/// Where the kubelets' heartbeat Leases live.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

/// The node condition of a tainted node's cleanup.
pub const CLEANUP_CONDITION: &str = "OutOfServiceCleanup";
/// The node condition that tells where a fence stands.
pub const FENCE_CONDITION: &str = "OutOfServiceFence";
