//! Sets of field paths, as `fieldsV1` writes them (structured-merge-diff's fieldpath.Set):
//! read from and written to the managedFields trie, collected from an object by its shape, and
//! the values at and removal of a path.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use super::merge::{Element, ListType, Path, Shape, key_element};

/// A set of owned field paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet(pub(super) BTreeSet<Path>);

/// Metadata fields nobody owns (fieldmanager's stripMeta set).
const UNOWNED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

impl FieldSet {
    /// The fields a value sets. `status_part` picks what a write may own: the status
    /// subresource owns `status` only; the main resource owns everything else (and status too
    /// for kinds without a status subresource).
    pub fn of(object: &Value, shape: Shape<'_>, scope: Scope) -> Self {
        let mut set = BTreeSet::new();
        if let Value::Object(fields) = object {
            for (name, child) in fields {
                let owned = match name.as_str() {
                    "apiVersion" | "kind" => false,
                    "status" => scope != Scope::MainOfStatusKind,
                    _ => scope != Scope::Status,
                };
                if !owned {
                    continue;
                }
                let path = vec![format!("f:{name}")];
                let names = vec![name.clone()];
                if name == "metadata" {
                    if let Value::Object(metadata) = child {
                        for (field, value) in metadata {
                            if UNOWNED_METADATA.contains(&field.as_str()) {
                                continue;
                            }
                            let mut path = path.clone();
                            path.push(format!("f:{field}"));
                            let mut names = names.clone();
                            names.push(field.clone());
                            collect(value, &path, &names, shape, &mut set);
                        }
                    }
                    continue;
                }
                collect(child, &path, &names, shape, &mut set);
            }
        }
        Self(set)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn contains(&self, path: &Path) -> bool {
        self.0.contains(path)
    }

    pub(super) fn difference(&self, other: &Self) -> Self {
        Self(self.0.difference(&other.0).cloned().collect())
    }

    pub(super) fn union(&self, other: &Self) -> Self {
        Self(self.0.union(&other.0).cloned().collect())
    }

    pub(super) fn remove_all(&mut self, other: &Self) {
        self.0.retain(|path| !other.0.contains(path));
    }

    /// The fieldsV1 trie: a path in the set with children gets a "." member.
    pub fn to_fields_v1(&self) -> Value {
        let mut root = Map::new();
        for path in &self.0 {
            let mut node = &mut root;
            for element in path {
                node = node
                    .entry(element.clone())
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .expect("trie nodes are objects");
            }
        }
        // A path in the set that also has members is marked with ".".
        mark_interior(&mut root, &self.0, &mut Vec::new());
        Value::Object(root)
    }

    pub fn from_fields_v1(fields: &Value) -> Self {
        let mut set = BTreeSet::new();
        read_trie(fields, &mut Vec::new(), &mut set);
        Self(set)
    }
}

pub(super) fn mark_interior(node: &mut Map<String, Value>, set: &BTreeSet<Path>, path: &mut Path) {
    let keys: Vec<String> = node.keys().filter(|k| *k != ".").cloned().collect();
    for key in keys {
        path.push(key.clone());
        if let Some(Value::Object(child)) = node.get_mut(&key) {
            let has_children = child.keys().any(|k| k != ".");
            if has_children && set.contains(path) {
                child.insert(".".to_owned(), json!({}));
            }
            mark_interior(child, set, path);
        }
        path.pop();
    }
}

pub(super) fn read_trie(node: &Value, path: &mut Path, set: &mut BTreeSet<Path>) {
    let Value::Object(members) = node else {
        return;
    };
    if members.is_empty() && !path.is_empty() {
        set.insert(path.clone());
        return;
    }
    for (key, child) in members {
        if key == "." {
            set.insert(path.clone());
            continue;
        }
        path.push(key.clone());
        read_trie(child, path, set);
        path.pop();
    }
}

/// Which part of an object a write touches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource of a kind without a status subresource: everything.
    Main,
    /// The main resource of a kind with a status subresource: everything but status.
    MainOfStatusKind,
    /// The status subresource: status only.
    Status,
}

pub(super) fn collect(
    value: &Value,
    path: &Path,
    names: &[String],
    shape: Shape<'_>,
    set: &mut BTreeSet<Path>,
) {
    match value {
        Value::Object(fields) if !fields.is_empty() => {
            if shape.is_map(names) {
                set.insert(path.clone());
            }
            collect_members(fields, path, names, shape, set);
        }
        Value::Array(items) => match shape.list_type(names) {
            ListType::Atomic => {
                set.insert(path.clone());
            }
            ListType::Set => {
                for item in items {
                    let mut path = path.clone();
                    path.push(format!("v:{item}"));
                    set.insert(path);
                }
            }
            ListType::Map(keys) => {
                for item in items {
                    let mut path = path.clone();
                    path.push(key_element(item, &keys));
                    set.insert(path.clone());
                    if let Value::Object(fields) = item {
                        collect_members(fields, &path, names, shape, set);
                    }
                }
            }
        },
        _ => {
            set.insert(path.clone());
        }
    }
}

pub(super) fn collect_members(
    fields: &Map<String, Value>,
    path: &Path,
    names: &[String],
    shape: Shape<'_>,
    set: &mut BTreeSet<Path>,
) {
    for (name, child) in fields {
        let mut path = path.clone();
        path.push(format!("f:{name}"));
        let mut names = names.to_vec();
        names.push(name.clone());
        collect(child, &path, &names, shape, set);
    }
}

/// The value at a path, if the object has it.
pub(super) fn value_at<'v>(object: &'v Value, path: &[Element]) -> Option<&'v Value> {
    let mut node = object;
    for element in path {
        node = step(node, element)?;
    }
    Some(node)
}

pub(super) fn step<'v>(node: &'v Value, element: &str) -> Option<&'v Value> {
    if let Some(field) = element.strip_prefix("f:") {
        return node.get(field);
    }
    let items = node.as_array()?;
    if let Some(key) = element.strip_prefix("k:") {
        let key: Map<String, Value> = serde_json::from_str(key).ok()?;
        return items
            .iter()
            .find(|item| key.iter().all(|(k, v)| item.get(k) == Some(v)));
    }
    if let Some(value) = element.strip_prefix("v:") {
        let value: Value = serde_json::from_str(value).ok()?;
        return items.iter().find(|item| **item == value);
    }
    None
}

/// The position of the list item an element names.
pub(super) fn item_index(node: &Value, element: &str) -> Option<usize> {
    let found = step(node, element)?;
    node.as_array()?
        .iter()
        .position(|item| std::ptr::eq(item, found))
}

pub(super) fn child_mut<'v>(node: &'v mut Value, element: &str) -> Option<&'v mut Value> {
    if let Some(field) = element.strip_prefix("f:") {
        return node.get_mut(field);
    }
    let index = item_index(node, element)?;
    node.get_mut(index)
}

/// Removes what a path names: a field, a list item, a set value.
pub(super) fn remove_at(object: &mut Value, path: &[Element]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut node = object;
    for element in parents {
        let Some(next) = child_mut(node, element) else {
            return;
        };
        node = next;
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(map) = node.as_object_mut() {
            map.remove(field);
        }
        return;
    }
    if let Some(index) = item_index(node, last)
        && let Some(items) = node.as_array_mut()
    {
        items.remove(index);
    }
}

/// How a path prints in conflict messages: `.spec.containers[name="c"].image`.
pub(super) fn display(path: &[Element]) -> String {
    use std::fmt::Write;
    let mut text = String::new();
    for element in path {
        if let Some(field) = element.strip_prefix("f:") {
            let _ = write!(text, ".{field}");
        } else if let Some(key) = element.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(key).unwrap_or_default();
            let parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = write!(text, "[{}]", parts.join(","));
        } else if let Some(value) = element.strip_prefix("v:") {
            let _ = write!(text, "[={value}]");
        }
    }
    text
}
