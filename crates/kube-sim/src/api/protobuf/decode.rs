//! Protobuf messages as JSON, by the generated table of their fields (schema.rs): each field's
//! number gives its JSON name and kind. The few messages whose JSON is not their fields' — times,
//! quantities, int-or-strings, raw JSON — are read here. A field the table does not know makes
//! the body unreadable rather than silently lost.

use std::fmt::Write as _;

use base64::Engine;
use serde_json::{Map, Value, json};

use super::schema::{MESSAGES, ROOTS};

/// A kind read from protobuf: its envelope's apiVersion and kind, and its message.
#[derive(Debug)]
pub struct Root {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub message: &'static str,
}

#[derive(Debug)]
pub struct Message {
    pub name: &'static str,
    pub fields: &'static [Field],
}

#[derive(Debug)]
pub struct Field {
    pub tag: u64,
    pub json: &'static str,
    pub kind: Kind,
    pub repeated: bool,
}

/// A field that appears once.
pub const fn one(tag: u64, json: &'static str, kind: Kind) -> Field {
    Field {
        tag,
        json,
        kind,
        repeated: false,
    }
}

/// A repeated field (a JSON list).
pub const fn list(tag: u64, json: &'static str, kind: Kind) -> Field {
    Field {
        tag,
        json,
        kind,
        repeated: true,
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Kind {
    String,
    Int,
    Bool,
    /// Base64 in JSON.
    Bytes,
    Message(&'static str),
    StringMap,
    BytesMap,
    MessageMap(&'static str),
}

const TIME: &str = "apimachinery.pkg.apis.meta.v1.time";
const MICRO_TIME: &str = "apimachinery.pkg.apis.meta.v1.microtime";
const DURATION: &str = "apimachinery.pkg.apis.meta.v1.duration";
const FIELDS_V1: &str = "apimachinery.pkg.apis.meta.v1.fieldsv1";
const QUANTITY: &str = "apimachinery.pkg.api.resource.quantity";
const INT_OR_STRING: &str = "apimachinery.pkg.util.intstr.intorstring";
const RAW_EXTENSION: &str = "apimachinery.pkg.runtime.rawextension";

/// The object a protobuf body of `api_version`/`kind` carries, as JSON.
pub fn object(api_version: &str, kind: &str, raw: &[u8]) -> Result<Value, String> {
    let root = ROOTS
        .iter()
        .find(|root| root.api_version == api_version && root.kind == kind)
        .ok_or_else(|| format!("{kind} ({api_version}) is not read from protobuf here"))?;
    let mut object = message(root.message, raw)?;
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind);
    Ok(object)
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Wire<'a> {
    Varint(u64),
    /// Read past: no field in the table has a 64-bit fixed width.
    Fixed64,
    Fixed32,
    Bytes(&'a [u8]),
}

fn message(name: &str, bytes: &[u8]) -> Result<Value, String> {
    match name {
        TIME => return time(bytes, false),
        MICRO_TIME => return time(bytes, true),
        DURATION => return duration(bytes),
        QUANTITY => return Ok(json!(string_field(bytes, 1)?)),
        INT_OR_STRING => return int_or_string(bytes),
        FIELDS_V1 | RAW_EXTENSION => return raw_json(bytes),
        _ => {}
    }
    let schema = MESSAGES
        .binary_search_by(|message| message.name.cmp(name))
        .map(|index| &MESSAGES[index])
        .map_err(|_| format!("message {name} is not in the table"))?;
    let mut object = Map::new();
    for (tag, wire) in wire_fields(bytes)? {
        let field = schema
            .fields
            .iter()
            .find(|field| field.tag == tag)
            .ok_or_else(|| format!("field {tag} of {name} is not in the table"))?;
        let at = || format!("{name}.{}", field.json);
        match field.kind {
            Kind::StringMap | Kind::BytesMap | Kind::MessageMap(_) => {
                let Wire::Bytes(entry) = wire else {
                    return Err(format!("{}: a map entry must be length-delimited", at()));
                };
                let (key, value) = map_entry(entry, field.kind)?;
                let map = object
                    .entry(field.json)
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(map) = map {
                    map.insert(key, value);
                }
            }
            kind if field.repeated => {
                let items = object
                    .entry(field.json)
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(items) = items {
                    items.extend(repeated(kind, wire).map_err(|why| format!("{}: {why}", at()))?);
                }
            }
            kind => {
                let value = single(kind, wire).map_err(|why| format!("{}: {why}", at()))?;
                // gogo-protobuf writes a non-pointer field even when empty: an empty string is
                // the Go zero value JSON would omit, and a zero time is no time.
                if value.is_null() || value == json!("") {
                    object.remove(field.json);
                } else {
                    object.insert(field.json.to_owned(), value);
                }
            }
        }
    }
    Ok(Value::Object(object))
}

fn single(kind: Kind, wire: Wire<'_>) -> Result<Value, String> {
    Ok(match (kind, wire) {
        (Kind::String, Wire::Bytes(bytes)) => json!(utf8(bytes)?),
        (Kind::Bytes, Wire::Bytes(bytes)) => {
            json!(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
        (Kind::Int, Wire::Varint(value)) => json!(signed(value)),
        (Kind::Bool, Wire::Varint(value)) => json!(value != 0),
        (Kind::Message(name), Wire::Bytes(bytes)) => message(name, bytes)?,
        (kind, wire) => return Err(format!("{kind:?} cannot be {wire:?}")),
    })
}

/// A repeated field's occurrence: one item, or several packed scalars.
fn repeated(kind: Kind, wire: Wire<'_>) -> Result<Vec<Value>, String> {
    match (kind, wire) {
        (Kind::Int | Kind::Bool, Wire::Bytes(packed)) => {
            let mut items = Vec::new();
            let mut rest = packed;
            while !rest.is_empty() {
                let (value, after) = varint(rest).ok_or("a packed varint is cut short")?;
                items.push(single(kind, Wire::Varint(value))?);
                rest = after;
            }
            Ok(items)
        }
        _ => Ok(vec![single(kind, wire)?]),
    }
}

fn map_entry(entry: &[u8], kind: Kind) -> Result<(String, Value), String> {
    let (mut key, mut value) = (String::new(), None);
    for (tag, wire) in wire_fields(entry)? {
        match (tag, wire) {
            (1, Wire::Bytes(bytes)) => key = utf8(bytes)?,
            (2, wire) => {
                let kind = match kind {
                    Kind::StringMap => Kind::String,
                    Kind::BytesMap => Kind::Bytes,
                    Kind::MessageMap(name) => Kind::Message(name),
                    other => other,
                };
                value = Some(single(kind, wire)?);
            }
            _ => {}
        }
    }
    let empty = match kind {
        Kind::MessageMap(_) => json!({}),
        _ => json!(""),
    };
    Ok((key, value.unwrap_or(empty)))
}

/// metav1.Time (whole seconds) or MicroTime (six digits) in RFC 3339; none when zero.
fn time(bytes: &[u8], micro: bool) -> Result<Value, String> {
    let (mut seconds, mut nanos) = (0i64, 0i64);
    for (tag, wire) in wire_fields(bytes)? {
        match (tag, wire) {
            (1, Wire::Varint(value)) => seconds = signed(value),
            (2, Wire::Varint(value)) => nanos = signed(value),
            _ => {}
        }
    }
    if seconds == 0 && nanos == 0 {
        return Ok(Value::Null);
    }
    let at = jiff::Timestamp::new(seconds, i32::try_from(nanos).unwrap_or(0))
        .map_err(|e| format!("a time out of range: {e}"))?;
    Ok(json!(if micro {
        crate::store::timestamps::format_micro_time(at)
    } else {
        crate::store::timestamps::format_time(at)
    }))
}

/// metav1.Duration (nanoseconds) as Go's `time.Duration` prints it: `1h2m3.5s`.
fn duration(bytes: &[u8]) -> Result<Value, String> {
    let mut nanos = 0i64;
    for (tag, wire) in wire_fields(bytes)? {
        if let (1, Wire::Varint(value)) = (tag, wire) {
            nanos = signed(value);
        }
    }
    if nanos == 0 {
        return Ok(json!("0s"));
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let total = nanos.unsigned_abs();
    let (hours, minutes) = (total / 3_600_000_000_000, total / 60_000_000_000 % 60);
    let (seconds, fraction) = (total / 1_000_000_000 % 60, total % 1_000_000_000);
    let mut text = String::from(sign);
    if hours > 0 {
        let _ = write!(text, "{hours}h");
    }
    if hours > 0 || minutes > 0 {
        let _ = write!(text, "{minutes}m");
    }
    let fraction = format!("{fraction:09}");
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        let _ = write!(text, "{seconds}s");
    } else {
        let _ = write!(text, "{seconds}.{fraction}s");
    }
    Ok(json!(text))
}

fn int_or_string(bytes: &[u8]) -> Result<Value, String> {
    let (mut is_string, mut number, mut text) = (false, 0i64, String::new());
    for (tag, wire) in wire_fields(bytes)? {
        match (tag, wire) {
            (1, Wire::Varint(kind)) => is_string = kind == 1,
            (2, Wire::Varint(value)) => number = signed(value),
            (3, Wire::Bytes(bytes)) => text = utf8(bytes)?,
            _ => {}
        }
    }
    Ok(if is_string {
        json!(text)
    } else {
        json!(number)
    })
}

/// RawExtension and FieldsV1 carry JSON in their first field.
fn raw_json(bytes: &[u8]) -> Result<Value, String> {
    let raw = wire_fields(bytes)?
        .into_iter()
        .find_map(|(tag, wire)| match (tag, wire) {
            (1, Wire::Bytes(raw)) => Some(raw),
            _ => None,
        })
        .unwrap_or_default();
    if raw.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(raw).map_err(|e| format!("embedded raw data is not JSON: {e}"))
}

fn string_field(bytes: &[u8], number: u64) -> Result<String, String> {
    for (tag, wire) in wire_fields(bytes)? {
        if let (true, Wire::Bytes(text)) = (tag == number, wire) {
            return utf8(text);
        }
    }
    Ok(String::new())
}

fn utf8(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "a string is not UTF-8".to_owned())
}

/// A message's fields in order.
pub(super) fn wire_fields(mut message: &[u8]) -> Result<Vec<(u64, Wire<'_>)>, String> {
    let cut = || "the message is cut short".to_owned();
    let mut found = Vec::new();
    while !message.is_empty() {
        let (key, rest) = varint(message).ok_or_else(cut)?;
        message = rest;
        let wire = match key & 7 {
            0 => {
                let (value, rest) = varint(message).ok_or_else(cut)?;
                message = rest;
                Wire::Varint(value)
            }
            1 => {
                message = message.get(8..).ok_or_else(cut)?;
                Wire::Fixed64
            }
            5 => {
                message = message.get(4..).ok_or_else(cut)?;
                Wire::Fixed32
            }
            2 => {
                let (length, rest) = varint(message).ok_or_else(cut)?;
                let length = usize::try_from(length).map_err(|_| cut())?;
                let bytes = rest.get(..length).ok_or_else(cut)?;
                message = &rest[length..];
                Wire::Bytes(bytes)
            }
            other => return Err(format!("wire type {other} is not read")),
        };
        found.push((key >> 3, wire));
    }
    Ok(found)
}

/// int32 and int64 travel as varints of their two's complement (sign-extended to ten bytes).
fn signed(value: u64) -> i64 {
    i64::from_ne_bytes(value.to_ne_bytes())
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
