//! `[serve]`'s own checks, at load.

use std::path::Path;

use super::*;

const MIN: &str = r#"
[host]
auditPath = "audit.jsonl"
filesRoot = "files"

[[runtimes]]
id = "r"
version = "1"
program = "sharedos-echo"

[[agents]]
agentId = "alice"
runtime = "r"
"#;

#[test]
fn serve_peers_parse_and_a_uid_mapped_twice_or_half_a_tls_pair_is_refused() {
    let peer = |uid: u32, ns: &str| {
        format!(
            "[[serve.peers]]\nuid = {uid}\nnamespaceId = \"{ns}\"\nauthority = {{ kind = \"service\", serviceId = \"app\" }}\n"
        )
    };
    let ok = format!("{MIN}{}{}", peer(1000, "a"), peer(1001, "b"));
    let c = ServeConfig::parse(&ok, "host.toml", Path::new(".")).unwrap();
    assert_eq!(c.serve.peers.len(), 2);
    assert_eq!(c.serve.peers[1].namespace_id.as_str(), "b");
    assert!(!c.serve.allow_plain_tcp && c.serve.tls_cert.is_none());

    let twice = format!("{MIN}{}{}", peer(1000, "a"), peer(1000, "b"));
    let e = ServeConfig::parse(&twice, "host.toml", Path::new(".")).unwrap_err();
    assert!(
        e.message
            .contains("serve.peers[1]: uid 1000 is mapped twice"),
        "{e}"
    );

    let half = format!("{MIN}[serve]\ntlsCert = \"cert.pem\"\n");
    let e = ServeConfig::parse(&half, "host.toml", Path::new(".")).unwrap_err();
    assert!(
        e.message.contains("tlsCert and serve.tlsKey go together"),
        "{e}"
    );

    let bad_ns = format!("{MIN}{}", peer(7, "a\\u0000b"));
    let e = ServeConfig::parse(&bad_ns, "host.toml", Path::new(".")).unwrap_err();
    assert!(
        e.message.contains("serve.peers[0]: a control character"),
        "{e}"
    );
}

#[test]
fn an_unknown_serve_key_names_it_and_its_byte_and_the_host_keeps_the_table_unread() {
    let bad = format!("{MIN}[serve]\nmaxConection = 3\n");
    let e = ServeConfig::parse(&bad, "host.toml", Path::new(".")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("host.toml: unknown field `maxConection`"),
        "{e}"
    );
    assert!(e.message.contains("(at byte "), "{e}");
    let host =
        HostConfig::parse(&bad, "host.toml", Path::new(".")).expect("not the host's to check");
    let e = ServeConfig::from_host(host, "host.toml").unwrap_err();
    assert!(e.message.contains("maxConection"), "{e}");
    let ok = format!("{MIN}[serve]\nmaxConnections = 3\n");
    let host = HostConfig::parse(&ok, "host.toml", Path::new(".")).unwrap();
    let from_host = ServeConfig::from_host(host, "host.toml").unwrap();
    assert_eq!(
        from_host,
        ServeConfig::parse(&ok, "host.toml", Path::new(".")).unwrap()
    );
    assert_eq!(from_host.serve.max_connections, 3);
}
