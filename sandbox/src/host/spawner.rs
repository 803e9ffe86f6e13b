//! The long-lived spawner thread every helper (and fork server) is
//! started from: the helper's parent-death signal fires when the *thread*
//! that created it exits (bubblewrap#692, OpenDeck#329), so it must be one
//! that never does.

use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

/// The subcommand the host binary dispatches to [`crate::helper_main`].
pub const HELPER_SUBCOMMAND: &str = "__sandbox-exec";

/// The helper's argv[0] (and pid 1's name inside the sandbox): the host
/// path of the `sharedos` binary never appears in a command line the plugin
/// can read.
pub(crate) const NEUTRAL_NAME: &str = "sandbox-init";

type Job = Box<dyn FnOnce() + Send>;

/// Run `f` on the long-lived spawner thread.
pub(crate) fn on_spawner_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("sharedos-spawner".into())
            .spawn(move || {
                for job in rx {
                    job();
                }
            })
            .expect("start the sandbox spawner thread");
        Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::sync_channel(1);
    let job: Job = Box::new(move || {
        let _ = rtx.send(f());
    });
    tx.lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(job)
        .expect("the spawner thread is alive");
    rrx.recv().expect("the spawner thread answers")
}
