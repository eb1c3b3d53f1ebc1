//! Reading the JSON objects the store keeps, whose fields are not typed.

use serde_json::Value;

/// The strings of a JSON array in order: none when `value` is missing or not an array, and
/// elements that are not strings skipped.
pub fn strings(value: &Value) -> impl Iterator<Item = &str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

/// [`strings`], owned.
pub fn owned_strings(value: &Value) -> Vec<String> {
    strings(value).map(str::to_owned).collect()
}
