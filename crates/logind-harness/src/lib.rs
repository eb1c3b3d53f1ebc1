//! Real elogind harness.
