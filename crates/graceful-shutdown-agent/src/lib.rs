//! graceful-shutdown-agent
