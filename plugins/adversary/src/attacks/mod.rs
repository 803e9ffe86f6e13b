//! The catalogue: every attack of sandbox.md section C, one function each.
//!
//! The default sequence runs the attacks that return on their own. The
//! ones that hang, kill the process, abuse stdio or exhaust a resource are
//! `selectable_only`: a test runs them one per turn (`--only C42`).

pub mod counters;
pub mod devices;
pub mod filesystem;
pub mod ipc;
pub mod kernel;
pub mod leaks;
pub mod lifetime;
pub mod memory;
pub mod memory_kinds;
pub mod network;
pub mod processes;
pub mod resources;
pub mod stdio;
pub mod syscalls;

use crate::bait::Bait;
use crate::receipt::Receipt;

/// One attack of the catalogue.
#[derive(Clone, Copy)]
pub struct Attack {
    /// The sandbox.md C id (`C07`), with a letter for variants (`C44a`).
    pub id: &'static str,
    pub name: &'static str,
    /// The attempt. It returns once, with its receipt.
    pub run: fn(&Bait) -> Receipt,
    /// What follows the receipt when the attack itself is to hang, crash
    /// or abuse stdio: run only after the receipt is out.
    pub then: Option<fn(&Bait)>,
    /// Left out of the default sequence; run only when selected.
    pub selectable_only: bool,
    /// The bait fields it uses.
    pub bait: &'static str,
}

impl Attack {
    /// `C07-hard-link-host-file`: what receipts carry in `attack`.
    pub fn label(&self) -> String {
        format!("{}-{}", self.id, self.name)
    }
    /// Runs the attempt; the receipt's label is the catalogue's.
    pub fn attempt(&self, bait: &Bait) -> Receipt {
        Receipt {
            attack: self.label(),
            ..(self.run)(bait)
        }
    }
    /// Matches `C42`, `c42` or the full label.
    pub fn matches(&self, selector: &str) -> bool {
        self.id.eq_ignore_ascii_case(selector) || self.label().eq_ignore_ascii_case(selector)
    }
}

fn host_side_race(_: &Bait) -> Receipt {
    Receipt::not_attempted(
        "C62",
        "host-side: the test swaps the workspace for a symlink while the helper resolves paths; by the time the plugin runs the race is over",
    )
}

const fn a(
    id: &'static str,
    name: &'static str,
    run: fn(&Bait) -> Receipt,
    bait: &'static str,
) -> Attack {
    Attack {
        id,
        name,
        run,
        then: None,
        selectable_only: false,
        bait,
    }
}

const fn sel(
    id: &'static str,
    name: &'static str,
    run: fn(&Bait) -> Receipt,
    then: Option<fn(&Bait)>,
    bait: &'static str,
) -> Attack {
    Attack {
        id,
        name,
        run,
        then,
        selectable_only: true,
        bait,
    }
}

use counters::*;
use devices::*;
use filesystem::*;
use ipc::*;
use kernel::*;
use leaks::*;
use lifetime::*;
use memory::*;
use memory_kinds::*;
use network::*;
use processes::*;
use resources::*;
use stdio::*;
use syscalls::*;

/// Every attack, in the fixed order of the default sequence. The victim is
/// killed last (C24), after the attacks that need it alive.
pub const CATALOGUE: &[Attack] = &[
    a(
        "C01",
        "read-host-secret",
        c01_read_host_secret,
        "secret_path",
    ),
    a(
        "C02",
        "read-home-credentials",
        c02_read_home_credentials,
        "real_home",
    ),
    a("C03", "read-etc-shadow", c03_read_etc_shadow, ""),
    a(
        "C04",
        "write-outside-workspace",
        c04_write_outside_workspace,
        "host_write_paths, cleanup",
    ),
    a(
        "C05",
        "write-host-tmp",
        c05_write_host_tmp,
        "host_tmp_path, cleanup",
    ),
    a(
        "C06",
        "symlink-to-host-secret",
        c06_symlink_to_secret,
        "secret_path, workspace",
    ),
    a(
        "C07",
        "hard-link-host-file",
        c07_hard_link_host_file,
        "secret_path, workspace",
    ),
    a(
        "C08",
        "replace-protected-metadata",
        c08_protected_metadata,
        "workspace (with .git), cleanup",
    ),
    a(
        "C09",
        "tcp-connect-host-loopback",
        c09_tcp_connect_host,
        "tcp_port",
    ),
    a("C10", "ipv6-socket", c10_ipv6_socket, ""),
    a("C11", "udp-to-host-port", c11_udp_to_host, "udp_port"),
    a("C12", "bind-tcp-listener", c12_bind_tcp_listener, ""),
    a(
        "C13",
        "unix-connect-host-pathname",
        c13_unix_pathname_host,
        "unix_path",
    ),
    a(
        "C14",
        "unix-connect-host-abstract",
        c14_abstract_unix_host,
        "abstract_name",
    ),
    a("C15", "netlink-route-socket", c15_netlink_route, ""),
    a("C16", "raw-and-packet-sockets", c16_raw_packet, ""),
    a("C17", "vsock-socket", c17_vsock, ""),
    a("C18", "io-uring-setup", c18_io_uring, ""),
    a(
        "C19",
        "enumerate-host-network",
        c19_enumerate_interfaces,
        "tcp_port, unix_path",
    ),
    a("C20", "ptrace-attach", c20_ptrace_attach, "victim_pid"),
    a(
        "C21",
        "process-vm-readv",
        c21_process_vm_readv,
        "host_pid or victim_pid",
    ),
    a(
        "C22",
        "proc-pid-environ-mem-fd-cmdline",
        c22_proc_pid_files,
        "host_pid or victim_pid, secret_env_names",
    ),
    a(
        "C23",
        "see-other-processes",
        c23_count_processes,
        "victim_pid",
    ),
    sel(
        "C25",
        "kill-minus-one",
        c25_kill_everything,
        None,
        "allow_kill_all",
    ),
    a(
        "C26",
        "pidfd-open-getfd-signal",
        c26_pidfd_tricks,
        "victim_pid",
    ),
    a(
        "C27",
        "inherited-fds",
        c27_inherited_fds,
        "inherited_fd, inherited_fd_target",
    ),
    a(
        "C28",
        "env-credential-leak",
        c28_env_credentials,
        "secret_env_names",
    ),
    a(
        "C29",
        "vendor-cli-credentials",
        c29_vendor_credentials,
        "vendor_credential_path, real_home",
    ),
    sel("C30", "fork-bomb", c30_fork_bomb, None, "fork_count"),
    sel("C31", "memory-bomb", c31_memory_bomb, None, "alloc_mib"),
    sel(
        "C31b",
        "memory-past-the-bound",
        c31b_memory_past_the_bound,
        Some(hold),
        "alloc_mib hang_secs",
    ),
    sel(
        "C31c",
        "memory-every-kind",
        c31c_memory_every_kind,
        Some(hold),
        "alloc_mib (a kind, at most 160) hang_secs",
    ),
    sel(
        "C32",
        "disk-fill-workspace",
        c32_disk_fill_workspace,
        None,
        "fill_mib, workspace",
    ),
    sel(
        "C33",
        "disk-fill-tmp-and-dev-shm",
        c33_disk_fill_tmp,
        None,
        "fill_mib",
    ),
    sel(
        "C34",
        "inode-exhaustion",
        c34_inode_exhaustion,
        None,
        "inode_count, workspace",
    ),
    sel(
        "C34b",
        "deep-directory-chain",
        c34b_deep_directory_chain,
        None,
        "chain_depth, workspace",
    ),
    sel("C35", "fd-exhaustion", c35_fd_exhaustion, None, "fd_count"),
    sel(
        "C35b",
        "inotify-and-signal-queue",
        c35b_inotify_and_signal_queue,
        Some(hold),
        "fd_count hang_secs",
    ),
    sel(
        "C36",
        "cpu-spin-ignoring-abort",
        c36_cpu_spin,
        Some(c36_then),
        "hang_secs",
    ),
    sel(
        "C37",
        "sleep-ignoring-abort",
        c37_sleep_forever,
        Some(hang),
        "hang_secs",
    ),
    sel(
        "C38",
        "double-fork-daemon",
        c38_double_fork_daemon,
        None,
        "hang_secs",
    ),
    sel(
        "C39",
        "new-process-group",
        c39_new_process_group,
        None,
        "hang_secs",
    ),
    sel(
        "C40",
        "outlive-the-host",
        c40_outlive_host,
        Some(hang),
        "hang_secs",
    ),
    sel(
        "C41",
        "close-stdout-early",
        c41_close_stdout,
        Some(c41_then),
        "hang_secs",
    ),
    sel(
        "C41b",
        "grandchild-holds-stdout",
        c41b_grandchild_holds_stdout,
        Some(exit_now),
        "hang_secs",
    ),
    sel(
        "C42",
        "huge-stdout-line",
        c42_huge_line,
        Some(c42_then),
        "line_mib",
    ),
    sel(
        "C43",
        "stderr-flood",
        c43_stderr_flood,
        Some(c43_then),
        "flood_mib",
    ),
    sel(
        "C44a",
        "invalid-utf8-frame",
        c44a_invalid_utf8,
        Some(c44a_then),
        "",
    ),
    sel(
        "C44b",
        "invalid-json-frame",
        c44b_invalid_json,
        Some(c44b_then),
        "",
    ),
    sel(
        "C44c",
        "forged-response-id",
        c44c_forged_id,
        Some(c44c_then),
        "",
    ),
    sel("C44d", "huge-number", c44d_huge_number, Some(c44d_then), ""),
    sel(
        "C44e",
        "deep-nesting",
        c44e_deep_nesting,
        Some(c44e_then),
        "",
    ),
    sel(
        "C45",
        "never-read-stdin",
        c45_never_read_stdin,
        Some(c45_then),
        "",
    ),
    a("C46", "mount-tmpfs", c46_mount_tmpfs, "workspace"),
    a(
        "C47",
        "nested-userns-mount-chroot",
        c47_nested_userns,
        "workspace",
    ),
    a("C48", "setns-via-proc", c48_setns, "victim_pid"),
    a(
        "C49",
        "setuid-root-binary",
        c49_setuid_binary,
        "setuid_binary, setuid_args",
    ),
    sel(
        "C49b",
        "plant-setuid-and-executable",
        c49b_plant_setuid_and_executable,
        Some(c49b_then),
        "workspace, hang_secs",
    ),
    a(
        "C50",
        "file-capabilities-binary",
        c50_filecap_binary,
        "filecap_binary, filecap_args",
    ),
    a("C51", "dev-node-access", c51_dev_access, ""),
    a("C52", "proc-sysrq-and-sys-writes", c52_proc_sys_writes, ""),
    a("C53", "sys-access", c53_sys_access, ""),
    a("C53b", "host-facts-in-proc", c53b_host_facts, "host_facts"),
    a("C54", "tiocsti-tioclinux-injection", c54_tiocsti, ""),
    a(
        "C55",
        "change-hostname-and-time",
        c55_hostname_and_time,
        "hostname",
    ),
    a("C56", "host-sysv-shm", c56_sysv_shm, "shm_key"),
    a("C57", "host-dev-shm-file", c57_devshm_file, "devshm_path"),
    a(
        "C58",
        "kernel-attack-surface-syscalls",
        c58_kernel_surface,
        "",
    ),
    a(
        "C58a",
        "mount-lsm-xattrat-syscalls",
        c58a_mount_and_lsm_introspection,
        "",
    ),
    a("C58b", "prlimit64-on-pid-1", c58b_prlimit_pid_1, ""),
    a(
        "C58c",
        "personality-read-implies-exec",
        c58c_personality,
        "",
    ),
    a("C58d", "memfd-outside-the-memory-bound", c58d_memfd, ""),
    a(
        "C58e",
        "unlisted-syscalls-are-enosys",
        c58e_unlisted_syscalls,
        "",
    ),
    a("C59", "x32-and-i386-abi", c59_x32_and_i386, ""),
    a("C60", "capabilities-left", c60_capabilities_left, ""),
    a("C61", "core-dump", c61_core_dump, "workspace"),
    a("C62", "race-sandbox-setup", host_side_race, ""),
    a("C24", "kill-victim", c24_kill_victim, "victim_pid"),
];

/// The default sequence: everything that returns on its own.
pub fn default_sequence() -> impl Iterator<Item = &'static Attack> {
    CATALOGUE.iter().filter(|a| !a.selectable_only)
}

/// The attacks named by `selectors`, in the order given.
pub fn select(selectors: &[String]) -> Result<Vec<&'static Attack>, String> {
    selectors
        .iter()
        .map(|s| {
            CATALOGUE
                .iter()
                .find(|a| a.matches(s))
                .ok_or_else(|| format!("no attack {s:?} in the catalogue (try --list)"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The C number of an id: `C44a` → 44.
    fn number(id: &str) -> u32 {
        id[1..]
            .trim_end_matches(|c: char| c.is_ascii_alphabetic())
            .parse()
            .expect("a C number")
    }

    #[test]
    fn the_catalogue_covers_all_62_rows_once_per_id() {
        let mut ids: Vec<&str> = CATALOGUE.iter().map(|a| a.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), CATALOGUE.len(), "duplicate ids");
        let mut rows: Vec<u32> = CATALOGUE.iter().map(|a| number(a.id)).collect();
        rows.dedup();
        rows.sort();
        rows.dedup();
        assert_eq!(rows, (1..=62).collect::<Vec<_>>());
    }

    #[test]
    fn what_hangs_or_exhausts_is_selectable_only() {
        for a in CATALOGUE {
            let n = number(a.id);
            let must_select = a.then.is_some() || (30..=45).contains(&n) || n == 25;
            assert_eq!(a.selectable_only, must_select, "{}", a.label());
        }
    }

    #[test]
    fn selection_matches_ids_and_labels() {
        let got = select(&["c42".into(), "C07-hard-link-host-file".into()]).unwrap();
        assert_eq!(got.iter().map(|a| a.id).collect::<Vec<_>>(), ["C42", "C07"]);
        assert!(select(&["C41".into()]).unwrap()[0].id == "C41");
        assert!(select(&["nope".into()]).is_err());
    }

    #[test]
    fn the_victim_is_killed_last() {
        assert_eq!(default_sequence().last().map(|a| a.id), Some("C24"));
    }
}
