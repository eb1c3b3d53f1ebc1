//! ServiceAccount tokens: JWTs with the claims the real token issuer writes
//! (pkg/serviceaccount/claims.go), signed with HS256 and a key made at start, so this server
//! can tell its own tokens from forged ones (TokenReview).

use std::sync::Arc;

use base64::Engine;
use ring::hmac;
use serde_json::{Value, json};

/// The audience of tokens made without one: the API server's own.
pub const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

#[derive(Clone)]
pub struct TokenIssuer {
    key: Arc<hmac::Key>,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenIssuer")
    }
}

impl Default for TokenIssuer {
    fn default() -> Self {
        let secret: [u8; 32] = rand::random();
        Self {
            key: Arc::new(hmac::Key::new(hmac::HMAC_SHA256, &secret)),
        }
    }
}

fn encode(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl TokenIssuer {
    /// A signed JWT carrying `claims`.
    pub fn issue(&self, claims: &Value) -> String {
        let header = encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let payload = encode(&serde_json::to_vec(claims).unwrap_or_default());
        let signed = format!("{header}.{payload}");
        let signature = hmac::sign(&self.key, signed.as_bytes());
        format!("{signed}.{}", encode(signature.as_ref()))
    }

    /// The claims of a token this issuer signed and that has not expired.
    pub fn verify(&self, token: &str) -> Result<Value, &'static str> {
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("not a JWT");
        };
        let decode = |part: &str| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(part)
                .map_err(|_| "not a JWT")
        };
        hmac::verify(
            &self.key,
            format!("{header}.{payload}").as_bytes(),
            &decode(signature)?,
        )
        .map_err(|_| "invalid bearer token")?;
        let claims: Value = serde_json::from_slice(&decode(payload)?).map_err(|_| "not a JWT")?;
        let now = jiff::Timestamp::now().as_second();
        if claims["exp"].as_i64().is_none_or(|exp| exp <= now) {
            return Err("token has expired");
        }
        Ok(claims)
    }
}

/// The claims of a ServiceAccount token.
pub fn service_account_claims(
    namespace: &str,
    account: &Value,
    audiences: &Value,
    seconds: i64,
    bound: &Value,
    node: Option<&Value>,
) -> Value {
    let name = account["metadata"]["name"].as_str().unwrap_or_default();
    let now = jiff::Timestamp::now().as_second();
    let mut private = json!({
        "namespace": namespace,
        "serviceaccount": {"name": name, "uid": account["metadata"]["uid"]},
    });
    if let Some(kind) = bound["kind"].as_str() {
        private[kind.to_lowercase()] = json!({"name": bound["name"], "uid": bound["uid"]});
    }
    if let Some(node) = node {
        private["node"] = node.clone();
    }
    json!({
        "aud": audiences,
        "exp": now + seconds,
        "iat": now,
        "nbf": now,
        "iss": API_AUDIENCE,
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
        "jti": crate::store::names::new_uid(),
        "kubernetes.io": private,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_only_with_their_issuer_and_before_expiry() {
        let issuer = TokenIssuer::default();
        let account = json!({"metadata": {"name": "sa", "uid": "u"}});
        let claims =
            service_account_claims("ns", &account, &json!(["api"]), 600, &Value::Null, None);
        let token = issuer.issue(&claims);
        assert_eq!(
            issuer.verify(&token).unwrap()["sub"],
            "system:serviceaccount:ns:sa"
        );
        assert_eq!(
            TokenIssuer::default().verify(&token),
            Err("invalid bearer token")
        );
        let expired = issuer.issue(&service_account_claims(
            "ns",
            &account,
            &json!(["api"]),
            -1,
            &Value::Null,
            None,
        ));
        assert_eq!(issuer.verify(&expired), Err("token has expired"));
        assert_eq!(issuer.verify("a.b"), Err("not a JWT"));
    }
}
