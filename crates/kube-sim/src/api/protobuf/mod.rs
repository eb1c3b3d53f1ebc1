//! Bodies in the Kubernetes protobuf encoding (runtime/serializer/protobuf), read as JSON: the
//! envelope is `k8s\0` and a `runtime.Unknown` whose `typeMeta` names the kind and whose `raw`
//! is the object's message. Read for the kinds kubectl's `create` generators, `kubectl auth
//! can-i`, helm's release records and client-go's typed deletions send (the roots in
//! schema.rs); any other body, or a field the table lacks, is refused with 415, naming why.

mod decode;
mod schema;

use serde_json::Value;

use decode::wire_fields;

/// The envelope's magic prefix.
const MAGIC: &[u8] = b"k8s\0";

/// The object a protobuf body carries, as JSON, or why it cannot be read.
pub fn object(body: &[u8]) -> Result<Value, String> {
    let unknown = body
        .strip_prefix(MAGIC)
        .ok_or("the body does not start with the protobuf envelope's k8s\\0")?;
    let (mut type_meta, mut raw) = (None, None);
    for (tag, field) in wire_fields(unknown)? {
        match (tag, field) {
            (1, decode::Wire::Bytes(bytes)) => type_meta = Some(bytes),
            (2, decode::Wire::Bytes(bytes)) => raw = Some(bytes),
            _ => {}
        }
    }
    let (mut api_version, mut kind) = (String::new(), String::new());
    for (tag, field) in wire_fields(type_meta.unwrap_or_default())? {
        if let decode::Wire::Bytes(text) = field {
            let text = String::from_utf8_lossy(text).into_owned();
            match tag {
                1 => api_version = text,
                2 => kind = text,
                _ => {}
            }
        }
    }
    decode::object(&api_version, &kind, raw.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use k8s_pb::api::apps::v1 as apps;
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
    use prost::Message;
    use serde_json::json;

    use super::{MAGIC, object};

    /// A body as client-go writes it: the envelope around the object's message.
    fn body(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.to_owned()),
                kind: Some(kind.to_owned()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC, &unknown.encode_to_vec()].concat()
    }

    #[test]
    fn a_deployment_reads_as_its_json() {
        let labels = std::collections::BTreeMap::from([("app".to_owned(), "web".to_owned())]);
        let deployment = apps::Deployment {
            metadata: Some(meta::ObjectMeta {
                name: Some("web".to_owned()),
                labels: labels.clone(),
                creation_timestamp: Some(meta::Time::default()),
                ..Default::default()
            }),
            spec: Some(apps::DeploymentSpec {
                replicas: Some(0),
                selector: Some(meta::LabelSelector {
                    match_labels: labels.clone(),
                    ..Default::default()
                }),
                template: Some(core::PodTemplateSpec {
                    metadata: Some(meta::ObjectMeta {
                        labels,
                        ..Default::default()
                    }),
                    spec: Some(core::PodSpec {
                        containers: vec![core::Container {
                            name: Some("nginx".to_owned()),
                            image: Some("nginx".to_owned()),
                            working_dir: Some(String::new()),
                            ports: vec![core::ContainerPort {
                                container_port: Some(80),
                                ..Default::default()
                            }],
                            resources: Some(core::ResourceRequirements::default()),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            status: Some(apps::DeploymentStatus::default()),
        };
        let read = object(&body("apps/v1", "Deployment", deployment.encode_to_vec())).unwrap();
        assert_eq!(
            read,
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": "web"}},
                    "template": {
                        "metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "nginx", "image": "nginx", "ports": [{"containerPort": 80}], "resources": {}}]},
                    },
                },
                "status": {},
            })
        );
    }

    #[test]
    fn a_kind_not_in_the_table_is_named() {
        let why = object(&body("v1", "Node", Vec::new())).unwrap_err();
        assert_eq!(why, "Node (v1) is not read from protobuf here");
        assert!(object(b"{}").is_err());
    }
}
