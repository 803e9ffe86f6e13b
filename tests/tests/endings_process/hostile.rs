//! Hostile plugins the deadline stops: ignoring the abort, spinning,
//! sleeping, forking, escaping into a new session.

use super::*;

// ------------------------------------- hostile plugins stopped by the deadline

/// Ignores `turn/abort` and stdin EOF, keeps reading.
async fn ignores_abort(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([{"op": "ignore_abort"}, {"op": "emit_pid"}, {"op": "hold"}]),
    )
    .await;
    assert!(
        !run.seen_pids.is_empty(),
        "the plugin was never seen running"
    );
    run.assert_no_survivor();
}

/// Busy-loops forever.
async fn spins(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([{"op": "ignore_abort"}, {"op": "emit_pid"}, {"op": "spin"}]),
    )
    .await;
    run.assert_no_survivor();
}

/// Sleeps far past the deadline.
async fn sleeps(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([{"op": "emit_pid"}, {"op": "sleep", "ms": 120000}]),
    )
    .await;
    run.assert_no_survivor();
}

/// Emits and annotations keep arriving when the deadline fires: nothing
/// lands after `turn.cancelled`, and what landed before stays.
async fn emits_racing_the_deadline(launch: Launch) {
    let mut script = vec![json!({"op": "emit_pid"})];
    for i in 0..400 {
        script.push(json!({"op": "emit", "type": "tick", "data": i}));
        script.push(annotate("last_tick", json!(i)));
        script.push(json!({"op": "sleep", "ms": 10}));
    }
    let run = deadline_stops(launch, json!(script)).await;
    let ticks = run.runtime_events("tick");
    assert!(!ticks.is_empty(), "no tick before the deadline");
    assert_eq!(
        ticks,
        (0..ticks.len()).map(|i| json!(i)).collect::<Vec<_>>()
    );
    // The last annotation is the last tick's or the one before it (an
    // annotate follows its emit on the wire).
    let last = run
        .result
        .metadata
        .get("last_tick")
        .and_then(Value::as_u64)
        .unwrap();
    assert!(
        last as usize + 1 == ticks.len() || last as usize + 2 == ticks.len(),
        "last_tick {last} with {} ticks",
        ticks.len()
    );
    run.assert_no_survivor();
}

/// Forks children that keep the pipes open (same process group).
async fn forked_children(launch: Launch) {
    let run = deadline_stops(
        launch,
        json!([{"op": "fork", "n": 3}, {"op": "emit_pid"}, {"op": "ignore_abort"}, {"op": "hold"}]),
    )
    .await;
    if launch == Launch::Direct {
        // Host pids, checked one by one by assert_no_survivor.
        assert_eq!(run.reported_pids.len(), 4, "{:?}", run.reported_pids);
    }
    assert!(
        run.seen_pids.len() >= 4,
        "expected the plugin and 3 children, saw {:?} (reported {:?})",
        run.seen_pids,
        run.reported_pids
    );
    run.assert_no_survivor();
}

/// `setsid` children and double-forked (orphaned, reparented) grandchildren:
/// the sandbox's pid namespace takes them all down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setsid_and_double_fork_children_sandbox() {
    let run = deadline_stops(
        Launch::Sandbox,
        json!([
            {"op": "fork", "n": 2, "setsid": true},
            {"op": "fork", "n": 2, "double": true},
            {"op": "fork", "n": 1, "setsid": true, "double": true},
            {"op": "sleep", "ms": 200},
            {"op": "emit_pid"},
            {"op": "ignore_abort"},
            {"op": "hold"}
        ]),
    )
    .await;
    // The plugin, 2 + 1 setsid sleepers, 2 + 1 double-forked grandchildren.
    assert!(
        run.seen_pids.len() >= 6,
        "expected the plugin and 6 descendants, saw {:?}",
        run.seen_pids
    );
    run.assert_no_survivor();
}

/// The direct launcher contains its tree in a cgroup: the turn ends by its
/// deadline and the plugin, its same-group children and a `setsid` child
/// all die.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setsid_children_direct_end_by_deadline_and_die_with_the_tree() {
    let run = deadline_stops(
        Launch::Direct,
        json!([
            {"op": "fork", "n": 1},
            {"op": "fork", "n": 1, "setsid": true},
            {"op": "emit_pid"},
            {"op": "ignore_abort"},
            {"op": "hold"}
        ]),
    )
    .await;
    // forked [same-group], forked [setsid], pid [plugin].
    let [same_group, escaped, plugin] = run.reported_pids.as_slice() else {
        panic!("reported pids: {:?}", run.reported_pids);
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let alive = sharedos_tests::turns::is_alive;
    while (alive(*plugin) || alive(*same_group) || alive(*escaped))
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        !sharedos_tests::turns::is_alive(*plugin),
        "the plugin survived"
    );
    assert!(
        !sharedos_tests::turns::is_alive(*same_group),
        "a same-group child survived"
    );
    let escaped_alive = alive(*escaped);
    kill_marked(&run.marker);
    assert!(!escaped_alive, "the setsid child survived the turn");
    assert!(wait_gone(&run.marker, Duration::from_secs(10)).is_empty());
}

both!(
    ignores_abort,
    emits_racing_the_deadline,
    spins,
    sleeps,
    forked_children,
);
