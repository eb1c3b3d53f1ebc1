//! How an applied configuration merges into the live object, by the schema's list types
//! (structured-merge-diff's merge: associative lists by key, sets by value, atomic lists whole).

use serde_json::{Map, Value};

/// One step of a field path, as fieldsV1 spells it: `f:name`, `k:{"name":"c"}`, `v:"x"`.
pub(super) type Element = String;
pub(super) type Path = Vec<Element>;

/// How a list merges and is owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Items are identified by these key fields.
    Map(Vec<String>),
    /// Items are scalar values, each owned on its own.
    Set,
    /// The list is one value.
    Atomic,
}

/// What ownership and apply know of an object's shape: the list types and which objects are
/// maps (owned as a node as well as key by key) rather than structs.
#[derive(Debug, Clone, Copy)]
pub enum Shape<'a> {
    /// A built-in kind: the list types of its Go types' markers, by field name.
    Builtin,
    /// A custom resource: its CRD's `openAPIV3Schema` (`x-kubernetes-list-type`,
    /// `x-kubernetes-list-map-keys`, `additionalProperties`); lists are atomic by default.
    Schema(&'a Value),
}

/// Maps with arbitrary keys among the built-in kinds' fields.
const BUILTIN_MAPS: &[&str] = &[
    "labels",
    "annotations",
    "data",
    "binaryData",
    "stringData",
    "nodeSelector",
    "capacity",
    "allocatable",
    "limits",
    "requests",
    "disruptedPods",
];

impl Shape<'_> {
    /// The list type of the list at a path of field names (list items are transparent).
    pub fn list_type(&self, names: &[String]) -> ListType {
        match self {
            Self::Builtin => {
                match crate::patch::list_strategy(names.last().map_or("", String::as_str)) {
                    Some("") => ListType::Set,
                    Some(key) => ListType::Map(vec![key.to_owned()]),
                    None => ListType::Atomic,
                }
            }
            Self::Schema(schema) => {
                let node = schema_at(schema, names);
                match node["x-kubernetes-list-type"].as_str() {
                    Some("map") => ListType::Map(crate::json::owned_strings(
                        &node["x-kubernetes-list-map-keys"],
                    )),
                    Some("set") => ListType::Set,
                    _ => ListType::Atomic,
                }
            }
        }
    }

    /// Whether the object at a path of field names is a map rather than a struct.
    pub fn is_map(&self, names: &[String]) -> bool {
        match self {
            Self::Builtin => names
                .last()
                .is_some_and(|name| BUILTIN_MAPS.contains(&name.as_str())),
            Self::Schema(schema) => {
                let node = schema_at(schema, names);
                node["additionalProperties"].is_object() && node["properties"].is_null()
                    || matches!(names, [first, second] if first == "metadata" && (second == "labels" || second == "annotations"))
            }
        }
    }
}

/// The schema node of a path of field names; array items are stepped into on the way.
pub(super) fn schema_at<'v>(schema: &'v Value, names: &[String]) -> &'v Value {
    let mut node = schema;
    for name in names {
        if node["type"] == "array" {
            node = &node["items"];
        }
        node = match &node["properties"][name.as_str()] {
            Value::Null => &node["additionalProperties"],
            child => child,
        };
    }
    node
}

/// Merges an apply configuration into an object: maps field by field, associative lists item
/// by key, sets value by value, atomic lists and scalars replaced; `null` removes.
pub fn merge(shape: Shape<'_>, live: &Value, config: &Value) -> Value {
    merge_at(shape, live, config, &mut Vec::new())
}

pub(super) fn merge_at(
    shape: Shape<'_>,
    live: &Value,
    config: &Value,
    names: &mut Vec<String>,
) -> Value {
    match (live, config) {
        (Value::Object(live), Value::Object(config)) => {
            let mut merged = live.clone();
            for (name, value) in config {
                if value.is_null() {
                    merged.remove(name);
                    continue;
                }
                names.push(name.clone());
                let child = match merged.get(name) {
                    Some(existing) => merge_at(shape, existing, value, names),
                    None => value.clone(),
                };
                names.pop();
                merged.insert(name.clone(), child);
            }
            Value::Object(merged)
        }
        (Value::Array(live), Value::Array(config)) => match shape.list_type(names) {
            ListType::Atomic => Value::Array(config.clone()),
            ListType::Set => {
                let mut merged = live.clone();
                merged.extend(config.iter().filter(|item| !live.contains(item)).cloned());
                Value::Array(merged)
            }
            ListType::Map(keys) => {
                let mut merged = live.clone();
                for item in config {
                    let key = key_element(item, &keys);
                    match merged
                        .iter()
                        .position(|existing| key_element(existing, &keys) == key)
                    {
                        Some(index) => merged[index] = merge_at(shape, &merged[index], item, names),
                        None => merged.push(item.clone()),
                    }
                }
                Value::Array(merged)
            }
        },
        (_, config) => config.clone(),
    }
}

/// The `k:{…}` element of an associative list item (keys in the order the list names them).
pub(super) fn key_element(item: &Value, keys: &[String]) -> Element {
    let mut fields = Map::new();
    for key in keys {
        if let Some(value) = item.get(key) {
            fields.insert(key.clone(), value.clone());
        }
    }
    format!("k:{}", Value::Object(fields))
}
