//! Grants: the only authority the kernel honours, and how one covers a
//! requirement.
//!
//! A grant comes from a trusted [`GrantSource`], never from a request, a
//! message or tool arguments. It covers a requirement only when **one**
//! capability of it covers the namespace, the owner, the path (by whole
//! segments) and the action together: there is no cross-product between
//! capabilities or between grants.

use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

pub use crate::usage::{MemoryUsageStore, UsageStore};
use sharedos_protocol::{
    AccessContext, Address, Identifier, PathSegment, Purpose, ShortName, Timestamp,
};

/// How a capability's path covers a requested path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// The same path, segment for segment.
    Exact,
    /// The same path or any path below it, by whole segments (`cell-3`
    /// covers `cell-3/x` but never `cell-30`).
    Descendants,
}

/// One resource pattern and the actions allowed on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Capability {
    pub namespace: Identifier,
    #[serde(default)]
    pub path: Vec<PathSegment>,
    /// When set, the capability covers only resources of this owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Address>,
    pub scope: Scope,
    /// Literal action names, or `"*"` for every action.
    pub actions: Vec<ShortName>,
}

/// Limits a grant applies on top of its capabilities.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrantConstraints {
    /// When set, the turn's purpose must be one of these.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purposes: Option<Vec<Purpose>>,
}

/// A grant from the trusted source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Grant {
    pub id: Identifier,
    /// Who may use it: must equal `context.actor`.
    pub subject: Address,
    /// Who issued it: must equal `context.authority`.
    pub issuer: Address,
    /// The tenant namespace: must equal `context.namespaceId`.
    pub namespace_id: Identifier,
    pub capabilities: Vec<Capability>,
    /// Uses allowed in total, counted by the [`UsageStore`] on execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revoked: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<GrantConstraints>,
    /// The grant this one was delegated from. The chain is checked at each
    /// operation: every ancestor must be live, its subject must be the
    /// child's issuer, and the child must claim nothing beyond it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_grant_id: Option<Identifier>,
}

/// How deep a delegation chain may go.
pub const MAX_DELEGATION_DEPTH: usize = 8;

/// What an operation needs, fully resolved: one action on one resource of
/// one owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    pub namespace: String,
    pub path: Vec<String>,
    pub owner: Address,
    pub action: String,
}

impl Capability {
    /// Whether this capability alone covers the requirement's resource and
    /// action.
    pub fn covers(&self, req: &Requirement) -> bool {
        self.covers_resource(req) && self.allows_action(&req.action)
    }

    pub fn allows_action(&self, action: &str) -> bool {
        self.actions
            .iter()
            .any(|a| a.as_str() == "*" || a.as_str() == action)
    }

    fn owner_ok(&self, owner: &Address) -> bool {
        self.owner.as_ref().is_none_or(|o| o == owner)
    }

    pub fn covers_resource(&self, req: &Requirement) -> bool {
        if self.namespace.as_str() != req.namespace || !self.owner_ok(&req.owner) {
            return false;
        }
        let mine = &self.path;
        match self.scope {
            Scope::Exact => mine.len() == req.path.len() && is_prefix(mine, &req.path),
            Scope::Descendants => mine.len() <= req.path.len() && is_prefix(mine, &req.path),
        }
    }

    /// Whether this capability (a delegated child's) claims nothing beyond
    /// `parent`: same namespace and owner, a path inside the parent's
    /// scope, and only actions the parent allows.
    pub fn within(&self, parent: &Capability) -> bool {
        if self.namespace != parent.namespace
            || (parent.owner.is_some() && self.owner != parent.owner)
        {
            return false;
        }
        let path_ok = match (parent.scope, self.scope) {
            (Scope::Descendants, _) => {
                parent.path.len() <= self.path.len()
                    && parent.path.iter().zip(&self.path).all(|(a, b)| a == b)
            }
            (Scope::Exact, Scope::Exact) => parent.path == self.path,
            (Scope::Exact, Scope::Descendants) => false,
        };
        let parent_all = parent.actions.iter().any(|a| a.as_str() == "*");
        path_ok
            && (parent_all
                || self
                    .actions
                    .iter()
                    .all(|a| a.as_str() != "*" && parent.allows_action(a.as_str())))
    }

    /// Non-consuming discovery: whether this capability reaches anywhere at
    /// or below `ceiling` (a tool's declared requirement) for its action.
    pub fn reaches(&self, ceiling: &Requirement) -> bool {
        if self.namespace.as_str() != ceiling.namespace
            || !self.owner_ok(&ceiling.owner)
            || !self.allows_action(&ceiling.action)
        {
            return false;
        }
        let mine = &self.path;
        // Either the capability sits inside the ceiling's subtree, or it
        // covers the ceiling itself from above.
        (mine.len() >= ceiling.path.len()
            && ceiling.path.iter().zip(mine).all(|(c, m)| c == m.as_str()))
            || self.covers_resource(ceiling)
    }
}

/// Equal text, the same place first: a turn's grants share the text of
/// its context's tenant, subject and issuer (the kernel's `open_turn`), so
/// the identity checks of every call compare without reading it.
fn same_text(a: &str, b: &str) -> bool {
    std::ptr::eq(a, b) || a == b
}

/// `a == b`, with [`same_text`] for the id.
fn same_address(a: &Address, b: &Address) -> bool {
    match (a, b) {
        (Address::Human { user_id: x }, Address::Human { user_id: y })
        | (Address::Agent { agent_id: x }, Address::Agent { agent_id: y })
        | (Address::Group { conversation_id: x }, Address::Group { conversation_id: y })
        | (Address::Service { service_id: x }, Address::Service { service_id: y }) => {
            same_text(x.as_str(), y.as_str())
        }
        _ => a == b,
    }
}

fn is_prefix(prefix: &[PathSegment], path: &[String]) -> bool {
    prefix.iter().zip(path).all(|(p, s)| p.as_str() == s)
}

/// Why no grant allowed an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    NoMatchingGrant,
    GrantExhausted,
    UsageStoreUnavailable,
    AuthorityUnavailable,
    InvalidRequest,
    HostPolicyDenied,
    DelegationChainInvalid,
    DelegationChainUnverified,
}

impl DenyReason {
    pub fn code(self) -> &'static str {
        match self {
            DenyReason::NoMatchingGrant => "no_matching_grant",
            DenyReason::GrantExhausted => "grant_exhausted",
            DenyReason::UsageStoreUnavailable => "usage_store_unavailable",
            DenyReason::AuthorityUnavailable => "authority_unavailable",
            DenyReason::InvalidRequest => "invalid_request",
            DenyReason::HostPolicyDenied => "host_policy_denied",
            DenyReason::DelegationChainInvalid => "delegation_chain_invalid",
            DenyReason::DelegationChainUnverified => "delegation_chain_unverified",
        }
    }
    /// Infrastructure reasons are recorded `failClosed`.
    pub fn fail_closed(self) -> bool {
        matches!(
            self,
            DenyReason::UsageStoreUnavailable
                | DenyReason::AuthorityUnavailable
                | DenyReason::DelegationChainUnverified
        )
    }
}

impl Grant {
    /// The per-operation conditions: subject, issuer, tenant, revocation,
    /// time window at `now`, purpose.
    pub fn applies(&self, context: &AccessContext) -> bool {
        same_text(self.namespace_id.as_str(), context.namespace_id.as_str())
            && same_address(&self.subject, &context.actor)
            && same_address(&self.issuer, &context.authority)
            && self.live(context)
    }

    /// Not revoked, inside its time window at `context.now`, and allowing
    /// the context's purpose. Checked for the grant and every ancestor.
    pub fn live(&self, context: &AccessContext) -> bool {
        if self.revoked {
            return false;
        }
        if self.not_before.is_some() || self.expires_at.is_some() {
            // Parsed only for a bounded grant: most grants have no window.
            let now = context.now.to_offset();
            let early = self
                .not_before
                .as_ref()
                .is_some_and(|t| now < t.to_offset());
            let late = self
                .expires_at
                .as_ref()
                .is_some_and(|t| now > t.to_offset());
            if early || late {
                return false;
            }
        }
        if let Some(purposes) = self.constraints.as_ref().and_then(|c| c.purposes.as_ref())
            && !purposes.iter().any(|p| p == &context.purpose)
        {
            return false;
        }
        true
    }

    /// Checks the delegation chain above this grant against `all` (the
    /// turn's loaded grants) at `context.now`.
    pub fn check_chain(&self, all: &[Grant], context: &AccessContext) -> Result<(), DenyReason> {
        let mut child = self;
        for _ in 0..MAX_DELEGATION_DEPTH {
            let Some(parent_id) = &child.parent_grant_id else {
                return Ok(());
            };
            // A parent the source did not hand over cannot be verified.
            let parent = all
                .iter()
                .find(|g| &g.id == parent_id)
                .ok_or(DenyReason::DelegationChainUnverified)?;
            let sound = parent.live(context)
                && parent.namespace_id == child.namespace_id
                && parent.subject == child.issuer
                && child
                    .capabilities
                    .iter()
                    .all(|c| parent.capabilities.iter().any(|p| c.within(p)));
            if !sound {
                return Err(DenyReason::DelegationChainInvalid);
            }
            child = parent;
        }
        Err(DenyReason::DelegationChainInvalid)
    }

    /// The first capability of this grant that alone covers `req`.
    pub fn covering_capability(&self, req: &Requirement) -> Option<&Capability> {
        self.capabilities.iter().find(|c| c.covers(req))
    }
}

/// Grants that apply now and have one capability covering `req`, unbounded
/// grants first (they need no counter), then in source order.
pub fn covering_grants<'a>(
    grants: &'a [Grant],
    context: &AccessContext,
    req: &Requirement,
) -> Vec<&'a Grant> {
    in_covering_order(grants, context, req).collect()
}

/// [`covering_grants`], one at a time, without a vector per decision:
/// the unbounded ones in source order, then the bounded ones.
fn in_covering_order<'g>(
    grants: &'g [Grant],
    context: &AccessContext,
    req: &Requirement,
) -> impl Iterator<Item = &'g Grant> {
    let covering = move |bounded: bool| {
        grants.iter().filter(move |g| {
            g.max_uses.is_some() == bounded
                && g.applies(context)
                && g.covering_capability(req).is_some()
        })
    };
    covering(false).chain(covering(true))
}

/// The trusted source of grants. Loaded once per turn.
#[async_trait]
pub trait GrantSource: Send + Sync {
    /// Every grant that may concern `context` (the kernel filters again).
    async fn load(&self, context: &AccessContext) -> Result<Vec<Grant>, String>;
}

/// The embedded grant source: the host's configuration, held in memory.
/// `revoke` and `replace` change what the **next** turn loads.
#[derive(Debug, Default)]
pub struct ConfigGrantSource {
    grants: Mutex<Vec<Grant>>,
}

impl ConfigGrantSource {
    pub fn new(grants: Vec<Grant>) -> Self {
        Self {
            grants: Mutex::new(grants),
        }
    }
    /// Marks the grant revoked; returns whether it existed.
    pub fn revoke(&self, id: &str) -> bool {
        let mut found = false;
        if let Ok(mut g) = self.grants.lock() {
            for grant in g.iter_mut().filter(|g| g.id.as_str() == id) {
                grant.revoked = true;
                found = true;
            }
        }
        found
    }
    pub fn replace(&self, grants: Vec<Grant>) {
        if let Ok(mut g) = self.grants.lock() {
            *g = grants;
        }
    }
}

#[async_trait]
impl GrantSource for ConfigGrantSource {
    async fn load(&self, context: &AccessContext) -> Result<Vec<Grant>, String> {
        let g = self
            .grants
            .lock()
            .map_err(|_| "grant store lock poisoned".to_owned())?;
        let mut out: Vec<Grant> = g
            .iter()
            .filter(|g| g.namespace_id == context.namespace_id && g.subject == context.actor)
            .cloned()
            .collect();
        // Hand over the delegation chains too, so the kernel can check them.
        let mut i = 0;
        while i < out.len() {
            if let Some(pid) = out[i].parent_grant_id.clone()
                && !out.iter().any(|x| x.id == pid)
                && let Some(parent) = g.iter().find(|x| x.id == pid)
            {
                out.push(parent.clone());
            }
            i += 1;
        }
        Ok(out)
    }
}

/// The outcome of an authorization. The grant is named by its own id
/// (shared, not copied: a decision is made for every call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allowed {
        grant_id: Identifier,
        consumed: bool,
    },
    Denied {
        reason: DenyReason,
        grant_id: Option<Identifier>,
    },
}

/// Decides `req` against `grants`. With `consume`, takes a use of the
/// chosen bounded grant; without, only checks that one is left.
pub async fn authorize(
    grants: &[Grant],
    usage: &dyn UsageStore,
    context: &AccessContext,
    req: &Requirement,
    consume: bool,
) -> Decision {
    // In covering order, skipping a grant whose delegation chain fails:
    // the grants asked of the usage store, and in what order, are those of
    // the covering grants with sound chains.
    let mut chain_failure = None;
    let mut any_sound = false;
    let mut store_failed = None;
    let mut exhausted = None;
    for g in in_covering_order(grants, context, req) {
        if let Err(reason) = g.check_chain(grants, context) {
            if chain_failure.is_none() {
                chain_failure = Some((reason, g.id.clone()));
            }
            continue;
        }
        any_sound = true;
        let Some(max) = g.max_uses else {
            return Decision::Allowed {
                grant_id: g.id.clone(),
                consumed: false,
            };
        };
        let answer = if consume {
            usage.try_consume(g.id.as_str(), max).await
        } else {
            usage.remaining(g.id.as_str(), max).await.map(|n| n > 0)
        };
        match answer {
            Ok(true) => {
                return Decision::Allowed {
                    grant_id: g.id.clone(),
                    consumed: consume,
                };
            }
            Ok(false) => exhausted = exhausted.or_else(|| Some(g.id.clone())),
            Err(_) => store_failed = store_failed.or_else(|| Some(g.id.clone())),
        }
    }
    // No covering grant with a sound chain: the first chain's failure, or
    // no grant at all.
    if !any_sound {
        return match chain_failure {
            Some((reason, id)) => Decision::Denied {
                reason,
                grant_id: Some(id),
            },
            None => Decision::Denied {
                reason: DenyReason::NoMatchingGrant,
                grant_id: None,
            },
        };
    }
    // A store that could not answer is reported before exhaustion: the
    // grant might have had a use left, and the refusal fails closed.
    if let Some(id) = store_failed {
        return Decision::Denied {
            reason: DenyReason::UsageStoreUnavailable,
            grant_id: Some(id),
        };
    }
    Decision::Denied {
        reason: DenyReason::GrantExhausted,
        grant_id: exhausted,
    }
}

/// Non-consuming discovery of a tool's ceiling: some applicable capability
/// reaches into it, and its grant is not known to be exhausted. A usage
/// store that cannot answer does not hide a tool; the exact authorization
/// refuses it fail-closed instead.
pub async fn discover(
    grants: &[Grant],
    usage: &dyn UsageStore,
    context: &AccessContext,
    ceiling: &Requirement,
) -> Result<(), DenyReason> {
    let mut exhausted = false;
    let mut chain_failure = None;
    for g in grants.iter().filter(|g| g.applies(context)) {
        if !g.capabilities.iter().any(|c| c.reaches(ceiling)) {
            continue;
        }
        if let Err(reason) = g.check_chain(grants, context) {
            chain_failure = chain_failure.or(Some(reason));
            continue;
        }
        match g.max_uses {
            None => return Ok(()),
            Some(max) => match usage.remaining(g.id.as_str(), max).await {
                Ok(0) => exhausted = true,
                Ok(_) | Err(_) => return Ok(()),
            },
        }
    }
    Err(if exhausted {
        DenyReason::GrantExhausted
    } else {
        chain_failure.unwrap_or(DenyReason::NoMatchingGrant)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sharedos_protocol::ident;

    fn seg(p: &[&str]) -> Vec<PathSegment> {
        p.iter().filter_map(|s| PathSegment::new(s).ok()).collect()
    }

    fn cap(path: &[&str], scope: Scope, actions: &[&str]) -> Capability {
        Capability {
            namespace: ident("files"),
            path: seg(path),
            owner: None,
            scope,
            actions: actions
                .iter()
                .filter_map(|a| ShortName::new(a).ok())
                .collect(),
        }
    }

    fn req(path: &[&str], action: &str) -> Requirement {
        Requirement {
            namespace: "files".into(),
            path: path.iter().map(|s| s.to_string()).collect(),
            owner: Address::Human {
                user_id: ident("u"),
            },
            action: action.into(),
        }
    }

    #[test]
    fn segments_not_prefixes() {
        let c = cap(&["cell-3"], Scope::Descendants, &["read"]);
        assert!(c.covers(&req(&["cell-3"], "read")));
        assert!(c.covers(&req(&["cell-3", "x"], "read")));
        assert!(!c.covers(&req(&["cell-30"], "read")));
        assert!(!c.covers(&req(&["cell-3"], "write")));
        let e = cap(&["cell-3"], Scope::Exact, &["*"]);
        assert!(e.covers(&req(&["cell-3"], "anything")));
        assert!(!e.covers(&req(&["cell-3", "x"], "read")));
        assert!(!e.covers(&req(&[], "read")));
    }

    #[test]
    fn reach_into_ceiling() {
        let c = cap(&["alice", "notes"], Scope::Exact, &["read"]);
        assert!(c.reaches(&req(&[], "read")));
        assert!(c.reaches(&req(&["alice"], "read")));
        assert!(!c.reaches(&req(&["bob"], "read")));
        assert!(!c.reaches(&req(&[], "write")));
    }
}
