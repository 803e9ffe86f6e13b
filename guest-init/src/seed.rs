//! The guest kernel's random pool, seeded from the host at each launch
//! (docs/SECURITY.md, "microVM", "The guest's random pool").

use super::{os_err, say};

/// The host's random seed for this launch (root's, 0400; removed once
/// credited).
const SEED: &str = "/sharedos/seed";

/// `_IOW('R', 0x03, int[2])`: add entropy to the kernel's pool.
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;

/// Credits the host's seed ([`SEED`]) to the kernel's random pool
/// (`RNDADDENTROPY`, 256 bits), so that `getrandom` does not wait for the
/// pool to fill itself (seconds under TCG), and removes it: the plugin
/// never reads it. A guest without one (an older host) goes on unseeded.
pub(crate) fn seed_random() {
    let Ok(seed) = std::fs::read(SEED) else {
        return;
    };
    let _ = std::fs::remove_file(SEED);
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info: Vec<u8> = Vec::with_capacity(8 + seed.len());
    info.extend_from_slice(&((seed.len() * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(seed.len() as i32).to_ne_bytes());
    info.extend_from_slice(&seed);
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")
        .map(|f| {
            // SAFETY: f is open; info is a rand_pool_info of buf_size
            // bytes of buffer, valid for the call.
            unsafe {
                libc::ioctl(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    RNDADDENTROPY,
                    info.as_ptr(),
                ) == 0
            }
        })
        .unwrap_or(false);
    if !ok {
        say(&os_err(
            "sharedos-guest-init: the host's seed was not credited to the random pool",
        ));
    }
}
