//! What a request asks to do, read from its method and path alone, as the API server's
//! `RequestInfoFactory` reads it before any routing (so an unknown path is still authorized,
//! as a non-resource URL).

use http::Method;

/// The attributes an authorizer judges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    pub kind: Request,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Resource(Resource),
    NonResource { path: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resource {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

/// Subresources of a namespace itself, not resources inside it.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl Attributes {
    pub fn from_request(method: &Method, path: &str, query: Option<&str>) -> Self {
        let verb = match *method {
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "get",
        };
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, rest) = match parts.as_slice() {
            ["api", rest @ ..] if rest.len() >= 2 => ("", rest),
            ["apis", group, rest @ ..] if rest.len() >= 2 => (*group, rest),
            _ => return Self::non_resource(method, path),
        };
        let version = rest[0];
        let mut current = &rest[1..];
        let mut verb = verb;
        // The deprecated `/watch/` prefix.
        if current.first() == Some(&"watch") {
            verb = "watch";
            current = &current[1..];
            if current.is_empty() {
                return Self::non_resource(method, path);
            }
        }
        let mut namespace = "";
        if current[0] == "namespaces" && current.len() > 1 {
            namespace = current[1];
            if current.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&current[2]) {
                current = &current[2..];
            }
        }
        let mut resource = Resource {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: current[0].to_owned(),
            subresource: current.get(2).copied().unwrap_or_default().to_owned(),
            namespace: namespace.to_owned(),
            name: current.get(1).copied().unwrap_or_default().to_owned(),
        };
        if resource.name.is_empty() && verb == "get" {
            let pairs: Vec<(String, String)> =
                form_urlencoded::parse(query.unwrap_or_default().as_bytes())
                    .into_owned()
                    .collect();
            let watch = pairs
                .iter()
                .any(|(key, value)| key == "watch" && matches!(value.as_str(), "true" | "1"));
            verb = if watch { "watch" } else { "list" };
            if let Some((_, selector)) = pairs.iter().find(|(key, _)| key == "fieldSelector")
                && let Some(name) = exact_name(selector)
            {
                name.clone_into(&mut resource.name);
            }
        }
        if resource.name.is_empty() && verb == "delete" {
            verb = "deletecollection";
        }
        Self::resource(verb, resource)
    }

    fn non_resource(method: &Method, path: &str) -> Self {
        Self {
            verb: method.as_str().to_lowercase(),
            kind: Request::NonResource {
                path: path.to_owned(),
            },
        }
    }

    /// A resource request's attributes.
    pub fn resource(verb: &str, resource: Resource) -> Self {
        Self {
            verb: verb.to_owned(),
            kind: Request::Resource(resource),
        }
    }
}

/// The name a field selector requires exactly (`metadata.name=x`, possibly among other terms).
fn exact_name(selector: &str) -> Option<&str> {
    selector.split(',').find_map(|term| {
        let term = term.trim();
        term.strip_prefix("metadata.name==")
            .or_else(|| term.strip_prefix("metadata.name="))
            .filter(|name| !name.is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(attributes: &Attributes) -> &Resource {
        match &attributes.kind {
            Request::Resource(resource) => resource,
            Request::NonResource { path } => panic!("{path} read as a non-resource URL"),
        }
    }

    #[test]
    fn paths_read_like_request_info() {
        let read = |method: Method, path: &str, query: Option<&str>| {
            Attributes::from_request(&method, path, query)
        };
        let list = read(Method::GET, "/api/v1/namespaces/ns/pods", None);
        assert_eq!(list.verb, "list");
        assert_eq!(resource(&list).namespace, "ns");
        let watch = read(
            Method::GET,
            "/api/v1/namespaces/ns/secrets",
            Some("watch=true&fieldSelector=metadata.name%3Dcerts"),
        );
        assert_eq!(watch.verb, "watch");
        assert_eq!(resource(&watch).name, "certs");
        let status = read(Method::PATCH, "/api/v1/nodes/n1/status", None);
        assert_eq!(
            resource(&status),
            &Resource {
                version: "v1".to_owned(),
                resource: "nodes".to_owned(),
                subresource: "status".to_owned(),
                name: "n1".to_owned(),
                ..Resource::default()
            }
        );
        let namespace = read(Method::GET, "/api/v1/namespaces/ns", None);
        assert_eq!(
            (
                namespace.verb.as_str(),
                resource(&namespace).namespace.as_str()
            ),
            ("get", "ns")
        );
        let namespace_status = read(Method::PUT, "/api/v1/namespaces/ns/status", None);
        assert_eq!(resource(&namespace_status).subresource, "status");
        let eviction = read(Method::POST, "/api/v1/namespaces/ns/pods/p/eviction", None);
        assert_eq!(
            (
                eviction.verb.as_str(),
                resource(&eviction).subresource.as_str()
            ),
            ("create", "eviction")
        );
        let collection = read(
            Method::DELETE,
            "/apis/coordination.k8s.io/v1/namespaces/ns/leases",
            None,
        );
        assert_eq!(collection.verb, "deletecollection");
        assert_eq!(resource(&collection).group, "coordination.k8s.io");
        for path in ["/api", "/api/v1", "/apis/apps/v1", "/version", "/healthz"] {
            assert!(matches!(
                read(Method::GET, path, None).kind,
                Request::NonResource { .. }
            ));
        }
    }
}
