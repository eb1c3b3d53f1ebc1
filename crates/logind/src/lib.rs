//! The node agents' layer: a client for systemd-logind (or elogind) on the system bus —
//! inhibitor locks, the shutdown signal, and the inhibit-delay setting the agents depend on —
//! and the agents' command-line options. Only the node agents link it (and with it zbus).

mod api;
pub mod cli;
mod delay;
mod events;
mod inhibitor;
mod kubelet_shutdown;
mod proxy;

use std::time::Duration;

use zbus::fdo::DBusProxy;
use zbus::names::BusName;
use zbus::proxy::CacheProperties;

pub use api::{LogindApi, LogindSource, SharedLogind};
pub use cli::{AgentArgs, LogindArgs};
pub use delay::{DelayConfig, DelayError, DelayOutcome, ensure_inhibit_delay};
pub use events::{ShutdownEvent, ShutdownEvents};
pub use inhibitor::{InhibitMode, Inhibitor, InhibitorLock};
pub use kubelet_shutdown::{
    KUBELET_DROP_IN, KUBELET_WHO, KubeletShutdownSign, describe_conflict, kubelet_shutdown_signs,
};

/// The well-known bus name logind owns.
pub const LOGIND_BUS_NAME: &str = "org.freedesktop.login1";

#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    #[error(
        "cannot connect to the system bus{}: {source} \
         (set DBUS_SYSTEM_BUS_ADDRESS, or mount the host's /run/dbus/system_bus_socket)",
        address.as_deref().map(|a| format!(" at {a}")).unwrap_or_default()
    )]
    Connect {
        address: Option<String>,
        #[source]
        source: zbus::Error,
    },
    #[error("logind is not running: nothing owns {LOGIND_BUS_NAME} on the system bus")]
    NotRunning,
    #[error("logind call {call} failed: {source}")]
    Call {
        call: &'static str,
        #[source]
        source: zbus::Error,
    },
}

fn call_error(call: &'static str) -> impl FnOnce(zbus::Error) -> LogindError {
    move |source| LogindError::Call { call, source }
}

/// Whether logind answered `InvalidArgs` (zbus gives the standard errors as `FDO`).
fn is_invalid_args(error: &zbus::Error) -> bool {
    match error {
        zbus::Error::MethodError(name, _, _) => {
            name.as_str() == "org.freedesktop.DBus.Error.InvalidArgs"
        }
        zbus::Error::FDO(error) => matches!(**error, zbus::fdo::Error::InvalidArgs(_)),
        _ => false,
    }
}

/// A connection to logind. Cheap to clone; clones share the bus connection.
#[derive(Debug, Clone)]
pub struct Logind {
    connection: zbus::Connection,
    manager: proxy::ManagerProxy<'static>,
}

impl Logind {
    /// Connects to the system bus named by `DBUS_SYSTEM_BUS_ADDRESS`, or the system default.
    pub async fn connect() -> Result<Self, LogindError> {
        let connection =
            zbus::Connection::system()
                .await
                .map_err(|source| LogindError::Connect {
                    address: std::env::var("DBUS_SYSTEM_BUS_ADDRESS").ok(),
                    source,
                })?;
        Self::from_connection(connection).await
    }

    /// Connects to the bus at `address` (a D-Bus address such as `unix:path=/run/x.sock`).
    pub async fn connect_to(address: &str) -> Result<Self, LogindError> {
        let connect_error = |source| LogindError::Connect {
            address: Some(address.to_owned()),
            source,
        };
        let connection = zbus::connection::Builder::address(address)
            .build()
            .await
            .map_err(connect_error)?;
        Self::from_connection(connection).await
    }

    async fn from_connection(connection: zbus::Connection) -> Result<Self, LogindError> {
        let manager = proxy::ManagerProxy::builder(&connection)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(call_error("create Manager proxy"))?;
        Ok(Self {
            connection,
            manager,
        })
    }

    /// Takes an inhibitor lock on `what` (e.g. `shutdown`, or `shutdown:sleep`).
    pub async fn inhibit(
        &self,
        what: &str,
        who: &str,
        why: &str,
        mode: InhibitMode,
    ) -> Result<InhibitorLock, LogindError> {
        let fd = self
            .manager
            .inhibit(what, who, why, mode.as_str())
            .await
            .map_err(call_error("Inhibit"))?;
        Ok(InhibitorLock::new(fd.into(), what, mode))
    }

    /// Whether a `block` inhibitor stops root's shutdown requests too: systemd 257 made it so
    /// and added the mode `block-weak` for the old behaviour. Probed by asking for a
    /// `block-weak` lock on `idle` (which no shutdown looks at), let go at once: a logind that
    /// refuses the mode as invalid is older, and there root passes a block.
    pub async fn block_binds_root(&self) -> Result<bool, LogindError> {
        let probe = self
            .manager
            .inhibit(
                "idle",
                "nodegrace probe",
                "whether block inhibitors bind root",
                "block-weak",
            )
            .await;
        match probe {
            Ok(lock) => {
                drop(lock);
                Ok(true)
            }
            Err(error) if is_invalid_args(&error) => Ok(false),
            Err(error) => Err(call_error("Inhibit")(error)),
        }
    }

    pub async fn list_inhibitors(&self) -> Result<Vec<Inhibitor>, LogindError> {
        let rows = self
            .manager
            .list_inhibitors()
            .await
            .map_err(call_error("ListInhibitors"))?;
        Ok(rows.into_iter().map(Inhibitor::from).collect())
    }

    /// The longest a delay inhibitor may hold up shutdown (`InhibitDelayMaxSec`).
    pub async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        let usec = self
            .manager
            .inhibit_delay_max_usec()
            .await
            .map_err(call_error("get InhibitDelayMaxUSec"))?;
        Ok(Duration::from_micros(usec))
    }

    /// Whether a shutdown is under way (PrepareForShutdown(true) was sent and not undone).
    pub async fn preparing_for_shutdown(&self) -> Result<bool, LogindError> {
        self.manager
            .preparing_for_shutdown()
            .await
            .map_err(call_error("get PreparingForShutdown"))
    }

    /// The PID of the process owning logind's bus name, as the bus daemon reports it.
    pub async fn owner_pid(&self) -> Result<u32, LogindError> {
        self.dbus()
            .await?
            .get_connection_unix_process_id(logind_name())
            .await
            .map_err(|e| match e {
                zbus::fdo::Error::NameHasNoOwner(_) => LogindError::NotRunning,
                other => call_error("GetConnectionUnixProcessID")(other.into()),
            })
    }

    /// Shutdown signals from logind, continuing across logind restarts.
    pub async fn shutdown_events(&self) -> Result<ShutdownEvents, LogindError> {
        ShutdownEvents::subscribe(self.connection.clone(), self.manager.clone()).await
    }

    async fn dbus(&self) -> Result<DBusProxy<'static>, LogindError> {
        DBusProxy::new(&self.connection)
            .await
            .map_err(call_error("create DBus proxy"))
    }
}

fn logind_name() -> BusName<'static> {
    BusName::from_static_str(LOGIND_BUS_NAME).expect("the logind bus name is valid")
}
