//! termination-controller
