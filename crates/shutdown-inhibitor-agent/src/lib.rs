//! shutdown-inhibitor-agent
