//! The `/sim/v1` control endpoints for faults, so kubectl-driven and binary-driven tests can
//! inject them too (see README.md).

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::Deserialize;

use crate::faults::{ErrorRule, Faults};
use crate::store::Store;

#[derive(Debug, Clone)]
struct Control {
    faults: Faults,
    store: Store,
}

#[derive(Debug, Deserialize)]
struct Latency {
    milliseconds: u64,
}

#[derive(Debug, Deserialize)]
struct Outage {
    seconds: f64,
}

/// Routes under `/sim/v1/faults`.
pub fn router<S>(faults: Faults, store: Store) -> Router<S> {
    Router::new()
        .route("/sim/v1/faults", delete(clear))
        .route("/sim/v1/faults/latency", post(latency))
        .route("/sim/v1/faults/errors", post(errors))
        .route("/sim/v1/faults/close-watches", post(close_watches))
        .route("/sim/v1/faults/outage", post(outage))
        .route("/sim/v1/faults/expire-history", post(expire_history))
        .with_state(Control { faults, store })
}

async fn clear(State(control): State<Control>) -> StatusCode {
    control.faults.clear();
    StatusCode::NO_CONTENT
}

async fn latency(State(control): State<Control>, Json(latency): Json<Latency>) -> StatusCode {
    control
        .faults
        .set_latency(Duration::from_millis(latency.milliseconds));
    StatusCode::NO_CONTENT
}

async fn errors(State(control): State<Control>, Json(rule): Json<ErrorRule>) -> StatusCode {
    control.faults.add_rule(rule);
    StatusCode::NO_CONTENT
}

async fn close_watches(State(control): State<Control>) -> StatusCode {
    control.faults.close_watches();
    StatusCode::NO_CONTENT
}

async fn outage(State(control): State<Control>, Json(outage): Json<Outage>) -> StatusCode {
    control
        .faults
        .outage(Duration::from_secs_f64(outage.seconds.max(0.0)));
    StatusCode::NO_CONTENT
}

async fn expire_history(State(control): State<Control>) -> StatusCode {
    control.store.compact();
    control.faults.close_watches();
    StatusCode::NO_CONTENT
}
