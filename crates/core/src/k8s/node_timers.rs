//! A timer per Node object, where a name's change replaces whatever was due for that name: the
//! leader loops' NotReady, auto-taint and fencing checks. Keyed by [`NodeIdentity`], so an
//! expiry names the very object it was set for, never a namesake registered since.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use tokio_util::time::{DelayQueue, delay_queue};

use crate::k8s::node_identity::NodeIdentity;

#[derive(Debug, Default)]
pub struct NodeTimers {
    queue: DelayQueue<NodeIdentity>,
    keys: BTreeMap<NodeIdentity, delay_queue::Key>,
}

impl NodeTimers {
    /// Sets `node`'s timer to fire after `wait`, dropping every timer of its name.
    pub fn set(&mut self, node: NodeIdentity, wait: Duration) {
        self.clear(node.name());
        let key = self.queue.insert(node.clone(), wait);
        self.keys.insert(node, key);
    }

    /// Drops the timers of every Node object named `name`.
    pub fn clear(&mut self, name: &str) {
        let named: Vec<NodeIdentity> = self
            .keys
            .range(NodeIdentity::all_named(name))
            .map(|(node, _)| node.clone())
            .collect();
        for node in named {
            if let Some(key) = self.keys.remove(&node) {
                self.queue.remove(&key);
            }
        }
    }

    /// Whether a timer of some Node object named `name` is set.
    pub fn has(&self, name: &str) -> bool {
        self.keys
            .range(NodeIdentity::all_named(name))
            .next()
            .is_some()
    }

    /// The next node whose timer fired; `None` while none is set (a `select!` branch on it is
    /// then disabled).
    pub async fn expired(&mut self) -> Option<NodeIdentity> {
        let node = self.queue.next().await?.into_inner();
        self.keys.remove(&node);
        Some(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_names_timer_replaces_its_namesakes_and_fires_for_its_own_node() {
        let mut timers = NodeTimers::default();
        timers.set(NodeIdentity::new("node-1", "old"), Duration::from_secs(5));
        timers.set(NodeIdentity::new("node-10", "a"), Duration::from_secs(20));
        timers.set(NodeIdentity::new("node-1", "new"), Duration::from_secs(10));
        assert!(timers.has("node-1") && !timers.has("node-2"));
        let first = timers.expired().await.unwrap();
        assert_eq!((first.name(), first.uid()), ("node-1", "new"));
        assert!(!timers.has("node-1"), "a fired timer is gone");
        timers.clear("node-10");
        assert!(timers.expired().await.is_none(), "nothing is left");
    }
}
