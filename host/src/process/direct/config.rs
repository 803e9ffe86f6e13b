//! A `direct` runtime has no sandbox: its plugin runs as a plain child of
//! the host, at level `minimal` with nothing bounding its memory. A
//! `sandbox` section that asks more of it (`minLevel` above `minimal`,
//! `requireMemoryBound = true`) could never be met, so it is refused at
//! load rather than ignored. Only keys written in the file count: the
//! policy's default `minLevel` (`isolated`) applies to sandboxed launchers.

/// `raw`: the configuration file as a TOML table. `Err` names the entry,
/// the key and the fix.
pub(crate) fn check(raw: &toml::Table) -> Result<(), String> {
    let Some(toml::Value::Array(runtimes)) = raw.get("runtimes") else {
        return Ok(());
    };
    for (i, r) in runtimes.iter().enumerate() {
        let direct = r.get("launcher").and_then(toml::Value::as_str) == Some("direct");
        let Some(sandbox) = r.get("sandbox").filter(|_| direct) else {
            continue;
        };
        if let Some(level) = sandbox.get("minLevel").and_then(toml::Value::as_str)
            && level != "minimal"
        {
            return Err(format!(
                "runtimes[{i}].sandbox.minLevel: launcher = \"direct\" runs the plugin with no \
                 sandbox (level minimal), so minLevel = {level:?} can never be met; fix: use \
                 launcher = \"sandbox\", or remove minLevel"
            ));
        }
        if sandbox
            .get("requireMemoryBound")
            .and_then(toml::Value::as_bool)
            == Some(true)
        {
            return Err(format!(
                "runtimes[{i}].sandbox.requireMemoryBound: launcher = \"direct\" bounds none of \
                 the plugin's memory; fix: use launcher = \"sandbox\" on a host with a delegated \
                 cgroup v2 memory controller, or remove requireMemoryBound"
            ));
        }
    }
    Ok(())
}
