//! The network policy in host.toml: refused at load, naming the entry.

use std::path::Path;

use sharedos_egress::{NetworkPolicy, SecretRef};
use sharedos_host::config::HostConfig;

fn config(network: &str) -> Result<HostConfig, String> {
    config_for("sharedos-standard", network)
}

fn config_for(program: &str, network: &str) -> Result<HostConfig, String> {
    let text = format!(
        r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "{program}"
{network}

[[agents]]
agentId = "alice"
runtime = "r"
"#
    );
    HostConfig::parse(&text, "host.toml", Path::new("/etc/sharedos")).map_err(|e| e.to_string())
}

fn refused(network: &str) -> String {
    config(network).expect_err("the policy was accepted")
}

#[test]
fn none_is_the_default_and_can_be_said() {
    let c = config("").unwrap();
    assert_eq!(c.runtimes[0].network, NetworkPolicy::None);
    let c = config("network = \"none\"").unwrap();
    assert_eq!(c.runtimes[0].network, NetworkPolicy::None);
    assert!(refused("network = \"all\"").contains("network must be \"none\""));
}

#[test]
fn a_public_https_route_and_destination_load() {
    let c = config(
        r#"[runtimes.network]
routes = [{ name = "openai", upstream = "https://api.openai.com/v1", secret = "env:OPENAI_API_KEY", api = "openai" }]
destinations = [{ address = "github.com:443" }]
budget = { requests = 50, tokens = 100000 }"#,
    )
    .unwrap();
    let NetworkPolicy::Routes(r) = &c.runtimes[0].network else {
        panic!("no routes")
    };
    assert_eq!(r.routes[0].secret, SecretRef::Env("OPENAI_API_KEY".into()));
}

#[test]
fn wildcards_private_link_local_and_loopback_are_refused_by_entry() {
    let route = |upstream: &str, allow: &str| {
        format!(
            "[runtimes.network]\nroutes = [{{ name = \"m\", upstream = \"{upstream}\", secret = \"env:K\", api = \"openai\"{allow} }}]"
        )
    };
    let e = refused(&route("https://*.openai.com/v1", ""));
    assert!(e.contains("runtimes[0].network.routes[0] (m)"), "{e}");
    for (url, class) in [
        ("https://10.1.2.3/v1", "private"),
        ("https://192.168.0.9/v1", "private"),
        ("https://169.254.169.254/latest", "link-local"),
        ("https://[fe80::1]/v1", "link-local"),
        ("https://127.0.0.1:8080/v1", "loopback"),
        ("https://localhost/v1", "loopback"),
        ("https://[::1]/v1", "loopback"),
    ] {
        let e = refused(&route(url, ""));
        assert!(e.contains(&format!("allow = [\"{class}\"]")), "{url}: {e}");
        assert!(e.contains("routes[0] (m)"), "{e}");
        config(&route(url, &format!(", allow = [\"{class}\"]")))
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }
    let e = refused("[runtimes.network]\ndestinations = [{ address = \"*:443\" }]");
    assert!(
        e.contains("destinations[0]") && e.contains("wildcard"),
        "{e}"
    );
    let e = refused("[runtimes.network]\ndestinations = [{ address = \"10.0.0.1:22\" }]");
    assert!(e.contains("destinations[0] (10.0.0.1:22)"), "{e}");
}

#[test]
fn plain_http_only_to_an_allowed_local_server() {
    let e = refused(
        "[runtimes.network]\nroutes = [{ name = \"m\", upstream = \"http://api.example.com/v1\", secret = \"env:K\", api = \"openai\" }]",
    );
    assert!(e.contains("use https://"), "{e}");
    config("[runtimes.network]\nroutes = [{ name = \"m\", upstream = \"http://127.0.0.1:11434/v1\", secret = \"env:K\", api = \"openai\", allow = [\"loopback\"] }]").unwrap();
}

#[test]
fn a_secret_is_a_reference_and_never_printed() {
    let e = refused(
        "[runtimes.network]\nroutes = [{ name = \"m\", upstream = \"https://a.example/v1\", secret = \"sk-live-abc123\", api = \"openai\" }]",
    );
    assert!(e.contains("env:NAME or file:/absolute/path"), "{e}");
    assert!(
        !e.contains("sk-live-abc123"),
        "the error echoed the key: {e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k");
    std::fs::write(&path, "sk-live-abc123\n").unwrap();
    let secret = SecretRef::File(path).resolve().unwrap();
    assert_eq!(secret.expose(), "sk-live-abc123");
    assert!(!format!("{secret:?} {secret}").contains("sk-live"));
    let e = SecretRef::Env("SHAREDOS_TEST_UNSET_KEY".into())
        .resolve()
        .unwrap_err();
    assert!(
        e.contains("env:SHAREDOS_TEST_UNSET_KEY") && e.contains("not set"),
        "{e}"
    );
}

#[test]
fn a_model_driver_needs_a_route_and_is_passed_with_a_placeholder_key() {
    let driver = "driver = { kind = \"openai-chat\", baseUrl = \"http://127.0.0.1:8787/openai\", model = \"m\" }";
    let e = refused(driver);
    assert!(
        e.contains("runtimes[0].driver: a model driver needs a route"),
        "{e}"
    );
    let e = refused(&driver.replace("openai-chat", "gpt"));
    assert!(e.contains("runtimes[0].driver.kind"), "{e}");
    let with_route = format!(
        "{driver}\n[runtimes.network]\nroutes = [{{ name = \"openai\", upstream = \"https://api.openai.com/v1\", secret = \"env:OPENAI_API_KEY\", api = \"openai\" }}]"
    );
    // Any existing program: only the arguments and environment are read.
    // The gateway is built with the seat: a secret the host lacks fails
    // the start, naming the route and the reference.
    let c = config_for("/bin/true", &with_route).unwrap();
    let launcher: std::sync::Arc<dyn sharedos_host::process::Launcher> =
        std::sync::Arc::new(sharedos_host::process::DirectLauncher);
    let e = sharedos_host::seat::process_runtime(&c, &c.runtimes[0], launcher.clone())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("route openai") && e.contains("env:OPENAI_API_KEY") && e.contains("not set"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "sk-live-abc123").unwrap();
    let with_file = with_route.replace("env:OPENAI_API_KEY", &format!("file:{}", key.display()));
    let c = config_for("/bin/true", &with_file).unwrap();
    let rt = sharedos_host::seat::process_runtime(&c, &c.runtimes[0], launcher).unwrap();
    let args = &rt.config().args;
    assert_eq!(
        args,
        &[
            "--driver",
            "openai-chat",
            "--base-url",
            "http://127.0.0.1:8787/openai",
            "--model",
            "m"
        ]
    );
    let env = &rt.config().env;
    assert!(env.contains(&("SHAREDOS_MODEL_KEY".into(), "sharedos-placeholder".into())));
    assert!(env.contains(&("SHAREDOS_EGRESS_URL".into(), "http://127.0.0.1:8787".into())));
    assert!(!env.iter().any(|(k, _)| k == "OPENAI_API_KEY"));
    assert!(!format!("{env:?}").contains("sk-live"));
}

#[test]
fn the_listener_port_is_the_hosts_and_a_network_needs_the_sandbox() {
    let route = "[runtimes.network]\nroutes = [{ name = \"m\", upstream = \"https://api.example.com/v1\", secret = \"env:K\", api = \"openai\" }]";
    // Only a runtime with a network policy gets the gateway's listener,
    // and the port is never configured by hand.
    let c = config(route).unwrap();
    assert_eq!(c.runtimes[0].sandbox_policy().egress_port, Some(8787));
    assert!(c.kernel.namespaces.iter().any(|n| n == "egress"));
    let c = config("").unwrap();
    assert_eq!(c.runtimes[0].sandbox_policy().egress_port, None);
    assert!(!c.kernel.namespaces.iter().any(|n| n == "egress"));
    let e = refused(&format!("sandbox = {{ egressPort = 80 }}\n{route}"));
    assert!(e.contains("runtimes[0].sandbox.egressPort"), "{e}");
    // A direct launch would have the host's network: refused.
    let e = refused(&format!("launcher = \"direct\"\n{route}"));
    assert!(
        e.contains("runtimes[0].network") && e.contains("launcher = \"sandbox\""),
        "{e}"
    );
}

#[test]
fn a_routes_identity_headers_load_and_anything_else_is_refused_naming_the_header() {
    let route = |headers: &str| {
        format!(
            r#"[runtimes.network]
routes = [{{ name = "team", upstream = "https://api.openai.com/v1", secret = "env:OPENAI_API_KEY", api = "openai", headers = {headers} }}]"#
        )
    };
    let c = config(&route(
        r#"{ "OpenAI-Organization" = "org-1", "OpenAI-Project" = "proj_1" }"#,
    ))
    .unwrap();
    let NetworkPolicy::Routes(r) = &c.runtimes[0].network else {
        panic!("no routes")
    };
    assert_eq!(r.routes[0].headers["OpenAI-Project"], "proj_1");
    let e = refused(&route(r#"{ "anthropic-beta" = "x" }"#));
    assert!(
        e.contains("routes[0] (team).headers.anthropic-beta: only organization, project or workspace headers"),
        "{e}"
    );
    let e = refused(&route(r#"{ "OpenAI-Project" = "" }"#));
    assert!(
        e.contains("headers.OpenAI-Project: the value must be"),
        "{e}"
    );
    let e = refused(&route(r#"{ "OpenAI Project" = "p" }"#));
    assert!(e.contains("not a header name"), "{e}");
}
