//! Just enough of the Kubernetes protobuf encoding to read `kubectl auth can-i`'s
//! SelfSubjectAccessReview (k8s.io/api/authorization/v1/generated.proto), which kubectl sends
//! only as protobuf. Everything else in protobuf stays a 415.

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
fn fields(mut message: &[u8]) -> Option<Vec<(u64, &[u8])>> {
    let mut found = Vec::new();
    while !message.is_empty() {
        let (key, rest) = varint(message)?;
        message = rest;
        match key & 7 {
            0 => message = varint(message)?.1,
            1 => message = message.get(8..)?,
            5 => message = message.get(4..)?,
            2 => {
                let (length, rest) = varint(message)?;
                let length = usize::try_from(length).ok()?;
                found.push((key >> 3, rest.get(..length)?));
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
        assert_eq!(self_subject_access_review(b"{}"), None);
    }
}
