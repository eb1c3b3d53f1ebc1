//! Kubernetes helpers.
