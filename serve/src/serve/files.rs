//! `PUT` and `GET /v1/sessions/{id}/files/{path}`: the path read strictly
//! from the request's raw path, and an upload's body read within its
//! limit (docs/SERVE.md, "Files in and out"). What the path names is
//! resolved by the kernel's files root, beneath the session's directory,
//! without following a symlink.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::StatusCode;
use hyper::body::Incoming;
use hyper::header::CONTENT_LENGTH;

use super::listing::{Refusal, percent_decode};

/// A request refused before the session is asked.
pub struct Refused {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

fn invalid_path(message: impl Into<String>) -> Refused {
    Refused {
        status: StatusCode::BAD_REQUEST,
        code: "invalid_path",
        message: message.into(),
    }
}

/// The session id and the raw file path of `/v1/sessions/{id}/files/{path}`,
/// `None` for any other path.
pub fn split(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let (id, rest) = rest.split_once('/')?;
    let file = rest.strip_prefix("files/")?;
    Some((id, file))
}

/// The segments of a file path as the URI carries it: relative, every
/// segment a plain name (no empty one, no `.` or `..`, no NUL or control
/// character), and no escaped `/`, `\` or `.` that could make one after
/// decoding.
pub fn segments(raw: &str) -> Result<Vec<String>, Refused> {
    let lower = raw.to_ascii_lowercase();
    for escaped in ["%2f", "%5c", "%2e", "%00"] {
        if lower.contains(escaped) {
            return Err(invalid_path(format!(
                "the file path holds {escaped}: an escaped /, \\, . or NUL is refused; send / between segments as it is"
            )));
        }
    }
    let decoded = percent_decode(raw).map_err(|r| match r {
        Refusal::Query { message, .. } => invalid_path(message),
        Refusal::Session(e) => invalid_path(e.to_string()),
    })?;
    sharedos_kernel::tools::files::parse_path(&decoded, false)
        .map_err(|e| invalid_path(format!("the file path {}", e.trim_start_matches("/path: "))))
}

fn too_large(max: u64) -> Refused {
    Refused {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "payload_too_large",
        message: format!(
            "a file put into a session has at most {max} bytes ([serve] maxUploadBytes)"
        ),
    }
}

/// An upload's bytes, at most `max`, arriving within `within` of the
/// head; a declared or actual length beyond `max` is `413`.
pub async fn body(
    req: hyper::Request<Incoming>,
    max: u64,
    within: Duration,
) -> Result<Bytes, Refused> {
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max) {
        return Err(too_large(max));
    }
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let limited = http_body_util::Limited::new(req.into_body(), limit);
    let collected = tokio::time::timeout(within, limited.collect())
        .await
        .map_err(|_| Refused {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "request_timeout",
            message: format!(
                "the body did not arrive within {} ms of its head ([serve] headerReadTimeoutMs)",
                within.as_millis()
            ),
        })?;
    match collected {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(max)),
        Err(e) => Err(Refused {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_body",
            message: format!("the body could not be read: {e}"),
        }),
    }
}
