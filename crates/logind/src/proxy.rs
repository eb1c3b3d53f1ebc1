//! Typed D-Bus proxy for the part of `org.freedesktop.login1.Manager` the agents use.

use zbus::{OwnedFd, proxy};

/// One row of `ListInhibitors`: what, who, why, mode, uid, pid.
pub type InhibitorRow = (String, String, String, String, u32, u32);

#[proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
pub trait Manager {
    /// Takes an inhibitor lock; it lives exactly as long as the returned fd stays open.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;

    fn list_inhibitors(&self) -> zbus::Result<Vec<InhibitorRow>>;

    /// logind changes this on reload without PropertiesChanged, so the proxy is built uncached.
    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    #[zbus(property)]
    fn preparing_for_shutdown(&self) -> zbus::Result<bool>;

    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
}
