//! Prints the NodeDisruptionBudget CRD; `cargo xtask crd` writes it into the chart.

fn main() {
    print!("{}", termination_controller::api::crd_yaml());
}
