//! Field ownership for server-side apply, after sigs.k8s.io/structured-merge-diff as the API
//! server's fieldmanager uses it (staging/src/k8s.io/apiserver/pkg/endpoints/handlers/
//! fieldmanager): every API write records, in `metadata.managedFields`, which manager set
//! which fields (`fieldsV1`), per operation (`Apply` or `Update`) and subresource.
//! - An Update (create, PUT, non-apply PATCH) gives its manager the fields it changed and takes
//!   them from every other manager; removed fields leave every set.
//! - An Apply owns exactly the fields of its configuration. A field another manager owns with a
//!   different value is a conflict (409, unless `force`, which takes it). Fields the manager
//!   applied before and no longer applies are removed from the object when nobody else owns
//!   them.
//!
//! Lists follow their list type: associative lists (`+listType=map`) are owned item by item by
//! key, sets value by value, atomic lists whole ([`ListType`]).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::error::ApiError;

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
fn schema_at<'v>(schema: &'v Value, names: &[String]) -> &'v Value {
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

fn merge_at(shape: Shape<'_>, live: &Value, config: &Value, names: &mut Vec<String>) -> Value {
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

/// One step of a field path, as fieldsV1 spells it: `f:name`, `k:{"name":"c"}`, `v:"x"`.
type Element = String;
type Path = Vec<Element>;

/// A set of owned field paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet(BTreeSet<Path>);

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

    fn contains(&self, path: &Path) -> bool {
        self.0.contains(path)
    }

    fn difference(&self, other: &Self) -> Self {
        Self(self.0.difference(&other.0).cloned().collect())
    }

    fn union(&self, other: &Self) -> Self {
        Self(self.0.union(&other.0).cloned().collect())
    }

    fn remove_all(&mut self, other: &Self) {
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

fn mark_interior(node: &mut Map<String, Value>, set: &BTreeSet<Path>, path: &mut Path) {
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

fn read_trie(node: &Value, path: &mut Path, set: &mut BTreeSet<Path>) {
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

/// The `k:{…}` element of an associative list item (keys in the order the list names them).
fn key_element(item: &Value, keys: &[String]) -> Element {
    let mut fields = Map::new();
    for key in keys {
        if let Some(value) = item.get(key) {
            fields.insert(key.clone(), value.clone());
        }
    }
    format!("k:{}", Value::Object(fields))
}

fn collect(
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

fn collect_members(
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
fn value_at<'v>(object: &'v Value, path: &[Element]) -> Option<&'v Value> {
    let mut node = object;
    for element in path {
        node = step(node, element)?;
    }
    Some(node)
}

fn step<'v>(node: &'v Value, element: &str) -> Option<&'v Value> {
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
fn item_index(node: &Value, element: &str) -> Option<usize> {
    let found = step(node, element)?;
    node.as_array()?
        .iter()
        .position(|item| std::ptr::eq(item, found))
}

fn child_mut<'v>(node: &'v mut Value, element: &str) -> Option<&'v mut Value> {
    if let Some(field) = element.strip_prefix("f:") {
        return node.get_mut(field);
    }
    let index = item_index(node, element)?;
    node.get_mut(index)
}

/// Removes what a path names: a field, a list item, a set value.
fn remove_at(object: &mut Value, path: &[Element]) {
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
fn display(path: &[Element]) -> String {
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

/// One `managedFields` entry's identity and fields.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    subresource: Option<String>,
    time: Value,
    fields: FieldSet,
}

impl Entry {
    fn same_manager(&self, other: &Self) -> bool {
        self.manager == other.manager
            && self.operation == other.operation
            && self.subresource == other.subresource
    }

    /// fieldmanager's printManager.
    fn describe(&self) -> String {
        use std::fmt::Write;
        let mut text = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            let _ = write!(text, " with subresource {sub:?}");
        }
        if self.operation == "Update" {
            let _ = write!(text, " using {}", self.api_version);
            if let Some(time) = self.time.as_str() {
                let _ = write!(text, " at {time}");
            }
        }
        text
    }

    fn to_json(&self) -> Value {
        let mut entry = json!({
            "manager": self.manager,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.fields.to_fields_v1(),
        });
        if let Some(sub) = &self.subresource {
            entry["subresource"] = json!(sub);
        }
        entry
    }
}

fn entries(object: &Value) -> Vec<Entry> {
    object["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|entry| Entry {
            manager: entry["manager"].as_str().unwrap_or_default().to_owned(),
            operation: entry["operation"].as_str().unwrap_or_default().to_owned(),
            api_version: entry["apiVersion"].as_str().unwrap_or_default().to_owned(),
            subresource: entry["subresource"].as_str().map(str::to_owned),
            time: entry["time"].clone(),
            fields: FieldSet::from_fields_v1(&entry["fieldsV1"]),
        })
        .collect()
}

fn store_entries(object: &mut Value, entries: &[Entry]) {
    let kept: Vec<Value> = entries
        .iter()
        .filter(|entry| !entry.fields.is_empty())
        .map(Entry::to_json)
        .collect();
    if kept.is_empty() {
        if let Some(metadata) = object["metadata"].as_object_mut() {
            metadata.remove("managedFields");
        }
    } else {
        object["metadata"]["managedFields"] = Value::Array(kept);
    }
}

/// Who writes, how, and where.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    pub manager: &'a str,
    pub api_version: &'a str,
    pub scope: Scope,
}

impl Writer<'_> {
    fn entry(&self, operation: &str, fields: FieldSet) -> Entry {
        Entry {
            manager: self.manager.to_owned(),
            operation: operation.to_owned(),
            api_version: self.api_version.to_owned(),
            subresource: (self.scope == Scope::Status).then(|| "status".to_owned()),
            time: json!(crate::store::strategy::now_rfc3339()),
            fields,
        }
    }
}

fn without_managed_fields(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object["metadata"].as_object_mut() {
        metadata.remove("managedFields");
    }
    object
}

/// Records an Update by `writer` that turned `old` (None for a create) into `new`, whose
/// `managedFields` are replaced by the result.
pub fn record_update(old: Option<&Value>, new: &mut Value, writer: &Writer<'_>, shape: Shape<'_>) {
    let mut managed = old.map(entries).unwrap_or_default();
    if let Some(old) = old
        && without_managed_fields(old) == without_managed_fields(new)
    {
        store_entries(new, &managed);
        return;
    }
    let new_fields = FieldSet::of(new, shape, writer.scope);
    let (changed, removed) = match old {
        None => (new_fields, FieldSet::default()),
        Some(old) => {
            let old_fields = FieldSet::of(old, shape, writer.scope);
            let changed = FieldSet(
                new_fields
                    .0
                    .iter()
                    .filter(|path| {
                        !old_fields.contains(path) || value_at(old, path) != value_at(new, path)
                    })
                    .cloned()
                    .collect(),
            );
            (changed, old_fields.difference(&new_fields))
        }
    };
    let mine = writer.entry("Update", changed.clone());
    for entry in &mut managed {
        entry.fields.remove_all(&removed);
        if !entry.same_manager(&mine) {
            entry.fields.remove_all(&changed);
        }
    }
    match managed.iter_mut().find(|entry| entry.same_manager(&mine)) {
        Some(entry) => {
            entry.fields = entry.fields.union(&changed);
            entry.time = mine.time;
            entry.api_version = mine.api_version;
        }
        None => managed.push(mine),
    }
    store_entries(new, &managed);
}

/// Server-side apply of `config` by `writer` onto `live` (None: the object is created).
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    writer: &Writer<'_>,
    force: bool,
    shape: Shape<'_>,
) -> Result<Value, ApiError> {
    let empty = json!({});
    let base = live.unwrap_or(&empty);
    let mut managed = entries(base);
    let mine = writer.entry("Apply", FieldSet::of(config, shape, writer.scope));
    let mut merged = merge(shape, &without_managed_fields(base), config);
    let mut conflicts: BTreeMap<String, (Entry, Vec<Path>)> = BTreeMap::new();
    for entry in managed.iter().filter(|e| !e.same_manager(&mine)) {
        for path in mine.fields.0.intersection(&entry.fields.0) {
            let leaf = value_at(config, path).is_some_and(|v| !v.is_object());
            if leaf && live.is_some() && value_at(base, path) != value_at(&merged, path) {
                conflicts
                    .entry(entry.describe())
                    .or_insert_with(|| (entry.clone(), Vec::new()))
                    .1
                    .push(path.clone());
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(&conflicts));
    }
    let taken: FieldSet = FieldSet(
        conflicts
            .values()
            .flat_map(|(_, paths)| paths.iter().cloned())
            .collect(),
    );
    let previously = managed
        .iter()
        .find(|e| e.same_manager(&mine))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    for path in previously.difference(&mine.fields).0.iter().rev() {
        let owned_elsewhere = managed
            .iter()
            .any(|e| !e.same_manager(&mine) && e.fields.contains(path));
        if !owned_elsewhere {
            remove_at(&mut merged, path);
        }
    }
    for entry in &mut managed {
        entry.fields.remove_all(&taken);
    }
    managed.retain(|e| !e.same_manager(&mine));
    managed.push(mine);
    store_entries(&mut merged, &managed);
    Ok(merged)
}

/// handlers/fieldmanager NewConflictError: 409 Conflict with one cause per field.
fn conflict_error(conflicts: &BTreeMap<String, (Entry, Vec<Path>)>) -> ApiError {
    let count: usize = conflicts.values().map(|(_, paths)| paths.len()).sum();
    let causes: Vec<Value> = conflicts
        .iter()
        .flat_map(|(manager, (_, paths))| {
            paths.iter().map(move |path| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with {manager}"), "field": display(path)})
            })
        })
        .collect();
    let message = if count == 1 {
        let (manager, (_, paths)) = conflicts.iter().next().expect("one conflict");
        format!(
            "Apply failed with 1 conflict: conflict with {manager}: {}",
            display(&paths[0])
        )
    } else {
        let lines: Vec<String> = conflicts
            .iter()
            .flat_map(|(manager, (_, paths))| {
                std::iter::once(format!("conflicts with {manager}:"))
                    .chain(paths.iter().map(|path| format!("- {}", display(path))))
            })
            .collect();
        format!("Apply failed with {count} conflicts: {}", lines.join("\n"))
    };
    ApiError {
        code: 409,
        reason: "Conflict",
        message,
        details: Some(json!({"causes": causes})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape<'static> {
        Shape::Builtin
    }

    fn writer(manager: &str) -> Writer<'_> {
        Writer {
            manager,
            api_version: "v1",
            scope: Scope::Main,
        }
    }

    #[test]
    fn fields_v1_round_trips_with_dots_for_owned_interior_nodes() {
        let object = json!({"metadata": {"name": "x", "labels": {"a": "1"}, "finalizers": ["f"]}, "spec": {"containers": [{"name": "c", "image": "i"}], "replicas": 2}});
        let set = FieldSet::of(&object, shape(), Scope::Main);
        let trie = set.to_fields_v1();
        assert_eq!(
            trie,
            json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}, "f:finalizers": {"v:\"f\"": {}}}, "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {".": {}, "f:image": {}, "f:name": {}}}, "f:replicas": {}}})
        );
        assert_eq!(FieldSet::from_fields_v1(&trie), set);
    }

    #[test]
    fn apply_conflicts_with_another_managers_different_value_unless_forced() {
        let mut live = json!({"metadata": {"name": "x"}, "spec": {"holder": "a"}});
        live = apply(
            Some(&live),
            &json!({"spec": {"holder": "a"}}),
            &writer("a"),
            false,
            shape(),
        )
        .unwrap();
        let error = apply(
            Some(&live),
            &json!({"spec": {"holder": "b"}}),
            &writer("b"),
            false,
            shape(),
        )
        .unwrap_err();
        assert_eq!(error.code, 409);
        assert_eq!(
            error.message,
            "Apply failed with 1 conflict: conflict with \"a\": .spec.holder"
        );
        let same = apply(
            Some(&live),
            &json!({"spec": {"holder": "a"}}),
            &writer("b"),
            false,
            shape(),
        );
        assert!(same.is_ok(), "the same value is shared, not a conflict");
        let forced = apply(
            Some(&live),
            &json!({"spec": {"holder": "b"}}),
            &writer("b"),
            true,
            shape(),
        )
        .unwrap();
        assert_eq!(forced["spec"]["holder"], "b");
        let managers: Vec<&str> = forced["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["manager"].as_str().unwrap())
            .collect();
        assert_eq!(managers, ["b"], "a lost its only field");
    }

    #[test]
    fn fields_no_longer_applied_are_removed_unless_someone_else_owns_them() {
        let live = json!({"metadata": {"name": "x"}});
        let live = apply(
            Some(&live),
            &json!({"metadata": {"labels": {"a": "1", "b": "2"}}}),
            &writer("a"),
            false,
            shape(),
        )
        .unwrap();
        let mut updated = live.clone();
        updated["metadata"]["labels"]["b"] = json!("3");
        record_update(Some(&live), &mut updated, &writer("kubectl"), shape());
        let reapplied = apply(
            Some(&updated),
            &json!({"metadata": {"labels": {}}}),
            &writer("a"),
            false,
            shape(),
        )
        .unwrap();
        assert_eq!(reapplied["metadata"]["labels"], json!({"b": "3"}));
    }
}
