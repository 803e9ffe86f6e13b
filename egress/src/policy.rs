//! A runtime's network policy (`[runtimes.network]` in host.toml) and the
//! checks that refuse a policy reaching too far, at load, naming the entry.
//!
//! `network = "none"` (the default) gives the plugin no egress at all. A
//! policy lists model routes (reverse-proxied to an upstream base URL with
//! the real key added by the host) and destinations (`host:port` over HTTP
//! CONNECT). A wildcard is never accepted; a private, link-local or
//! loopback target only with the entry's explicit `allow`.

use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::secret::SecretRef;

/// Which address classes an entry may reach besides public ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddressClass {
    /// 127.0.0.0/8, ::1, `localhost`: the host's own services.
    Loopback,
    /// RFC 1918, 100.64/10 (CGNAT), fc00::/7.
    Private,
    /// 169.254/16 (incl. cloud metadata), fe80::/10.
    LinkLocal,
}

/// The wire shape of a model API: where the key goes, how usage is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApiShape {
    /// `Authorization: Bearer` (Chat Completions and Responses).
    Openai,
    /// `x-api-key`.
    Anthropic,
    /// `x-goog-api-key`.
    Gemini,
}

/// One model route: `/<name>/...` on the gateway maps to `upstream/...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelRoute {
    pub name: String,
    /// `https://host[:port][/base]`; `http://` only with `allow` naming
    /// the upstream's address class (a local model server).
    pub upstream: String,
    pub secret: SecretRef,
    pub api: ApiShape,
    #[serde(default)]
    pub allow: Vec<AddressClass>,
    /// Organization, project or workspace headers the route sends
    /// (`{ "OpenAI-Project" = "proj_..." }`); the plugin's own values of
    /// such headers never pass.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Failed answers in a row (5xx, 429, 401, 403, or no answer at all)
    /// after which the turn ends `model_unavailable` (or
    /// `model_access_refused` for 401/403) instead of retrying until its
    /// deadline; 0 never ends it. Default [`DEFAULT_MAX_FAILURES`].
    #[serde(default = "default_max_failures")]
    pub max_failures: u32,
}

/// A model route's default [`ModelRoute::max_failures`].
pub const DEFAULT_MAX_FAILURES: u32 = 3;

fn default_max_failures() -> u32 {
    DEFAULT_MAX_FAILURES
}

/// One CONNECT destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Destination {
    /// `host:port`, exactly; no wildcard.
    pub address: String,
    #[serde(default)]
    pub allow: Vec<AddressClass>,
}

/// Per-turn budgets; exceeding one ends the turn `egress_budget_exceeded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EgressBudget {
    #[serde(default)]
    pub requests: Option<u64>,
    /// Request and response bytes together.
    #[serde(default)]
    pub bytes: Option<u64>,
    /// Input and output tokens as the upstream reports them.
    #[serde(default)]
    pub tokens: Option<u64>,
}

/// The routes and destinations of a runtime with egress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetworkRoutes {
    #[serde(default)]
    pub routes: Vec<ModelRoute>,
    #[serde(default)]
    pub destinations: Vec<Destination>,
    #[serde(default)]
    pub budget: Option<EgressBudget>,
    /// Extra PEM CA file trusted for upstreams (besides the system roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
}

/// `network = "none"` or a table of routes.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum NetworkPolicy {
    #[default]
    None,
    Routes(NetworkRoutes),
}

impl Serialize for NetworkPolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            NetworkPolicy::None => s.serialize_str("none"),
            NetworkPolicy::Routes(r) => r.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for NetworkPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Through a value so a bad table reports its own field, not
        // "matched no variant".
        match toml::Value::deserialize(d)? {
            toml::Value::String(s) if s == "none" => Ok(NetworkPolicy::None),
            toml::Value::String(s) => Err(serde::de::Error::custom(format!(
                "network must be \"none\" or a table of routes, got {s:?}"
            ))),
            v => NetworkRoutes::deserialize(v)
                .map(NetworkPolicy::Routes)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A parsed `scheme://host[:port][/base]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// No trailing slash; empty for the root.
    pub base_path: String,
}

impl UpstreamUrl {
    pub fn parse(text: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(r) = text.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = text.strip_prefix("http://") {
            (false, r)
        } else {
            return Err("must start with https:// (or http:// for a local server)".into());
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if path.contains(['?', '#']) || authority.contains('@') {
            return Err("must not hold a query, fragment or user info".into());
        }
        let (host, port) = split_host_port(authority, if tls { 443 } else { 80 })?;
        Ok(Self {
            tls,
            host,
            port,
            base_path: path.trim_end_matches('/').to_owned(),
        })
    }
}

/// `host[:port]`, IPv6 in brackets; the default port when none is given.
pub fn split_host_port(authority: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let end = rest
            .find(']')
            .ok_or("an IPv6 address needs its closing ]")?;
        let port = rest[end + 1..].strip_prefix(':');
        (&rest[..end], port)
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or(format!("port {p:?} is not a number in 1..=65535"))?,
        None => default_port,
    };
    let valid = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
    if !valid {
        return Err(format!(
            "host {host:?} is not a host name or an address (no wildcard)"
        ));
    }
    Ok((host.to_ascii_lowercase(), port))
}

/// The restricted class of an address, `None` for a public one.
pub fn class_of(ip: IpAddr) -> Option<AddressClass> {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            if v4.is_loopback() || v4.is_unspecified() {
                Some(AddressClass::Loopback)
            } else if v4.is_link_local() {
                Some(AddressClass::LinkLocal)
            } else if v4.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64) || o[0] == 0 {
                Some(AddressClass::Private)
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return class_of(IpAddr::V4(v4));
            }
            let s = v6.segments();
            if v6.is_loopback() || v6.is_unspecified() {
                Some(AddressClass::Loopback)
            } else if (s[0] & 0xffc0) == 0xfe80 {
                Some(AddressClass::LinkLocal)
            } else if (s[0] & 0xfe00) == 0xfc00 {
                Some(AddressClass::Private)
            } else {
                None
            }
        }
    }
}

/// The class a host name or literal announces before resolution.
pub fn class_of_host(host: &str) -> Option<AddressClass> {
    if host == "localhost" || host.ends_with(".localhost") {
        return Some(AddressClass::Loopback);
    }
    host.parse::<IpAddr>().ok().and_then(class_of)
}

fn check_reach(entry: &str, host: &str, allow: &[AddressClass]) -> Result<(), String> {
    if host.contains('*') {
        return Err(format!("{entry}: a wildcard is never allowed"));
    }
    match class_of_host(host) {
        Some(class) if !allow.contains(&class) => Err(format!(
            "{entry}: {host} is a {} address; add allow = [\"{}\"] to this entry to reach it",
            serde_json::to_value(class)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
            serde_json::to_value(class)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default(),
        )),
        _ => Ok(()),
    }
}

/// Whether a request header selects whose account a request is billed to
/// or runs in (`OpenAI-Organization`, `OpenAI-Project`, an Anthropic
/// workspace, Google's `x-goog-user-project`): the plugin's value never
/// passes; the route's `headers` set one.
pub(super) fn is_identity_header(name: &hyper::header::HeaderName) -> bool {
    let n = name.as_str();
    n.contains("organization") || n.contains("project") || n.contains("workspace")
}

/// A route's `headers`: each names an organization, project or
/// workspace header (the only headers a plugin may not choose itself) and
/// has a value a header can carry.
fn check_route_headers(
    entry: &str,
    headers: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    for (name, value) in headers {
        let header = hyper::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("{entry}.headers.{name}: not a header name"))?;
        if !is_identity_header(&header) {
            return Err(format!(
                "{entry}.headers.{name}: only organization, project or workspace headers \
                 (OpenAI-Organization, OpenAI-Project, anthropic-workspace-id, \
                 x-goog-user-project); the plugin's other headers pass as it sends them"
            ));
        }
        if hyper::header::HeaderValue::from_str(value).is_err() || value.is_empty() {
            return Err(format!(
                "{entry}.headers.{name}: the value must be visible ASCII, not empty"
            ));
        }
    }
    Ok(())
}

impl NetworkRoutes {
    /// Refuses, naming the entry, what the policy must not reach.
    /// `prefix` is where the policy sits in host.toml.
    pub fn check(&self, prefix: &str) -> Result<(), String> {
        let mut names = std::collections::HashSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            let entry = format!("{prefix}.routes[{i}] ({})", r.name);
            let name_ok = !r.name.is_empty()
                && r.name.len() <= 64
                && r.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'));
            if !name_ok {
                return Err(format!("{entry}.name: use 1-64 of [A-Za-z0-9_-]"));
            }
            if !names.insert(r.name.as_str()) {
                return Err(format!("{entry}.name: defined twice"));
            }
            let url =
                UpstreamUrl::parse(&r.upstream).map_err(|e| format!("{entry}.upstream: {e}"))?;
            check_reach(&format!("{entry}.upstream"), &url.host, &r.allow)?;
            check_route_headers(&entry, &r.headers)?;
            if !url.tls && class_of_host(&url.host).is_none() {
                return Err(format!(
                    "{entry}.upstream: plain http:// only to a loopback or private server \
                     named in allow; use https://"
                ));
            }
        }
        for (i, d) in self.destinations.iter().enumerate() {
            let entry = format!("{prefix}.destinations[{i}] ({})", d.address);
            if d.address.contains('*') {
                return Err(format!("{entry}: a wildcard is never allowed"));
            }
            if !d.address.contains(':') {
                return Err(format!("{entry}: must be host:port"));
            }
            let (host, _) = split_host_port(&d.address, 0).map_err(|e| format!("{entry}: {e}"))?;
            check_reach(&entry, &host, &d.allow)?;
        }
        if let Some(ca) = &self.ca_file
            && !ca.is_absolute()
        {
            return Err(format!("{prefix}.caFile: must be an absolute path"));
        }
        Ok(())
    }
}

impl NetworkPolicy {
    pub fn check(&self, prefix: &str) -> Result<(), String> {
        match self {
            NetworkPolicy::None => Ok(()),
            NetworkPolicy::Routes(r) => r.check(prefix),
        }
    }
}
