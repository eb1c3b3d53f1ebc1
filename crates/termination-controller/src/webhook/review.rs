//! AdmissionReview v1 in and out, for Nodes. Whatever arrives gets an answer: a body that is
//! not a v1 AdmissionReview is refused with the reason (HTTP 400), and a review this webhook
//! cannot judge is denied with what to fix in the webhook configuration. The decoder never
//! panics: a property test feeds it generated input.

use base64::Engine;
use k8s_openapi::api::core::v1::Node;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionReview, Operation};
use nodegrace_core::k8s::cached_node::CachedNode;
use serde_json::{Value, json};

/// The largest body read: a review carries a Node twice at most (object and oldObject), and
/// the API server stores objects of 1.5 MiB at most.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

const API_VERSION: &str = "admission.k8s.io/v1";
const KIND: &str = "AdmissionReview";

/// A review of a Node this webhook judges.
#[derive(Debug, Clone)]
pub struct NodeReview {
    pub uid: String,
    pub operation: NodeOperation,
    /// The node being created, or the one being deleted.
    pub node: CachedNode,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeOperation {
    Create,
    Delete,
}

/// What a body decodes to, short of being unreadable.
#[derive(Debug)]
pub enum Decoded {
    Review(Box<NodeReview>),
    /// Readable, but not something this webhook can allow: answered with a denial.
    Refused {
        uid: String,
        message: String,
    },
    /// An operation this webhook has no opinion on (an UPDATE, say): allowed unchanged.
    Unjudged {
        uid: String,
    },
}

/// A body that is no v1 AdmissionReview at all; answered with HTTP 400.
#[derive(Debug, thiserror::Error)]
pub enum BadReview {
    #[error("the body is not a v1 AdmissionReview: {0}")]
    Json(#[from] serde_json::Error),
    #[error(
        "got apiVersion {api_version:?} kind {kind:?}; this webhook reads {API_VERSION} \
         {KIND} only (set admissionReviewVersions: [v1] in the webhook configuration)"
    )]
    Version { api_version: String, kind: String },
    #[error("the AdmissionReview has no request")]
    NoRequest,
    #[error("the AdmissionReview's request has no uid")]
    NoUid,
}

/// Reads one review.
pub fn decode(body: &[u8]) -> Result<Decoded, BadReview> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)?;
    if review.types.api_version != API_VERSION || review.types.kind != KIND {
        return Err(BadReview::Version {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    let request = review.request.ok_or(BadReview::NoRequest)?;
    if request.uid.is_empty() {
        return Err(BadReview::NoUid);
    }
    let uid = request.uid;
    let refused = |message: String| Decoded::Refused {
        uid: uid.clone(),
        message,
    };
    let kind = &request.kind;
    if (
        kind.group.as_str(),
        kind.version.as_str(),
        kind.kind.as_str(),
    ) != ("", "v1", "Node")
        || request.sub_resource.is_some()
    {
        return Ok(refused(format!(
            "this webhook reviews v1 Nodes only, got {}; the webhook configuration's rules \
             must name the resource \"nodes\" of the core group only",
            described(&request.kind, request.sub_resource.as_deref()),
        )));
    }
    let (operation, object, field) = match request.operation {
        Operation::Create => (NodeOperation::Create, request.object, "object"),
        Operation::Delete => (NodeOperation::Delete, request.old_object, "oldObject"),
        Operation::Update | Operation::Connect => return Ok(Decoded::Unjudged { uid }),
    };
    let Some(object) = object else {
        return Ok(refused(format!(
            "request.{field} is missing: the API server sends the node being {}",
            match operation {
                NodeOperation::Create => "created",
                NodeOperation::Delete => "deleted",
            }
        )));
    };
    let node = serde_json::to_value(object)
        .and_then(serde_json::from_value::<Node>)
        // Parsed whole, so a malformed field anywhere is refused; kept as the controller
        // keeps every node.
        .map(CachedNode::from)
        .map_err(|error| format!("request.{field} is not a valid v1 Node: {error}"));
    Ok(match node {
        Ok(node) => Decoded::Review(Box::new(NodeReview {
            uid,
            operation,
            node,
            dry_run: request.dry_run,
        })),
        Err(message) => refused(message),
    })
}

fn described(kind: &kube::core::GroupVersionKind, sub_resource: Option<&str>) -> String {
    let group_version = if kind.group.is_empty() {
        kind.version.clone()
    } else {
        format!("{}/{}", kind.group, kind.version)
    };
    match sub_resource {
        Some(sub) => format!("{group_version} {} (subresource {sub})", kind.kind),
        None => format!("{group_version} {}", kind.kind),
    }
}

/// A denial as the API server passes it on to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

/// The answer to one review.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answer {
    pub denial: Option<Denial>,
    /// JSON Patch operations (mutating reviews only).
    pub patch: Vec<Value>,
    /// Shown by kubectl as `Warning: …` lines.
    pub warnings: Vec<String>,
}

impl Answer {
    pub fn allow() -> Self {
        Self::default()
    }

    pub fn deny(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            denial: Some(Denial {
                code,
                reason,
                message: message.into(),
            }),
            ..Self::default()
        }
    }

    pub fn allowed(&self) -> bool {
        self.denial.is_none()
    }
}

/// The AdmissionReview answering request `uid`.
pub fn encode(uid: &str, answer: &Answer) -> Vec<u8> {
    let mut response = json!({"uid": uid, "allowed": answer.allowed()});
    if let Some(denial) = &answer.denial {
        response["status"] = json!({
            "status": "Failure",
            "code": denial.code,
            "reason": denial.reason,
            "message": denial.message,
        });
    }
    if !answer.patch.is_empty() {
        let patch = serde_json::to_vec(&answer.patch).unwrap_or_default();
        response["patch"] = base64::engine::general_purpose::STANDARD
            .encode(patch)
            .into();
        response["patchType"] = "JSONPatch".into();
    }
    if !answer.warnings.is_empty() {
        response["warnings"] = json!(answer.warnings);
    }
    let review = json!({"apiVersion": API_VERSION, "kind": KIND, "response": response});
    serde_json::to_vec(&review).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(operation: &str, kind: &str, object: &Value) -> Vec<u8> {
        let object_field = if operation == "DELETE" {
            "oldObject"
        } else {
            "object"
        };
        serde_json::to_vec(&json!({
            "apiVersion": API_VERSION, "kind": KIND,
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": kind},
                "resource": {"group": "", "version": "v1", "resource": "nodes"},
                "name": "n", "operation": operation,
                "userInfo": {"username": "admin"},
                object_field: object,
            },
        }))
        .unwrap()
    }

    #[test]
    fn decodes_node_creates_and_deletes() {
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}});
        let Decoded::Review(created) = decode(&review("CREATE", "Node", &node)).unwrap() else {
            panic!("a node CREATE is judged");
        };
        assert_eq!(created.operation, NodeOperation::Create);
        assert_eq!(created.node.metadata.name.as_deref(), Some("n"));
        let Decoded::Review(deleted) = decode(&review("DELETE", "Node", &node)).unwrap() else {
            panic!("a node DELETE is judged");
        };
        assert_eq!(deleted.operation, NodeOperation::Delete);
        assert!(matches!(
            decode(&review("UPDATE", "Node", &node)).unwrap(),
            Decoded::Unjudged { .. }
        ));
    }

    #[test]
    fn says_what_is_wrong_with_everything_else() {
        let pod = json!({"metadata": {"name": "p"}});
        let Decoded::Refused { uid, message } = decode(&review("CREATE", "Pod", &pod)).unwrap()
        else {
            panic!("a Pod is refused");
        };
        assert_eq!(uid, "u-1");
        assert!(message.contains("v1 Nodes only, got v1 Pod"), "{message}");
        let bad_spec = json!({"metadata": {"name": "n"}, "spec": {"taints": "none"}});
        let Decoded::Refused { message, .. } =
            decode(&review("CREATE", "Node", &bad_spec)).unwrap()
        else {
            panic!("a malformed node is refused");
        };
        assert!(message.starts_with("request.object is not a valid v1 Node"));
        let mut missing: Value = serde_json::from_slice(&review("DELETE", "Node", &pod)).unwrap();
        missing["request"]["oldObject"] = Value::Null;
        let Decoded::Refused { message, .. } =
            decode(&serde_json::to_vec(&missing).unwrap()).unwrap()
        else {
            panic!("a DELETE without the node is refused");
        };
        assert!(message.contains("request.oldObject is missing"));
        let mut v1beta1 = missing.clone();
        v1beta1["apiVersion"] = "admission.k8s.io/v1beta1".into();
        let error = decode(&serde_json::to_vec(&v1beta1).unwrap()).unwrap_err();
        assert!(error.to_string().contains("admissionReviewVersions: [v1]"));
        assert!(matches!(decode(b"{"), Err(BadReview::Json(_))));
        assert!(matches!(
            decode(br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#),
            Err(BadReview::NoRequest)
        ));
    }

    #[test]
    fn encodes_denials_patches_and_warnings() {
        let mut answer = Answer::deny(403, "Forbidden", "no");
        answer.warnings.push("careful".to_owned());
        let review: Value = serde_json::from_slice(&encode("u-2", &answer)).unwrap();
        assert_eq!(review["response"]["uid"], "u-2");
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(review["response"]["status"]["code"], 403);
        assert_eq!(review["response"]["warnings"][0], "careful");
        let patched = Answer {
            patch: vec![json!({"op": "add", "path": "/metadata/finalizers", "value": ["f"]})],
            ..Answer::allow()
        };
        let review: Value = serde_json::from_slice(&encode("u-3", &patched)).unwrap();
        assert_eq!(review["response"]["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(review["response"]["patch"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&patch).unwrap()[0]["path"],
            "/metadata/finalizers"
        );
    }
}
