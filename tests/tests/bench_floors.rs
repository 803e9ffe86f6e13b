//! `sharedos-bench --only calls` and `--only whole-turn` as real
//! processes, tiny: every placement is measured (the peer really on cpu 1
//! when the two ends are split), the batched raw pair and the envelope in
//! each, and a whole `sharedos run` against the binary alone and bwrap,
//! with its stages. No figure is judged, only that each is there.

use std::process::Command;

use sharedos_tests::turns::workspace_bin;

fn bench(args: &[&str]) -> String {
    let out = Command::new(workspace_bin("sharedos-bench"))
        .args(args)
        .env_remove("SHAREDOS_BENCH_RMCP_ECHO")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);
    stdout
}

#[test]
fn calls_are_measured_in_every_placement_with_the_batched_floor() {
    let stdout = bench(&["--only", "calls", "--iterations", "20"]);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let placements = [
        "== Tool calls, unpinned",
        "== Tool calls, both ends on one vCPU (cpu 0)",
        "== Tool calls, different vCPUs (client/host cpu 0, peer cpu 1)",
    ];
    for (i, p) in placements.iter().enumerate() {
        let start = stdout
            .find(p)
            .unwrap_or_else(|| panic!("no {p:?} in {stdout}"));
        let section = &stdout[start..];
        let section = placements
            .get(i + 1)
            .and_then(|next| section.find(next))
            .map_or(section, |end| &section[..end]);
        if i == 2 && cpus < 2 {
            assert!(section.contains("no cpu 1"), "{section}");
            continue;
        }
        for row in [
            "(a) raw NDJSON round trip",
            "(c) tool call through the envelope",
            "round 1: envelope",
            "raw pair batched (one write a batch)",
            "envelope / raw pair:",
        ] {
            assert!(section.contains(row), "no {row:?} in {section}");
        }
    }
    assert!(stdout.contains("(rmcp not measured"), "{stdout}");
}

#[test]
fn a_split_placement_starts_the_peer_on_cpu_1() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return;
    }
    // In a process of its own: the placement moves every thread of the
    // process that applies it.
    let out = Command::new("sh")
        .args(["-c", "grep Cpus_allowed_list /proc/self/status"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let (program, args) = {
        sharedos_bench::placement::apply(sharedos_bench::placement::Placement::Split).unwrap();
        let placed = sharedos_bench::placement::peer(
            std::path::Path::new("/bin/sh"),
            &["-c", "grep Cpus_allowed_list /proc/self/status"],
        );
        sharedos_bench::placement::apply(sharedos_bench::placement::Placement::Unpinned).unwrap();
        placed
    };
    let out = Command::new(program).args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.trim_end().ends_with("\t1"), "{text}");
}

#[test]
fn a_whole_turn_is_measured_against_the_binary_alone_with_its_stages() {
    // `sharedos` and the testplugin are next to the bench binary.
    workspace_bin("sharedos");
    workspace_bin("sharedos-testplugin");
    let stdout = bench(&["--only", "whole-turn", "--iterations", "20"]);
    for row in [
        "the plugin binary alone (raw client)",
        "sharedos run, direct",
        "sharedos run, full sandbox",
        "direct / binary alone:",
        "sharedos run, direct, stage medians (µs): start",
        "sharedos run, sandboxed, stage medians (µs): start",
    ] {
        assert!(stdout.contains(row), "no {row:?} in {stdout}");
    }
    for stage in ["launched", "initialized", "settled", "executed", "exit"] {
        assert!(
            stdout.contains(&format!(", {stage} ")),
            "no {stage} in {stdout}"
        );
    }
    if sharedos_bench::process::find_bwrap().is_some() {
        assert!(
            stdout.contains("bwrap launching the same binary"),
            "{stdout}"
        );
        assert!(stdout.contains("sandboxed / bwrap:"), "{stdout}");
    } else {
        assert!(stdout.contains("bwrap is not installed"), "{stdout}");
    }
}
