//! `authorize` walks the covering grants one at a time, checking each
//! delegation chain as it reaches it. These prove it decides exactly as
//! the reference order does (every covering grant's chain checked first,
//! then the sound ones asked of the usage store in covering order): the
//! same decision and the same questions to the usage store, in the same
//! order, over generated grants with unbounded and bounded uses, broken
//! and missing parents, revoked grants, other subjects and a store that
//! fails for some grants.

mod common;

use std::collections::HashMap;
use std::sync::Mutex;

use async_trait::async_trait;
use common::*;
use proptest::prelude::*;
use sharedos_kernel::grant::{Decision, DenyReason, Requirement, authorize, covering_grants};
use sharedos_kernel::{Grant, Scope, UsageStore};
use sharedos_protocol::{AccessContext, Address, ident};

/// A usage store answering from a script per grant (uses left, or a
/// failure), logging every question.
#[derive(Default)]
struct ScriptedUsage {
    left: Mutex<HashMap<String, Option<u64>>>,
    asked: Mutex<Vec<(String, bool)>>,
}

#[async_trait]
impl UsageStore for ScriptedUsage {
    async fn try_consume(&self, grant_id: &str, _max: u64) -> Result<bool, String> {
        self.asked.lock().unwrap().push((grant_id.to_owned(), true));
        let mut left = self.left.lock().unwrap();
        match left.get_mut(grant_id) {
            Some(Some(0)) => Ok(false),
            Some(Some(n)) => {
                *n -= 1;
                Ok(true)
            }
            Some(None) => Err("store down".into()),
            None => Ok(false),
        }
    }
    async fn remaining(&self, grant_id: &str, _max: u64) -> Result<u64, String> {
        self.asked
            .lock()
            .unwrap()
            .push((grant_id.to_owned(), false));
        match self.left.lock().unwrap().get(grant_id) {
            Some(Some(n)) => Ok(*n),
            Some(None) => Err("store down".into()),
            None => Ok(0),
        }
    }
}

/// The order `authorize` kept before it walked the grants lazily.
async fn reference(
    grants: &[Grant],
    usage: &dyn UsageStore,
    context: &AccessContext,
    req: &Requirement,
    consume: bool,
) -> Decision {
    let mut chain_failure = None;
    // Covering grants, unbounded first, each kind in source order.
    let mut covering: Vec<&Grant> = grants
        .iter()
        .filter(|g| g.applies(context) && g.covering_capability(req).is_some())
        .collect();
    covering.sort_by_key(|g| g.max_uses.is_some());
    assert_eq!(covering, covering_grants(grants, context, req));
    covering.retain(|g| match g.check_chain(grants, context) {
        Ok(()) => true,
        Err(reason) => {
            if chain_failure.is_none() {
                chain_failure = Some((reason, g.id.clone()));
            }
            false
        }
    });
    if let (true, Some((reason, id))) = (covering.is_empty(), chain_failure) {
        return Decision::Denied {
            reason,
            grant_id: Some(id),
        };
    }
    if covering.is_empty() {
        return Decision::Denied {
            reason: DenyReason::NoMatchingGrant,
            grant_id: None,
        };
    }
    let (mut store_failed, mut exhausted) = (None, None);
    for g in covering {
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
            Ok(false) => exhausted = exhausted.or(Some(g.id.clone())),
            Err(_) => store_failed = store_failed.or(Some(g.id.clone())),
        }
    }
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

/// One generated grant: subject, issuer, path, uses, parent, revoked,
/// and what the store says of it.
type Spec = (
    (bool, u8, bool),
    (Option<u64>, Option<usize>, bool),
    Option<Option<u64>>,
);

fn spec() -> impl Strategy<Value = Spec> {
    (
        (any::<bool>(), 0..3u8, any::<bool>()),
        (
            prop::option::of(0..3u64),
            prop::option::of(0..6usize),
            prop::bool::weighted(0.15),
        ),
        prop::option::of(prop::option::of(0..3u64)),
    )
}

fn build(specs: &[Spec]) -> (Vec<Grant>, ScriptedUsage) {
    let usage = ScriptedUsage::default();
    let grants = specs
        .iter()
        .enumerate()
        .map(
            |(i, ((bob, issuer, deep), (max, parent, revoked), store))| {
                let path: &[&str] = if *deep { &["a", "b"] } else { &["a"] };
                let subject = if *bob { "bob" } else { "alice" };
                let mut g = grant(
                    &format!("g{i}"),
                    subject,
                    vec![cap("records", path, Scope::Descendants, &["read", "*"])],
                );
                g.issuer = match issuer {
                    0 => host(),
                    1 => agent("alice"),
                    _ => Address::Agent {
                        agent_id: ident("bob"),
                    },
                };
                g.max_uses = *max;
                g.parent_grant_id = parent.map(|p| ident(&format!("g{p}")));
                g.revoked = *revoked;
                if let Some(store) = store {
                    usage.left.lock().unwrap().insert(format!("g{i}"), *store);
                }
                g
            },
        )
        .collect();
    (grants, usage)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn authorize_decides_and_asks_the_store_as_the_reference_order_does(
        specs in prop::collection::vec(spec(), 0..6),
        deep in any::<bool>(),
        action in prop::sample::select(vec!["read", "write"]),
        consume in any::<bool>(),
    ) {
        let path: Vec<String> = if deep { vec!["a".into(), "b".into(), "c".into()] } else { vec!["a".into()] };
        let req = Requirement {
            namespace: "records".into(),
            path,
            owner: owner(),
            action: action.into(),
        };
        let ctx = context("alice");
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (grants, ours_usage) = build(&specs);
        let (_, theirs_usage) = build(&specs);
        let ours = rt.block_on(authorize(&grants, &ours_usage, &ctx, &req, consume));
        let theirs = rt.block_on(reference(&grants, &theirs_usage, &ctx, &req, consume));
        prop_assert_eq!(&ours, &theirs);
        prop_assert_eq!(
            ours_usage.asked.into_inner().unwrap(),
            theirs_usage.asked.into_inner().unwrap()
        );
    }
}
