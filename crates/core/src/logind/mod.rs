//! logind client.
