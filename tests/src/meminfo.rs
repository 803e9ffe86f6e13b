//! What the host reads of memory from `/proc`, for the memory-bound tests
//! (tests/tests/sandbox_bounds.rs, tests/tests/microvm_bounds.rs).

/// The number after `field` in a `/proc` status-like text (kB), 0 when
/// absent.
pub fn kib_field(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// `field` of `/proc/meminfo`, in bytes.
pub fn meminfo_bytes(field: &str) -> u64 {
    kib_field(
        &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
        field,
    ) * 1024
}

/// The system's `MemAvailable`, in bytes.
pub fn mem_available() -> u64 {
    meminfo_bytes("MemAvailable:")
}
