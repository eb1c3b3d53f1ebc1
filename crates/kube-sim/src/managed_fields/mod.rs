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

mod field_set;
mod merge;

pub use field_set::{FieldSet, Scope};
pub use merge::{ListType, Shape, merge};

use field_set::{display, remove_at, value_at};
use merge::Path;

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::error::ApiError;
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
            time: json!(crate::store::timestamps::now_rfc3339()),
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
