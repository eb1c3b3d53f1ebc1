//! Drives the webhook's review decoder with generated input: random bytes, valid reviews with
//! fields replaced, removed or retyped, truncated and bit-flipped bodies, deep nesting. Every
//! case must be answered without a panic, and a decoded review must be answerable (its uid
//! echoed in a valid AdmissionReview).

use std::panic::{AssertUnwindSafe, catch_unwind};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};
use termination_controller::webhook::review::{Answer, Decoded, decode, encode};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| serde_json::Number::from_f64(f)
            .map(Value::Number)),
        "\\PC{0,24}".prop_map(Value::from),
        prop::sample::select(vec![
            "Node",
            "Pod",
            "v1",
            "",
            "CREATE",
            "DELETE",
            "UPDATE",
            "CONNECT",
            "admission.k8s.io/v1",
            "admission.k8s.io/v1beta1",
            "AdmissionReview",
            "nodes",
            "nodegrace.io/termination",
            "2026-11-23T10:00:00Z",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,10}", inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn valid_review(operation: &str) -> Value {
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-1", "labels": {"pool": "a"}, "finalizers": ["x"]},
        "spec": {"providerID": "sim://node-1", "taints": [{"key": "k", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    });
    let (object, old) = if operation == "DELETE" {
        (Value::Null, node)
    } else {
        (node, Value::Null)
    };
    json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "name": "node-1", "operation": operation,
            "userInfo": {"username": "admin", "groups": ["system:masters"]},
            "object": object, "oldObject": old, "dryRun": false,
        },
    })
}

const PATHS: [&str; 18] = [
    "/apiVersion",
    "/kind",
    "/request",
    "/request/uid",
    "/request/kind",
    "/request/kind/kind",
    "/request/kind/group",
    "/request/operation",
    "/request/object",
    "/request/oldObject",
    "/request/object/metadata",
    "/request/oldObject/metadata/finalizers",
    "/request/object/spec/taints",
    "/request/oldObject/status/conditions",
    "/request/dryRun",
    "/request/subResource",
    "/request/name",
    "/request/userInfo",
];

/// One change to a valid review: replace the value at a path, or remove it.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(usize, Value),
    Remove(usize),
}

fn mutate(review: &mut Value, mutation: &Mutation) {
    let (index, replacement) = match mutation {
        Mutation::Replace(index, value) => (*index, Some(value.clone())),
        Mutation::Remove(index) => (*index, None),
    };
    let path = PATHS[index % PATHS.len()];
    let (parent, key) = path.rsplit_once('/').unwrap_or(("", path));
    if let Some(Value::Object(parent)) = review.pointer_mut(parent) {
        match replacement {
            Some(value) => {
                parent.insert(key.to_owned(), value);
            }
            None => {
                parent.remove(key);
            }
        }
    }
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let mutation = prop_oneof![
        (any::<usize>(), json_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        any::<usize>().prop_map(Mutation::Remove),
    ];
    let structured = (
        prop::sample::select(vec!["CREATE", "DELETE", "UPDATE"]),
        prop::collection::vec(mutation, 0..4),
        // A damaged body now and then; most cases stay JSON and reach the judging.
        prop::option::weighted(0.1, any::<(prop::sample::Index, u8)>()),
        prop::option::weighted(0.1, any::<prop::sample::Index>()),
    )
        .prop_map(|(operation, mutations, flip, cut)| {
            let mut review = valid_review(operation);
            for mutation in &mutations {
                mutate(&mut review, mutation);
            }
            let mut bytes = serde_json::to_vec(&review).unwrap_or_default();
            if let Some((at, bits)) = flip
                && !bytes.is_empty()
            {
                let at = at.index(bytes.len());
                bytes[at] ^= bits;
            }
            if let Some(cut) = cut
                && !bytes.is_empty()
            {
                bytes.truncate(cut.index(bytes.len()));
            }
            bytes
        });
    prop_oneof![
        6 => structured,
        2 => prop::collection::vec(any::<u8>(), 0..512),
        1 => json_value().prop_map(|value| serde_json::to_vec(&value).unwrap_or_default()),
        1 => (1usize..20_000, prop::sample::select(vec!["[", "{\"a\":"]))
            .prop_map(|(depth, open)| open.repeat(depth).into_bytes()),
    ]
}

/// How a case was answered.
#[derive(Debug, Clone, Copy)]
enum Outcome {
    /// HTTP 400: not a v1 AdmissionReview.
    Rejected,
    Judged,
    Refused,
    Unjudged,
}

/// What one case must satisfy besides not panicking.
fn check(bytes: &[u8]) -> Result<Outcome, String> {
    let (uid, outcome) = match decode(bytes) {
        Err(error) => {
            if error.to_string().is_empty() {
                return Err("an empty error message".to_owned());
            }
            return Ok(Outcome::Rejected);
        }
        Ok(Decoded::Review(review)) => (review.uid, Outcome::Judged),
        Ok(Decoded::Refused { uid, message }) => {
            if message.is_empty() {
                return Err("a refusal without a message".to_owned());
            }
            (uid, Outcome::Refused)
        }
        Ok(Decoded::Unjudged { uid }) => (uid, Outcome::Unjudged),
    };
    let answer: Value =
        serde_json::from_slice(&encode(&uid, &Answer::deny(403, "Forbidden", "no")))
            .map_err(|error| format!("the answer is not JSON: {error}"))?;
    if answer["response"]["uid"] != uid.as_str() {
        return Err(format!("the answer does not echo uid {uid:?}"));
    }
    Ok(outcome)
}

#[derive(Debug, Default)]
pub struct Report {
    pub cases: u64,
    pub panics: u64,
    /// Answered with HTTP 400, judged, denied as unjudgeable, allowed as not ours.
    pub rejected: u64,
    pub judged: u64,
    pub refused: u64,
    pub unjudged: u64,
    /// Cases that broke a property other than "no panic", with the first few messages.
    pub failures: Vec<String>,
}

/// Runs `cases` generated bodies through the decoder; `deterministic` fixes the seed (tests),
/// otherwise every run explores new input (bench).
pub fn run(cases: u64, deterministic: bool) -> Report {
    let mut runner = if deterministic {
        TestRunner::deterministic()
    } else {
        TestRunner::default()
    };
    let strategy = body();
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut report = Report::default();
    for _ in 0..cases {
        let Ok(tree) = strategy.new_tree(&mut runner) else {
            continue;
        };
        let bytes = tree.current();
        report.cases += 1;
        match catch_unwind(AssertUnwindSafe(|| check(&bytes))) {
            Ok(Ok(Outcome::Rejected)) => report.rejected += 1,
            Ok(Ok(Outcome::Judged)) => report.judged += 1,
            Ok(Ok(Outcome::Refused)) => report.refused += 1,
            Ok(Ok(Outcome::Unjudged)) => report.unjudged += 1,
            Ok(Err(why)) => {
                if report.failures.len() < 5 {
                    report
                        .failures
                        .push(format!("{why}: {}", String::from_utf8_lossy(&bytes)));
                }
            }
            Err(_) => report.panics += 1,
        }
    }
    std::panic::set_hook(quiet);
    report
}
