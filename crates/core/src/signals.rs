//! signals
