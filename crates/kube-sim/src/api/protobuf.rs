//! Just enough of the Kubernetes protobuf encoding to read the bodies real clients send only as
//! protobuf: `kubectl auth can-i`'s SelfSubjectAccessReview
//! (k8s.io/api/authorization/v1/generated.proto), and helm's release records — Secrets or
//! ConfigMaps (k8s.io/api/core/v1/generated.proto) and the DeleteOptions that remove them —
//! which client-go's typed clients write. Everything else in protobuf stays a 415.

use base64::Engine;
use serde_json::{Map, Value, json};

/// The envelope's magic prefix (runtime/serializer/protobuf).
const MAGIC: &[u8] = b"k8s\0";

/// A SelfSubjectAccessReview in protobuf, as the JSON the rest of the server reads.
pub fn self_subject_access_review(body: &[u8]) -> Option<Value> {
    let unknown = body.strip_prefix(MAGIC)?;
    // runtime.Unknown: typeMeta = 1, raw = 2.
    let raw = fields(unknown)?
        .into_iter()
        .find(|(number, _)| *number == 2)?
        .1;
    let review = fields(raw)?;
    let spec = review.iter().find(|(number, _)| *number == 2)?.1;
    let mut spec_json = Map::new();
    for (number, bytes) in fields(spec)? {
        match number {
            1 => {
                let names = [
                    "namespace",
                    "verb",
                    "group",
                    "version",
                    "resource",
                    "subresource",
                    "name",
                ];
                spec_json.insert("resourceAttributes".to_owned(), strings(bytes, &names)?);
            }
            2 => {
                spec_json.insert(
                    "nonResourceAttributes".to_owned(),
                    strings(bytes, &["path", "verb"])?,
                );
            }
            _ => {}
        }
    }
    Some(json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": spec_json,
    }))
}

/// A Secret, ConfigMap or DeleteOptions in protobuf, as JSON; `None` for anything else.
pub fn object(body: &[u8]) -> Option<Value> {
    let unknown = all_fields(body.strip_prefix(MAGIC)?)?;
    let type_meta = unknown.iter().find_map(|(number, field)| match field {
        Field::Bytes(bytes) if *number == 1 => Some(*bytes),
        _ => None,
    })?;
    let type_meta = strings(type_meta, &["apiVersion", "kind"])?;
    let raw = unknown.iter().find_map(|(number, field)| match field {
        Field::Bytes(bytes) if *number == 2 => Some(*bytes),
        _ => None,
    })?;
    let mut object = Map::new();
    object.insert("apiVersion".to_owned(), type_meta["apiVersion"].clone());
    object.insert("kind".to_owned(), type_meta["kind"].clone());
    let kind = type_meta["kind"].as_str()?;
    for (number, field) in all_fields(raw)? {
        let entry = match (kind, number, field) {
            ("Secret" | "ConfigMap", 1, Field::Bytes(meta)) => ("metadata", object_meta(meta)?),
            ("Secret", 2, Field::Bytes(entry)) => ("data", map_entry(entry, true)?),
            ("Secret", 3, Field::Bytes(text)) => ("type", Value::String(utf8(text)?)),
            ("Secret", 4, Field::Bytes(entry)) => ("stringData", map_entry(entry, false)?),
            ("ConfigMap", 2, Field::Bytes(entry)) => ("data", map_entry(entry, false)?),
            ("ConfigMap", 3, Field::Bytes(entry)) => ("binaryData", map_entry(entry, true)?),
            ("Secret", 5, Field::Varint(flag)) | ("ConfigMap", 4, Field::Varint(flag)) => {
                ("immutable", Value::Bool(flag != 0))
            }
            ("DeleteOptions", 1, Field::Varint(seconds)) => {
                ("gracePeriodSeconds", json!(i64::try_from(seconds).ok()?))
            }
            ("DeleteOptions", 2, Field::Bytes(preconditions)) => (
                "preconditions",
                strings(preconditions, &["uid", "resourceVersion"])?,
            ),
            ("DeleteOptions", 3, Field::Varint(flag)) => {
                ("orphanDependents", Value::Bool(flag != 0))
            }
            ("DeleteOptions", 4, Field::Bytes(text)) => {
                ("propagationPolicy", Value::String(utf8(text)?))
            }
            ("DeleteOptions", 5, Field::Bytes(text)) => {
                let list = object
                    .entry("dryRun")
                    .or_insert_with(|| Value::Array(Vec::new()));
                list.as_array_mut()?.push(Value::String(utf8(text)?));
                continue;
            }
            ("Secret" | "ConfigMap" | "DeleteOptions", _, _) => continue,
            _ => return None,
        };
        merge(&mut object, entry);
    }
    Some(Value::Object(object))
}

/// Where a decoded field goes: maps (data, labels, …) gather their entries.
fn merge(object: &mut Map<String, Value>, (name, value): (&str, Value)) {
    match (object.get_mut(name), value) {
        (Some(Value::Object(existing)), Value::Object(more)) => existing.extend(more),
        (_, value) => {
            object.insert(name.to_owned(), value);
        }
    }
}

/// One entry of a `map<string, string|bytes>` field as `{key: value}`; bytes come out base64,
/// as in JSON.
fn map_entry(entry: &[u8], bytes: bool) -> Option<Value> {
    let (key, value) = key_value(entry)?;
    let value = if bytes {
        base64::engine::general_purpose::STANDARD.encode(value)
    } else {
        utf8(value)?
    };
    Some(json!({ key: value }))
}

fn key_value(entry: &[u8]) -> Option<(String, &[u8])> {
    let (mut key, mut value) = (String::new(), &[][..]);
    for (number, field) in all_fields(entry)? {
        match (number, field) {
            (1, Field::Bytes(text)) => key = utf8(text)?,
            (2, Field::Bytes(bytes)) => value = bytes,
            _ => {}
        }
    }
    Some((key, value))
}

fn utf8(bytes: &[u8]) -> Option<String> {
    String::from_utf8(bytes.to_vec()).ok()
}

/// ObjectMeta's fields a client sets on create and update.
fn object_meta(meta: &[u8]) -> Option<Value> {
    let mut object = Map::new();
    for (number, field) in all_fields(meta)? {
        let Field::Bytes(bytes) = field else {
            continue;
        };
        match number {
            1 => merge(&mut object, ("name", Value::String(utf8(bytes)?))),
            2 => merge(&mut object, ("generateName", Value::String(utf8(bytes)?))),
            3 => merge(&mut object, ("namespace", Value::String(utf8(bytes)?))),
            5 => merge(&mut object, ("uid", Value::String(utf8(bytes)?))),
            6 => merge(
                &mut object,
                ("resourceVersion", Value::String(utf8(bytes)?)),
            ),
            11 | 12 => {
                let (key, value) = key_value(bytes)?;
                let name = if number == 11 {
                    "labels"
                } else {
                    "annotations"
                };
                merge(&mut object, (name, json!({ key: utf8(value)? })));
            }
            14 => {
                let list = object
                    .entry("finalizers")
                    .or_insert_with(|| Value::Array(Vec::new()));
                list.as_array_mut()?.push(Value::String(utf8(bytes)?));
            }
            _ => {}
        }
    }
    Some(Value::Object(object))
}

/// The string fields of a message, numbered from 1 in the order of `names`.
fn strings(message: &[u8], names: &[&str]) -> Option<Value> {
    let mut object = Map::new();
    for (number, bytes) in fields(message)? {
        if let Some(name) = usize::try_from(number)
            .ok()
            .and_then(|n| n.checked_sub(1))
            .and_then(|index| names.get(index))
        {
            object.insert(
                (*name).to_owned(),
                Value::String(String::from_utf8(bytes.to_vec()).ok()?),
            );
        }
    }
    Some(Value::Object(object))
}

/// The length-delimited fields of a message (others are skipped), in order.
fn fields(message: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    Some(
        all_fields(message)?
            .into_iter()
            .filter_map(|(number, field)| match field {
                Field::Bytes(bytes) => Some((number, bytes)),
                Field::Varint(_) => None,
            })
            .collect(),
    )
}

#[derive(Debug, Clone, Copy)]
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The varint and length-delimited fields of a message (fixed-width ones skipped), in order.
fn all_fields(mut message: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut found = Vec::new();
    while !message.is_empty() {
        let (key, rest) = varint(message)?;
        message = rest;
        match key & 7 {
            0 => {
                let (value, rest) = varint(message)?;
                found.push((key >> 3, Field::Varint(value)));
                message = rest;
            }
            1 => message = message.get(8..)?,
            5 => message = message.get(4..)?,
            2 => {
                let (length, rest) = varint(message)?;
                let length = usize::try_from(length).ok()?;
                found.push((key >> 3, Field::Bytes(rest.get(..length)?)));
                message = rest.get(length..)?;
            }
            _ => return None,
        }
    }
    Some(found)
}

fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut value = 0u64;
    for (index, byte) in bytes.iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte & 0x80 == 0 {
            return Some((value, &bytes[index + 1..]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut encoded = vec![(number << 3) | 2, u8::try_from(bytes.len()).unwrap()];
        encoded.extend_from_slice(bytes);
        encoded
    }

    #[test]
    fn reads_the_review_kubectl_sends() {
        let attributes = [field(1, b"apps"), field(2, b"list"), field(5, b"pods")].concat();
        let spec = field(1, &attributes);
        let review = [field(1, b""), field(2, &spec)].concat();
        let unknown = [
            field(1, &field(1, b"authorization.k8s.io/v1")),
            field(2, &review),
        ]
        .concat();
        let body = [MAGIC, &unknown].concat();
        assert_eq!(
            self_subject_access_review(&body).unwrap()["spec"]["resourceAttributes"],
            json!({"namespace": "apps", "verb": "list", "resource": "pods"})
        );
        assert_eq!(self_subject_access_review(b"k8s\0\x12\xff"), None);
    }

    #[test]
    fn reads_a_release_secret_as_client_go_writes_it() {
        let label =
            |key: &[u8], value: &[u8]| field(11, &[field(1, key), field(2, value)].concat());
        let meta = [
            field(1, b"sh.helm.release.v1.x.v1"),
            label(b"owner", b"helm"),
            label(b"status", b"deployed"),
        ]
        .concat();
        let secret = [
            field(1, &meta),
            field(2, &[field(1, b"release"), field(2, b"\x00\x01")].concat()),
            field(3, b"helm.sh/release.v1"),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"Secret")].concat();
        let unknown = [field(1, &type_meta), field(2, &secret)].concat();
        let body = [MAGIC, &unknown].concat();
        assert_eq!(
            object(&body).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret", "type": "helm.sh/release.v1",
                "metadata": {"name": "sh.helm.release.v1.x.v1", "labels": {"owner": "helm", "status": "deployed"}},
                "data": {"release": "AAE="}})
        );
        assert_eq!(self_subject_access_review(b"{}"), None);
    }
}
