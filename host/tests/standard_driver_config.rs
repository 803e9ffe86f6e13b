//! The standard runtime's driver settings as the configuration reads them
//! (`driver.kind`, `maxTokens`, a Gemini model id), refused at load naming
//! the entry, and the same rules in the runtime's own constructor.

use sharedos_host::config::HostConfig;
use sharedos_standard::DriverKind;

#[test]
fn the_config_takes_exactly_the_driver_kinds_the_runtime_has() {
    let kinds: Vec<&str> = DriverKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(kinds, sharedos_host::config::DRIVER_KINDS);
    for kind in kinds.iter().chain(["gpt"].iter()) {
        let text = format!(
            r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "/bin/true"
driver = {{ kind = "{kind}", baseUrl = "http://127.0.0.1:8787/model", model = "m" }}
[runtimes.network]
routes = [{{ name = "model", upstream = "https://api.example.com/v1", secret = "env:MODEL_KEY", api = "openai" }}]

[[agents]]
agentId = "alice"
runtime = "r"
"#
        );
        let parsed = HostConfig::parse(&text, "host.toml", std::path::Path::new("/tmp"));
        if *kind == "gpt" {
            let e = parsed.unwrap_err().to_string();
            assert!(e.contains("runtimes[0].driver.kind"), "{e}");
            assert!(
                e.contains("anthropic-messages") && e.contains("gemini-generate-content"),
                "the error names the kinds: {e}"
            );
        } else {
            assert!(parsed.is_ok(), "{kind}: {parsed:?}");
        }
    }
}

#[test]
fn max_tokens_out_of_range_or_on_another_wire_is_refused() {
    let base = "http://127.0.0.1:8787/model";
    let made = |kind, n| sharedos_standard::model_plugin_with(kind, base, "m", "k", Some(n));
    for n in [0, 131_073] {
        let e = made(DriverKind::AnthropicMessages, n)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("1..=131072"), "{e}");
    }
    let e = made(DriverKind::OpenaiChat, 512).err().expect("refused");
    assert!(e.to_string().contains("anthropic-messages"), "{e}");

    // The same rules at load, naming the entry.
    let config = |kind: &str, max: &str| {
        format!(
            r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "/bin/true"
driver = {{ kind = "{kind}", baseUrl = "http://127.0.0.1:8787/model", model = "m", maxTokens = {max} }}
[runtimes.network]
routes = [{{ name = "model", upstream = "https://api.example.com/v1", secret = "env:MODEL_KEY", api = "anthropic" }}]

[[agents]]
agentId = "alice"
runtime = "r"
"#
        )
    };
    let parse = |text: String| HostConfig::parse(&text, "host.toml", std::path::Path::new("/tmp"));
    for max in ["0", "131073"] {
        let e = parse(config("anthropic-messages", max))
            .unwrap_err()
            .to_string();
        assert!(e.contains("runtimes[0].driver.maxTokens"), "{e}");
        assert!(e.contains("1..=131072"), "{e}");
    }
    let e = parse(config("openai-chat", "512")).unwrap_err().to_string();
    assert!(e.contains("runtimes[0].driver.maxTokens"), "{e}");
    assert!(e.contains("anthropic-messages"), "{e}");
    let e = parse(config("anthropic-messages", "\"lots\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("maxTokens") || e.contains("invalid type"), "{e}");
    let ok = parse(config("anthropic-messages", "512")).unwrap();
    assert_eq!(
        ok.runtimes[0].driver.as_ref().unwrap().max_tokens,
        Some(512)
    );
}

/// The configuration with one runtime on the Gemini driver.
fn gemini_config(model: &str, max_tokens: &str) -> Result<HostConfig, String> {
    let text = format!(
        r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "/bin/true"
driver = {{ kind = "gemini-generate-content", baseUrl = "http://127.0.0.1:8787/gemini", model = "{model}"{max_tokens} }}
[runtimes.network]
routes = [{{ name = "gemini", upstream = "https://generativelanguage.googleapis.com/v1beta", secret = "env:GEMINI_API_KEY", api = "gemini" }}]

[[agents]]
agentId = "alice"
runtime = "r"
"#
    );
    HostConfig::parse(&text, "host.toml", std::path::Path::new("/tmp")).map_err(|e| e.to_string())
}

#[test]
fn a_gemini_model_must_be_a_plain_id_and_may_have_max_tokens() {
    let base = "http://127.0.0.1:8787/gemini";
    let kind = DriverKind::GeminiGenerateContent;
    // The model is a segment of the request's path: nothing that could
    // change the path or the method.
    for bad in [
        "models/gemini-2.5-flash",
        "gemini:generateContent",
        "..",
        "a b",
    ] {
        let e = sharedos_standard::model_plugin_with(kind, base, bad, "k", None)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("plain id"), "{bad}: {e}");
        let e = gemini_config(bad, "").unwrap_err();
        assert!(e.contains("runtimes[0].driver.model"), "{bad}: {e}");
        assert!(e.contains("gemini-2.5-flash"), "{bad}: {e}");
    }
    assert!(
        sharedos_standard::model_plugin_with(kind, base, "gemini-2.5-flash", "k", Some(512))
            .is_ok()
    );
    let ok = gemini_config("gemini-2.5-flash", ", maxTokens = 512").unwrap();
    assert_eq!(
        ok.runtimes[0].driver.as_ref().unwrap().max_tokens,
        Some(512)
    );
    let e = gemini_config("gemini-2.5-flash", ", maxTokens = 0").unwrap_err();
    assert!(e.contains("1..=131072"), "{e}");
}
