//! The skeleton binary as an operator runs it: its options and variables are the final ones,
//! and it says plainly that it does nothing yet.

#[test]
fn options_follow_the_scheme_and_the_run_stops_with_a_clear_message() -> anyhow::Result<()> {
    nodegrace_core::testing::check_skeleton_binary(
        env!("CARGO_BIN_EXE_out-of-service-gc"),
        "out-of-service-gc",
        9453,
    )
}
