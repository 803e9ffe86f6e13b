//! Who a request of `sharedos serve` comes from, and which scope it may
//! name (docs/SERVE.md, "Tenants"; docs/SECURITY.md).
//!
//! Over TCP every request carries a bearer token: the operator's (given
//! at start, trusted with any scope) or a tenant's, stored hashed in the
//! store (`sharedos tokens`) and looked up by its SHA-256 on every
//! request, so a revocation holds from the next request of every host. A
//! tenant's token fixes the scope's `namespaceId` and `authority`; its
//! `Sharedos-Scope` header may give only the `owner` (a header naming
//! another namespace or authority is refused `403 scope_not_permitted`).
//! On the unix socket the peer's uid (`SO_PEERCRED`) may be mapped to a
//! tenant in `[[serve.peers]]`; an unmapped peer is the socket's owner,
//! trusted with any scope as before.

use std::sync::Arc;

use hyper::StatusCode;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use sharedos_protocol::{Address, Identifier};
use sharedos_store::{Store, StoredToken};

use crate::config::PeerTenant;
use crate::session::Scope;

/// The prefix of every tenant token's secret.
pub const TOKEN_PREFIX: &str = "sdt_";

/// Random bytes in a secret (256 bits), and in a token id.
const SECRET_BYTES: usize = 32;
const ID_BYTES: usize = 8;

/// Why a request is refused before it is routed: a status, a stable
/// code, a message saying what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
    fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }
}

/// The part of a scope a tenant's credential fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The token id, or `peer uid <n>`: named in refusals.
    pub credential: String,
    pub namespace_id: Identifier,
    pub authority: Address,
}

/// A tenant's `Sharedos-Scope`: the owner, and optionally the namespace
/// and authority (which must then be the credential's).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TenantScope {
    namespace_id: Option<Identifier>,
    authority: Option<Address>,
    owner: Address,
}

impl Binding {
    /// The scope of a request bound to this tenant, from its
    /// `Sharedos-Scope` header text.
    pub fn scope(&self, header: &str) -> Result<Scope, Refusal> {
        let given: TenantScope = serde_json::from_str(header).map_err(|e| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                "invalid_scope",
                format!("Sharedos-Scope: {e}"),
            )
        })?;
        let not_permitted = |what: &str, named: &str| {
            Refusal::new(
                StatusCode::FORBIDDEN,
                "scope_not_permitted",
                format!(
                    "Sharedos-Scope names the {what} {named}, but the credential {} is bound to another: give only the owner (the {what} comes from the credential)",
                    self.credential
                ),
            )
        };
        if let Some(ns) = given.namespace_id.filter(|ns| *ns != self.namespace_id) {
            return Err(not_permitted("namespaceId", &format!("{:?}", ns.as_str())));
        }
        if let Some(a) = given.authority.filter(|a| *a != self.authority) {
            return Err(not_permitted("authority", &a.path().join("/")));
        }
        Ok(Scope {
            namespace_id: self.namespace_id.clone(),
            authority: self.authority.clone(),
            owner: given.owner,
        })
    }

    fn of_token(token: &StoredToken) -> Result<Self, Refusal> {
        let namespace_id = Identifier::new(&token.namespace_id).map_err(|e| {
            Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                format!("token {}: its stored namespaceId: {e}", token.id),
            )
        })?;
        Ok(Self {
            credential: format!("token {}", token.id),
            namespace_id,
            authority: token.authority.clone(),
        })
    }
}

/// How a connection's requests are authenticated.
#[derive(Clone)]
pub enum Gate {
    /// The unix socket's owner (an unmapped peer): any scope.
    Trusted,
    /// A unix peer mapped to a tenant by `[[serve.peers]]`.
    Bound(Binding),
    /// TCP: a bearer token on every request, the operator's or a tenant's.
    Bearer {
        operator: Arc<String>,
        store: Arc<dyn Store>,
    },
}

impl Gate {
    /// The tenant a request is bound to (`None`: the operator or the
    /// socket's owner, any scope), or why it is refused. A tenant may not
    /// read the host's metrics (they count every tenant's runs).
    pub async fn admit(
        &self,
        authorization: Option<&str>,
        path: &str,
    ) -> Result<Option<Binding>, Refusal> {
        let bound = match self {
            Gate::Trusted => None,
            Gate::Bound(b) => Some(b.clone()),
            Gate::Bearer { operator, store } => {
                bearer(authorization, operator, store.as_ref()).await?
            }
        };
        if bound.is_some() && path.trim_end_matches('/') == "/metrics" {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "operator_only",
                "/metrics counts every tenant's runs: only the operator's credential may read it",
            ));
        }
        Ok(bound)
    }
}

async fn bearer(
    authorization: Option<&str>,
    operator: &str,
    store: &dyn Store,
) -> Result<Option<Binding>, Refusal> {
    let Some(given) = authorization.and_then(|v| v.strip_prefix("Bearer ")) else {
        return Err(Refusal::unauthorized(
            "send Authorization: Bearer <token> (a tenant's token from `sharedos tokens add`, or the operator's)",
        ));
    };
    if constant_time_eq(given.as_bytes(), operator.as_bytes()) {
        return Ok(None);
    }
    let hash = secret_sha256(given);
    let token = store.token_by_hash(&hash).await.map_err(|e| {
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("the token could not be checked: {e}"),
        )
    })?;
    match token {
        Some(t) if constant_time_eq(t.secret_sha256.as_bytes(), hash.as_bytes()) => {
            if t.revoked_at.is_some() {
                return Err(Refusal::unauthorized(
                    "this token was revoked: ask the operator for a new one",
                ));
            }
            Binding::of_token(&t).map(Some)
        }
        _ => Err(Refusal::unauthorized(
            "the bearer token is not known: use a token from `sharedos tokens add`, or the operator's",
        )),
    }
}

/// Equal bytes, compared in time that depends on the lengths only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The SHA-256 of a secret, lowercase hex: what the store keeps.
pub fn secret_sha256(secret: &str) -> String {
    hex(&Sha256::digest(secret.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(n: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; n];
    let mut filled = 0;
    while filled < n {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(got) => filled += got,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(hex(&buf))
}

/// A new token for `namespace_id` under `authority`: the row to store
/// and the secret to show once (`sdt_` and 64 hex digits from the OS's
/// random source).
pub fn new_token(
    namespace_id: &Identifier,
    authority: &Address,
    label: &str,
    at: &str,
) -> std::io::Result<(StoredToken, String)> {
    let secret = format!("{TOKEN_PREFIX}{}", random_hex(SECRET_BYTES)?);
    let token = StoredToken {
        id: format!("tok_{}", random_hex(ID_BYTES)?),
        namespace_id: namespace_id.as_str().to_owned(),
        authority: authority.clone(),
        label: label.to_owned(),
        secret_sha256: secret_sha256(&secret),
        created_at: at.to_owned(),
        revoked_at: None,
    };
    Ok((token, secret))
}

/// The gate of a unix peer with uid `uid`: its tenant when
/// `[[serve.peers]]` maps the uid, else the socket's owner (any scope).
pub fn peer_gate(peers: &[PeerTenant], uid: u32) -> Gate {
    match peers.iter().find(|p| p.uid == uid) {
        Some(p) => Gate::Bound(Binding {
            credential: format!("peer uid {uid}"),
            namespace_id: p.namespace_id.clone(),
            authority: p.authority.clone(),
        }),
        None => Gate::Trusted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn address(v: serde_json::Value) -> Address {
        serde_json::from_value(v).unwrap()
    }

    fn peer(uid: u32, ns: &str) -> PeerTenant {
        PeerTenant {
            uid,
            namespace_id: Identifier::new(ns).unwrap(),
            authority: address(json!({"kind": "service", "serviceId": "app"})),
        }
    }

    #[test]
    fn a_mapped_uid_is_bound_and_an_unmapped_one_is_the_owner() {
        let peers = [peer(1000, "tenant-a"), peer(1001, "tenant-b")];
        match peer_gate(&peers, 1001) {
            Gate::Bound(b) => {
                assert_eq!(b.namespace_id.as_str(), "tenant-b");
                assert_eq!(b.credential, "peer uid 1001");
            }
            _ => panic!("uid 1001 is mapped"),
        }
        assert!(matches!(peer_gate(&peers, 0), Gate::Trusted));
        assert!(matches!(peer_gate(&[], 1000), Gate::Trusted));
    }

    #[test]
    fn a_tenant_header_gives_the_owner_and_may_not_name_another_scope() {
        let Gate::Bound(b) = peer_gate(&[peer(7, "tenant-a")], 7) else {
            panic!("mapped")
        };
        let owner = r#"{"owner": {"kind": "human", "userId": "u"}}"#;
        let scope = b.scope(owner).unwrap();
        assert_eq!(scope.namespace_id.as_str(), "tenant-a");
        assert_eq!(scope.authority, b.authority);
        let same = r#"{"namespaceId": "tenant-a", "authority": {"kind": "service", "serviceId": "app"}, "owner": {"kind": "human", "userId": "u"}}"#;
        assert_eq!(b.scope(same).unwrap(), scope);
        let other_ns = r#"{"namespaceId": "tenant-b", "owner": {"kind": "human", "userId": "u"}}"#;
        assert_eq!(b.scope(other_ns).unwrap_err().code, "scope_not_permitted");
        let other_auth = r#"{"authority": {"kind": "service", "serviceId": "x"}, "owner": {"kind": "human", "userId": "u"}}"#;
        assert_eq!(
            b.scope(other_auth).unwrap_err().status,
            StatusCode::FORBIDDEN
        );
        assert_eq!(b.scope("{}").unwrap_err().code, "invalid_scope");
    }

    #[test]
    fn secrets_are_prefixed_random_and_kept_as_their_hash() {
        let ns = Identifier::new("tenant-a").unwrap();
        let auth = address(json!({"kind": "service", "serviceId": "app"}));
        let (a, secret_a) = new_token(&ns, &auth, "l", "t").unwrap();
        let (b, secret_b) = new_token(&ns, &auth, "l", "t").unwrap();
        assert!(secret_a.starts_with(TOKEN_PREFIX) && secret_a.len() == 4 + 64);
        assert_ne!(secret_a, secret_b);
        assert_ne!(a.id, b.id);
        assert_eq!(a.secret_sha256, secret_sha256(&secret_a));
        assert!(!a.secret_sha256.contains(&secret_a[4..]));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd") && !constant_time_eq(b"abc", b"ab"));
    }
}
