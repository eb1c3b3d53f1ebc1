//! The form a client asked for in its Accept header: the object itself, a server-side printed
//! Table (kubectl), or only its metadata (`as=PartialObjectMetadata[List]`, kube-rs's
//! `metadata_watcher`), as apiserver/pkg/endpoints/handlers/response.go transforms them.

use axum::http::{HeaderMap, header};
use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendering {
    Full,
    Table,
    Metadata,
}

impl Rendering {
    /// The first media type of the Accept header that this server can produce.
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|accept| accept.to_str().ok())
            .unwrap_or_default();
        for media in accept.split(',') {
            let wanted = media
                .split(';')
                .map(str::trim)
                .find_map(|param| param.strip_prefix("as="));
            match wanted {
                None => return Self::Full,
                Some("Table") => return Self::Table,
                Some("PartialObjectMetadata" | "PartialObjectMetadataList") => {
                    return Self::Metadata;
                }
                Some(_) => {}
            }
        }
        Self::Full
    }
}

/// An object reduced to its metadata.
pub fn partial(object: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": object["metadata"],
    })
}

/// A written object's response body reduced to its metadata; a Status (a delete's answer)
/// stays as it is.
pub fn partial_body(body: &[u8]) -> Option<Vec<u8>> {
    let object: Value = serde_json::from_slice(body).ok()?;
    if object["kind"] == "Status" || !object["metadata"].is_object() {
        return None;
    }
    serde_json::to_vec(&partial(&object)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn accepting(value: &'static str) -> Rendering {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static(value));
        Rendering::from_headers(&headers)
    }

    #[test]
    fn the_first_producible_media_type_wins() {
        assert_eq!(
            accepting("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
            Rendering::Table
        );
        assert_eq!(
            accepting("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"),
            Rendering::Metadata
        );
        assert_eq!(
            accepting("application/json;as=Unknown;g=x;v=v1,application/json"),
            Rendering::Full
        );
        assert_eq!(Rendering::from_headers(&HeaderMap::new()), Rendering::Full);
    }
}
