//! G 94, randomized: every allow is covered by one capability of one grant;
//! splitting resource and action across two grants never allows; revoking a
//! root denies every descendant at any depth.

mod common;

use common::*;
use proptest::prelude::*;
use sharedos_kernel::grant::{Decision, Requirement, authorize};
use sharedos_kernel::{Capability, Grant, MemoryUsageStore, Scope};

const SEGMENTS: [&str; 5] = ["a", "b", "cell-3", "cell-30", "x"];
const ACTIONS: [&str; 4] = ["read", "write", "delete", "*"];

fn path() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(
        prop::sample::select(SEGMENTS.to_vec()).prop_map(str::to_owned),
        0..4,
    )
}

fn capability() -> impl Strategy<Value = Capability> {
    (
        path(),
        any::<bool>(),
        prop::collection::vec(prop::sample::select(ACTIONS.to_vec()), 1..3),
    )
        .prop_map(|(p, descendants, actions)| {
            let p: Vec<&str> = p.iter().map(String::as_str).collect();
            cap(
                "records",
                &p,
                if descendants {
                    Scope::Descendants
                } else {
                    Scope::Exact
                },
                &actions,
            )
        })
}

fn grants() -> impl Strategy<Value = Vec<Grant>> {
    prop::collection::vec(
        (prop::collection::vec(capability(), 1..3), any::<bool>()),
        0..4,
    )
    .prop_map(|gs| {
        gs.into_iter()
            .enumerate()
            .map(|(i, (caps, revoked))| {
                let mut g = grant(&format!("g{i}"), "alice", caps);
                g.revoked = revoked;
                g
            })
            .collect()
    })
}

fn req(path: &[String], action: &str) -> Requirement {
    Requirement {
        namespace: "records".into(),
        path: path.to_vec(),
        owner: owner(),
        action: action.into(),
    }
}

fn decide(grants: &[Grant], r: &Requirement) -> Decision {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(authorize(
        grants,
        &MemoryUsageStore::new(),
        &context("alice"),
        r,
        true,
    ))
}

/// An independent statement of "covers", by whole segments.
fn covers(c: &Capability, r: &Requirement) -> bool {
    let mine: Vec<&str> = c.path.iter().map(|s| s.as_str()).collect();
    let theirs: Vec<&str> = r.path.iter().map(String::as_str).collect();
    let path_ok = match c.scope {
        Scope::Exact => mine == theirs,
        Scope::Descendants => theirs.len() >= mine.len() && theirs[..mine.len()] == mine[..],
    };
    path_ok
        && c.actions
            .iter()
            .any(|a| a.as_str() == "*" || a.as_str() == r.action)
}

proptest! {
    #[test]
    fn every_allow_is_covered_by_one_capability_of_one_grant(
        grants in grants(), p in path(), action in prop::sample::select(vec!["read", "write", "delete"])
    ) {
        let r = req(&p, action);
        let decision = decide(&grants, &r);
        let witness = grants.iter().any(|g| !g.revoked && g.capabilities.iter().any(|c| covers(c, &r)));
        match decision {
            Decision::Allowed { grant_id, .. } => {
                let g = grants.iter().find(|g| g.id == grant_id).unwrap();
                prop_assert!(!g.revoked);
                prop_assert!(g.capabilities.iter().any(|c| covers(c, &r)));
            }
            Decision::Denied { .. } => prop_assert!(!witness, "a covering grant existed but was refused"),
        }
    }

    #[test]
    fn splitting_resource_and_action_across_grants_never_allows(
        p in path(), other in prop::sample::select(SEGMENTS.to_vec()), descendants in any::<bool>()
    ) {
        let scope = if descendants { Scope::Descendants } else { Scope::Exact };
        let ps: Vec<&str> = p.iter().map(String::as_str).collect();
        // Grant A covers the resource with another action; grant B has the
        // action on a resource that is not it (a sibling subtree).
        let sibling: Vec<&str> = if ps.first() == Some(&other) { vec!["elsewhere"] } else { vec![other] };
        let a = grant("a", "alice", vec![cap("records", &ps, scope, &["write"])]);
        let b = grant("b", "alice", vec![cap("records", &sibling, Scope::Exact, &["read"])]);
        // And one grant whose two capabilities split the same way.
        let c = grant("c", "alice", vec![
            cap("records", &ps, scope, &["write"]),
            cap("records", &sibling, Scope::Exact, &["read"]),
        ]);
        let r = req(&p, "read");
        prop_assert!(matches!(decide(&[a, b], &r), Decision::Denied { .. }), "split across grants allowed");
        prop_assert!(matches!(decide(&[c], &r), Decision::Denied { .. }), "split across capabilities allowed");
    }

    #[test]
    fn revoking_a_root_denies_every_descendant(root in path(), below in path(), action in prop::sample::select(vec!["read", "write"])) {
        let rs: Vec<&str> = root.iter().map(String::as_str).collect();
        let mut g = grant("root", "alice", vec![cap("records", &rs, Scope::Descendants, &["*"])]);
        let mut full = root.clone();
        full.extend(below);
        let r = req(&full, action);
        prop_assert!(matches!(decide(std::slice::from_ref(&g), &r), Decision::Allowed { .. }), "root grant refused");
        g.revoked = true;
        prop_assert!(matches!(decide(&[g], &r), Decision::Denied { .. }), "revoked root allowed");
    }

    #[test]
    fn revoking_any_ancestor_of_a_delegation_chain_denies_at_any_depth(
        depth in 1usize..6, revoke_at in 0usize..6, below in path()
    ) {
        // g0 (root, issued by the host to p0) -> g1 (issued by p0 to p1) -> ... -> alice.
        let principal = |i: usize| sharedos_protocol::Address::Human { user_id: sharedos_protocol::ident(&format!("p{i}")) };
        let mut chain = Vec::new();
        for i in 0..depth {
            let mut g = grant(&format!("g{i}"), "alice", vec![cap("records", &["root"], Scope::Descendants, &["*"])]);
            g.issuer = if i == 0 { host() } else { principal(i - 1) };
            g.subject = if i + 1 == depth { agent("alice") } else { principal(i) };
            g.parent_grant_id = (i > 0).then(|| sharedos_protocol::ident(&format!("g{}", i - 1)));
            chain.push(g);
        }
        let mut ctx = context("alice");
        ctx.authority = if depth == 1 { host() } else { principal(depth - 2) };
        let mut full = vec!["root".to_owned()];
        full.extend(below);
        let r = req(&full, "read");
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let run = |grants: &[Grant]| rt.block_on(authorize(grants, &MemoryUsageStore::new(), &ctx, &r, true));
        prop_assert!(matches!(run(&chain), Decision::Allowed { .. }), "intact chain refused");
        let at = revoke_at % depth;
        chain[at].revoked = true;
        prop_assert!(matches!(run(&chain), Decision::Denied { .. }), "revoked ancestor allowed");
    }
}
