//! A model route with its secret resolved, and the upstream request it
//! makes of a plugin's request: the plugin's placeholder and hop-by-hop
//! headers taken out, the real key, the upstream's host and
//! `accept-encoding: identity` put in. The headers the route adds are
//! built once, when the gateway is built, not per request.

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Request, Uri};

use super::policy::{AddressClass, ApiShape, UpstreamUrl, is_identity_header};
use super::secret::Secret;

/// Headers never forwarded: hop-by-hop ones, and every header a key can
/// travel in (the plugin's placeholder is dropped, the host adds the key).
const DROPPED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
];

/// How many of [`DROPPED`] are hop-by-hop (also dropped from answers).
const HOP_BY_HOP: usize = 9;

/// A model route with its secret resolved.
pub(super) struct Route {
    pub(super) name: String,
    /// `[name]`: the path of the route's effect in the kernel.
    pub(super) path: Vec<String>,
    pub(super) url: UpstreamUrl,
    pub(super) allow: Vec<AddressClass>,
    pub(super) api: ApiShape,
    /// The key as the answers are searched for it (masked before the
    /// plugin sees them).
    pub(super) key_bytes: bytes::Bytes,
    /// Failed answers in a row that end the turn (0: never).
    pub(super) max_failures: u32,
    /// The route's own organization, project or workspace headers.
    identity: Vec<(HeaderName, HeaderValue)>,
    /// The upstream's `host` header.
    authority: HeaderValue,
    /// The key header, marked sensitive; its value is the secret's.
    key: (HeaderName, HeaderValue),
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("name", &self.name)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Route {
    /// The route `name`; an error names the route, never the secret.
    pub(super) fn new(
        name: &str,
        url: UpstreamUrl,
        secret: &Secret,
        api: ApiShape,
        allow: Vec<AddressClass>,
        identity: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let default_port = if url.tls { 443 } else { 80 };
        let authority = if url.port == default_port {
            url.host.clone()
        } else {
            format!("{}:{}", url.host, url.port)
        };
        let authority = HeaderValue::from_str(&authority)
            .map_err(|_| format!("route {name}: the upstream's host is not a header value"))?;
        let key = secret.expose();
        let (key_name, key_value) = match api {
            ApiShape::Openai => (header::AUTHORIZATION, format!("Bearer {key}")),
            ApiShape::Anthropic => (HeaderName::from_static("x-api-key"), key.to_owned()),
            ApiShape::Gemini => (HeaderName::from_static("x-goog-api-key"), key.to_owned()),
        };
        let mut key_value = HeaderValue::from_str(&key_value)
            .map_err(|_| format!("route {name}: the secret is not a valid header value"))?;
        key_value.set_sensitive(true);
        let identity = identity
            .iter()
            .map(|(n, v)| {
                let header = HeaderName::from_bytes(n.as_bytes());
                let value = HeaderValue::from_str(v);
                match (header, value) {
                    (Ok(n), Ok(v)) => Ok((n, v)),
                    _ => Err(format!("route {name}: headers.{n} is not a valid header")),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            name: name.to_owned(),
            path: vec![name.to_owned()],
            url,
            allow,
            api,
            key_bytes: bytes::Bytes::copy_from_slice(key.as_bytes()),
            max_failures: super::policy::DEFAULT_MAX_FAILURES,
            identity,
            authority,
            key: (key_name, key_value),
        })
    }

    /// The upstream request's headers: the plugin's, less [`DROPPED`]
    /// and any organization, project or workspace header, plus the
    /// route's.
    pub(super) fn upstream_headers(&self, mut headers: HeaderMap) -> HeaderMap {
        for name in DROPPED {
            headers.remove(*name);
        }
        let chosen: Vec<HeaderName> = headers
            .keys()
            .filter(|n| is_identity_header(n))
            .cloned()
            .collect();
        for name in chosen {
            headers.remove(name);
        }
        for (name, value) in &self.identity {
            headers.insert(name.clone(), value.clone());
        }
        headers.insert(header::HOST, self.authority.clone());
        // Identity so usage can be read from the bytes as they pass.
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        headers.insert(self.key.0.clone(), self.key.1.clone());
        headers
    }

    /// The upstream target of `/<route>/<rest>?<query>`, the query's
    /// key-bearing parameters stripped.
    pub(super) fn target(&self, rest: &str, query: Option<&str>) -> Result<Uri, ()> {
        let base = &self.url.base_path;
        let query = super::exposure::strip_key_params(query);
        let target = match query {
            Some(q) => format!("{base}/{rest}?{q}"),
            None => format!("{base}/{rest}"),
        };
        Uri::try_from(target).map_err(|_| ())
    }
}

impl Route {
    /// The upstream request of the plugin's request head (moved, not
    /// copied): its method, the upstream `target`, its headers as
    /// [`Route::upstream_headers`] makes them, HTTP/1.1.
    pub(super) fn upstream_request(
        &self,
        mut head: hyper::http::request::Parts,
        target: Uri,
        body: Bytes,
    ) -> Request<Full<Bytes>> {
        head.uri = target;
        head.version = hyper::Version::HTTP_11;
        head.headers = self.upstream_headers(std::mem::take(&mut head.headers));
        // What the gateway's server attached to the request stays here.
        head.extensions = hyper::http::Extensions::new();
        Request::from_parts(head, Full::new(body))
    }
}

/// Drops the hop-by-hop headers of an upstream answer.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in &DROPPED[..HOP_BY_HOP] {
        headers.remove(*name);
    }
}
