//! A wake-up of its own for each node waiting for its budgets' grants. The leader's pass wakes
//! only the nodes whose verdict it changed, and the node loop only those whose own Node or
//! grant changed: in a rollout of thousands, a node waiting its turn costs nothing per change
//! elsewhere. (Steps after the grant wake on every relevant change instead; there are only as
//! many of them as the budgets allow.)

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use tokio::sync::watch;

/// The waiting nodes, by Node UID.
#[derive(Debug, Default)]
pub struct Turns {
    waiting: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl Turns {
    /// Registers the node with `uid` as waiting until the returned [`Turn`] is dropped. A wake
    /// between this call and the first wait is not lost.
    pub fn wait(&self, uid: &str) -> Turn<'_> {
        let (sender, receiver) = watch::channel(());
        self.lock().insert(uid.to_owned(), sender);
        Turn {
            turns: self,
            uid: uid.to_owned(),
            receiver,
        }
    }

    /// Wakes the node with `uid`, if it waits.
    pub fn wake(&self, uid: &str) {
        if let Some(sender) = self.lock().get(uid) {
            sender.send_replace(());
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<()>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One node's wait; it leaves [`Turns`] when dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    turns: &'a Turns,
    uid: String,
    receiver: watch::Receiver<()>,
}

impl Turn<'_> {
    /// Until the node is woken.
    pub async fn woken(&mut self) {
        // The sender lives as long as this turn is registered, so this cannot fail.
        let _ = self.receiver.changed().await;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns.lock().remove(&self.uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_reaches_only_its_node_and_is_kept_until_waited_for() {
        let turns = Turns::default();
        let mut a = turns.wait("a");
        let b = turns.wait("b");
        turns.wake("a");
        a.woken().await;
        assert!(!b.receiver.has_changed().unwrap(), "b was not woken");
        drop(a);
        turns.wake("a");
        assert_eq!(turns.lock().len(), 1, "a left when its turn was dropped");
    }
}
