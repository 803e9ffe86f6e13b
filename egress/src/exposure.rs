//! What a model route exposes: the request path checked and split before
//! anything else (no dot segments, no encoded octets, no empty segment,
//! no backslash), each API's allowlist of methods and endpoints, the
//! query parameters a key can travel in stripped, and the headers that
//! select an organization, project or workspace recognised so that only
//! the route's own values reach the upstream (`policy::is_identity_header`). docs/EGRESS.md, "What a
//! route exposes".

use hyper::Method;

use super::policy::ApiShape;

/// Why a request was refused before its upstream saw anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exposure {
    /// The path is not a plain path: `..`, `.`, `%`, `\` or `//`.
    PathInvalid,
    /// A plain path, but not an endpoint of the route's API (or not with
    /// this method).
    EndpointRefused,
}

impl Exposure {
    pub(super) fn code(self) -> &'static str {
        match self {
            Exposure::PathInvalid => "egress_path_invalid",
            Exposure::EndpointRefused => "egress_endpoint_refused",
        }
    }

    pub(super) fn message(self) -> &'static str {
        match self {
            Exposure::PathInvalid => {
                "the path must be plain segments: no '.' or '..' segment, no '%' \
                 encoding, no backslash, no empty segment"
            }
            Exposure::EndpointRefused => {
                "this method and path are not an endpoint of the route's model API \
                 (docs/EGRESS.md lists each API's endpoints)"
            }
        }
    }
}

/// The gateway path `/<route>/<rest>` as plain segments: the route's name
/// and the rest joined by `/`. Anything that could name another place
/// once an upstream decodes or normalizes it is refused.
pub(super) fn split_path(path: &str) -> Result<(&str, &str), Exposure> {
    let inner = path.strip_prefix('/').ok_or(Exposure::PathInvalid)?;
    let plain = |s: &str| !s.is_empty() && s != "." && s != ".." && !s.contains(['%', '\\']);
    if !inner.split('/').all(plain) {
        return Err(Exposure::PathInvalid);
    }
    Ok(inner.split_once('/').unwrap_or((inner, "")))
}

/// One segment of an endpoint.
#[derive(Clone, Copy)]
enum Seg {
    Lit(&'static str),
    /// A model or object id: `[A-Za-z0-9._:@-]`, at least one alphanumeric.
    Id,
    /// `<id>:<action>` with the action one of these (Gemini's methods).
    IdAction(&'static [&'static str]),
}

const GEMINI_GENERATE: &[&str] = &["generateContent", "streamGenerateContent", "countTokens"];

/// (method, path after the optional version segment) of each API.
const OPENAI: &[(Method, &[Seg])] = &[
    (Method::POST, &[Seg::Lit("chat"), Seg::Lit("completions")]),
    (Method::POST, &[Seg::Lit("responses")]),
    (
        Method::POST,
        &[Seg::Lit("responses"), Seg::Lit("input_tokens")],
    ),
    (Method::GET, &[Seg::Lit("models")]),
    (Method::GET, &[Seg::Lit("models"), Seg::Id]),
];
const ANTHROPIC: &[(Method, &[Seg])] = &[
    (Method::POST, &[Seg::Lit("messages")]),
    (
        Method::POST,
        &[Seg::Lit("messages"), Seg::Lit("count_tokens")],
    ),
    (Method::GET, &[Seg::Lit("models")]),
    (Method::GET, &[Seg::Lit("models"), Seg::Id]),
];
const GEMINI: &[(Method, &[Seg])] = &[
    (
        Method::POST,
        &[Seg::Lit("models"), Seg::IdAction(GEMINI_GENERATE)],
    ),
    (Method::GET, &[Seg::Lit("models")]),
    (Method::GET, &[Seg::Lit("models"), Seg::Id]),
];

/// The version segments an API's paths may start with (a route's base
/// may hold it, `https://api.openai.com/v1`, or leave it to the client,
/// `https://api.anthropic.com` for Claude Code's `/v1/messages`).
fn versions(api: ApiShape) -> &'static [&'static str] {
    match api {
        ApiShape::Openai | ApiShape::Anthropic => &["v1"],
        ApiShape::Gemini => &["v1", "v1beta", "v1alpha"],
    }
}

fn endpoints(api: ApiShape) -> &'static [(Method, &'static [Seg])] {
    match api {
        ApiShape::Openai => OPENAI,
        ApiShape::Anthropic => ANTHROPIC,
        ApiShape::Gemini => GEMINI,
    }
}

fn is_id(s: &str) -> bool {
    s.chars().any(|c| c.is_ascii_alphanumeric())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-'))
}

fn matches(pattern: &[Seg], segments: &[&str]) -> bool {
    pattern.len() == segments.len()
        && pattern.iter().zip(segments).all(|(p, s)| match p {
            Seg::Lit(l) => l == s,
            Seg::Id => is_id(s),
            Seg::IdAction(actions) => s
                .rsplit_once(':')
                .is_some_and(|(id, action)| is_id(id) && actions.contains(&action)),
        })
}

/// Whether `method` on `rest` (the path after the route's name, already
/// through [`split_path`]) is an endpoint of `api`.
pub(super) fn allowed(api: ApiShape, method: &Method, rest: &str) -> bool {
    let segments: Vec<&str> = rest.split('/').collect();
    let unversioned = match segments.first() {
        Some(first) if versions(api).contains(first) => &segments[1..],
        _ => &segments[..],
    };
    endpoints(api)
        .iter()
        .any(|(m, pattern)| m == method && matches(pattern, unversioned))
}

/// Query parameters a key or token can travel in; compared with the
/// parameter's name percent-decoded and lowercased.
const KEY_PARAMS: &[&str] = &[
    "key",
    "api_key",
    "apikey",
    "api-key",
    "x-api-key",
    "x-goog-api-key",
    "access_token",
    "token",
    "auth",
    "authorization",
    "client_secret",
    "secret",
    "password",
];

/// `query` without the parameters a key can travel in; `None` when
/// nothing is left.
pub(super) fn strip_key_params(query: Option<&str>) -> Option<String> {
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let name = p.split_once('=').map_or(*p, |(n, _)| n);
            !KEY_PARAMS.contains(&decode(name).to_ascii_lowercase().as_str())
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// Percent-decodes `text` (`+` as a space), leaving a malformed escape as
/// it is; lossy on bytes that are not UTF-8.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_leave_the_base_are_refused() {
        for bad in [
            "/openai/../admin",
            "/openai/v1/../../x",
            "/openai/./chat/completions",
            "/openai/%2e%2e/admin",
            "/openai/%2E%2E/admin",
            "/openai/chat%2fcompletions",
            "/openai/chat%2Fcompletions",
            "/openai/x%5c..%5cadmin",
            "/openai/x\\..\\admin",
            "/openai//chat/completions",
            "/openai/chat/completions/",
            "/../openai/chat/completions",
            "openai/chat/completions",
        ] {
            assert_eq!(split_path(bad), Err(Exposure::PathInvalid), "{bad}");
        }
        assert_eq!(
            split_path("/openai/chat/completions"),
            Ok(("openai", "chat/completions"))
        );
        assert_eq!(split_path("/openai"), Ok(("openai", "")));
    }

    #[test]
    fn each_api_exposes_its_model_endpoints_only() {
        let post = Method::POST;
        let get = Method::GET;
        for (api, method, rest) in [
            (ApiShape::Openai, &post, "chat/completions"),
            (ApiShape::Openai, &post, "v1/chat/completions"),
            (ApiShape::Openai, &post, "responses"),
            (ApiShape::Openai, &post, "responses/input_tokens"),
            (ApiShape::Openai, &get, "models"),
            (ApiShape::Openai, &get, "models/ft:gpt-4o-mini:org:x"),
            (ApiShape::Anthropic, &post, "v1/messages"),
            (ApiShape::Anthropic, &post, "messages/count_tokens"),
            (ApiShape::Anthropic, &get, "v1/models/claude-sonnet-4-5"),
            (
                ApiShape::Gemini,
                &post,
                "v1beta/models/gemini-2.5-flash:streamGenerateContent",
            ),
            (ApiShape::Gemini, &post, "models/gemini-2.5-pro:countTokens"),
            (
                ApiShape::Gemini,
                &post,
                "v1/models/gemini-2.5-pro:generateContent",
            ),
        ] {
            assert!(allowed(api, method, rest), "{api:?} {method} {rest}");
        }
        for (api, method, rest) in [
            (ApiShape::Openai, &Method::TRACE, "chat/completions"),
            (ApiShape::Openai, &Method::DELETE, "models/gpt-4o"),
            (ApiShape::Openai, &get, "chat/completions"),
            (ApiShape::Openai, &post, "organization/admin_api_keys"),
            (ApiShape::Openai, &get, "files"),
            (ApiShape::Openai, &post, "v1/v1/chat/completions"),
            (ApiShape::Openai, &post, "messages"),
            (ApiShape::Anthropic, &post, "v1/organizations/api_keys"),
            (ApiShape::Anthropic, &post, "chat/completions"),
            (ApiShape::Gemini, &post, "models/gemini:embedContent"),
            (ApiShape::Gemini, &post, "models/:generateContent"),
            (ApiShape::Gemini, &post, "tunedModels/x:generateContent"),
            (ApiShape::Openai, &post, ""),
        ] {
            assert!(!allowed(api, method, rest), "{api:?} {method} {rest}");
        }
    }

    #[test]
    fn key_bearing_query_parameters_are_stripped_whatever_their_spelling() {
        assert_eq!(
            strip_key_params(Some("alt=sse&key=sk-1&KEY=2&%6Bey=3&k%65y=4&beta=true")),
            Some("alt=sse&beta=true".into())
        );
        assert_eq!(
            strip_key_params(Some("api_key=1&access_token=2&Api-Key=3")),
            None
        );
        assert_eq!(strip_key_params(Some("keys=1")), Some("keys=1".into()));
        assert_eq!(strip_key_params(None), None);
        assert_eq!(decode("%zz%4"), "%zz%4");
    }

    #[test]
    fn identity_headers_are_recognised() {
        use super::super::policy::is_identity_header;
        use hyper::header::HeaderName;
        for n in [
            "openai-organization",
            "openai-project",
            "anthropic-workspace-id",
            "x-goog-user-project",
        ] {
            assert!(is_identity_header(&HeaderName::from_static(n)), "{n}");
        }
        assert!(!is_identity_header(&HeaderName::from_static(
            "anthropic-version"
        )));
    }
}
