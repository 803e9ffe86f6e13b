//! The content pin of a runtime entry (`sha256 = "…"`): its form checked at
//! load, and the digest the launchers get (docs/SECURITY.md, "Content pin").

use sharedos_sandbox::ProgramDigest;

use super::RuntimeEntry;

impl RuntimeEntry {
    /// The entry's pin, once [`check`] accepted it; `None` without one.
    pub fn program_pin(&self) -> Option<ProgramDigest> {
        self.sha256
            .as_deref()
            .and_then(|s| ProgramDigest::parse(s).ok())
    }
}

/// Refuses a malformed `sha256` of runtime `i`, and a sandbox policy that
/// sets the pin itself (the host sets it from `sha256`).
pub(super) fn check(i: usize, entry: &RuntimeEntry) -> Result<(), String> {
    if let Some(text) = &entry.sha256 {
        ProgramDigest::parse(text).map_err(|why| {
            format!(
                "runtimes[{i}].sha256: {why}; set it to the digest of {} (`sha256sum {}`), or remove it to run the program unpinned",
                entry.program, entry.program
            )
        })?;
    }
    if entry.sha256.is_some()
        && entry.launcher == super::LauncherKind::Sandbox
        && !entry.sandbox.layers.mountns
    {
        return Err(format!(
            "runtimes[{i}].sha256: a pinned program runs only from its staged copy, which the sandbox's mount namespace binds in; turn runtimes[{i}].sandbox.layers.mountns back on, or remove the pin"
        ));
    }
    if entry.sandbox.program_sha256.is_some() {
        return Err(format!(
            "runtimes[{i}].sandbox.programSha256: set by the host from runtimes[{i}].sha256; remove it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::HostConfig;

    const ENTRY: &str = r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "sharedos-echo"
launcher = "direct"
sha256 = "PIN"
"#;

    #[test]
    fn a_pin_is_64_lowercase_hex_digits_or_a_config_error() {
        let good = "ab".repeat(32);
        let c =
            HostConfig::parse(&ENTRY.replace("PIN", &good), "host.toml", Path::new(".")).unwrap();
        let pin = c.runtimes[0].program_pin().unwrap();
        assert_eq!(pin.hex(), good);
        assert_eq!(c.runtimes[0].sandbox_policy().program_sha256, Some(pin));
        for bad in [
            "AB".repeat(32),
            "ab".repeat(31),
            "sha256:".to_owned() + &good,
        ] {
            let text = ENTRY.replace("PIN", &bad);
            let e = HostConfig::parse(&text, "host.toml", Path::new(".")).unwrap_err();
            assert!(
                e.message
                    .starts_with("runtimes[0].sha256: must be 64 lowercase hex digits"),
                "{e}"
            );
            assert!(e.message.contains("sha256sum sharedos-echo"), "{e}");
        }
        let no_mountns = ENTRY.replace("PIN", &good).replace(
            "launcher = \"direct\"",
            "sandbox = { layers = { mountns = false } }",
        );
        let e = HostConfig::parse(&no_mountns, "host.toml", Path::new(".")).unwrap_err();
        assert!(
            e.message.contains("runtimes[0].sandbox.layers.mountns"),
            "{e}"
        );
    }
}
