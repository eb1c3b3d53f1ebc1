//! The review decoder under generated input (the bench runs more: `cargo xtask bench
//! termination`).

#[path = "proofs/fuzz.rs"]
mod proof;

#[test]
fn the_review_decoder_answers_everything_without_a_panic() {
    let report = proof::run(20_000, true);
    println!(
        "fuzz cases={} panics={} (rejected {}, judged {}, refused {}, unjudged {})",
        report.cases,
        report.panics,
        report.rejected,
        report.judged,
        report.refused,
        report.unjudged
    );
    // Each kind of answer is reached, so the input is not all noise.
    assert!(report.judged > 0 && report.refused > 0 && report.unjudged > 0);
    assert_eq!(report.cases, 20_000);
    assert_eq!(report.panics, 0);
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
}
