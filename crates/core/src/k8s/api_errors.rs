//! What an API error means for the caller: retry it, give up, or count it as done. One table
//! for every write the programs make (deletes, evictions, patches), so a 403 from missing RBAC
//! is not retried to a deadline as if the server were merely busy.

/// The caller's next step after an API call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiErrorClass {
    /// Transient: the server is busy, unreachable, or the object changed underneath (409 on an
    /// update). Retry with backoff.
    Retry,
    /// The request can never succeed as sent: forbidden, invalid, malformed. Retrying only
    /// burns the budget; report it.
    Final,
    /// The object is already gone (404) or is no longer the one meant (409 from a UID
    /// precondition): for a delete, the goal is reached.
    Gone,
}

/// Classifies the error of a delete or eviction of one object with a UID precondition.
pub fn classify_delete(error: &kube::Error) -> ApiErrorClass {
    match status_code(error) {
        Some(404 | 409) => ApiErrorClass::Gone,
        code => classify_code(code),
    }
}

/// Classifies the error of a create, update or patch.
pub fn classify_write(error: &kube::Error) -> ApiErrorClass {
    classify_code(status_code(error))
}

/// The HTTP status the API server answered with, if it answered.
pub fn status_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn classify_code(code: Option<u16>) -> ApiErrorClass {
    match code {
        // No answer (connection, TLS, timeout): the server may be back in a moment. 409
        // Conflict on a write is a stale resourceVersion: read again and retry. 429 is the
        // server's (or a PDB's) "later".
        None | Some(409 | 429 | 500..) => ApiErrorClass::Retry,
        // 400 bad request, 401/403 RBAC, 404 on a write, 405, 410 gone, 413, 415, 422 invalid.
        Some(_) => ApiErrorClass::Final,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn every_status_has_one_meaning() {
        use ApiErrorClass::{Final, Gone, Retry};
        let cases = [
            (400, Final, Final),
            (401, Final, Final),
            (403, Final, Final),
            (404, Gone, Final),
            (405, Final, Final),
            (409, Gone, Retry),
            (410, Final, Final),
            (422, Final, Final),
            (429, Retry, Retry),
            (500, Retry, Retry),
            (503, Retry, Retry),
            (504, Retry, Retry),
        ];
        for (code, delete, write) in cases {
            assert_eq!(classify_delete(&api(code)), delete, "delete {code}");
            assert_eq!(classify_write(&api(code)), write, "write {code}");
        }
        let unreachable = kube::Error::Service("connection refused".into());
        assert_eq!(classify_delete(&unreachable), Retry);
        assert_eq!(classify_write(&unreachable), Retry);
    }
}
