//! The set of objects a control loop has yet to look at again. Each program's watches mark
//! what changed; its loop takes the marks when woken, so one change costs a look at one
//! object, never a rescan of them all.

use std::collections::HashSet;
use std::sync::PoisonError;

use tokio::sync::Notify;

/// Names of objects that changed since a loop last looked: a watch's observer marks them, the
/// loop takes them when woken, so one change never costs a rescan of every object.
#[derive(Debug, Default)]
pub struct Dirty {
    names: std::sync::Mutex<HashSet<String>>,
    notify: Notify,
}

impl Dirty {
    pub fn mark(&self, name: &str) {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_owned());
        self.notify.notify_one();
    }

    /// The names marked since the last call.
    pub fn take(&self) -> HashSet<String> {
        std::mem::take(&mut *self.names.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Waits for the next mark (one made since the last wait counts).
    pub async fn marked(&self) {
        self.notify.notified().await;
    }
}
