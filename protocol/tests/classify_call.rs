//! `classify_call` (one pass, a tool call's params parsed while the line
//! is classified) against `classify` followed by the consumer's own parse
//! of the raw params (the reference): the same outcome, error or value,
//! for generated requests in every member order, with escapes, duplicates,
//! unknown members and bad params of many kinds.

use serde_json::value::RawValue;
use sharedos_protocol::InvokeToolParams;
use sharedos_protocol::jsonrpc::{
    EnvelopeError, Incoming, Params, RequestId, WireError, classify, classify_call,
};

/// What a consumer ends up with for one line.
#[derive(Debug, PartialEq)]
enum Seen {
    Refused(EnvelopeError),
    Request(RequestId, String, Body),
    Notification(String, Body),
    Response(RequestId, Result<String, WireError>),
}

/// Params as the consumer reads them: a tool call's parsed (or not
/// parseable), any other method's as text.
#[derive(Debug, PartialEq)]
enum Body {
    Absent,
    Call(Option<Box<InvokeToolParams>>),
    Text(String),
}

const INVOKE: &str = "host/invokeTool";

fn body(method: &str, raw: Option<&RawValue>) -> Body {
    match raw {
        None => Body::Absent,
        Some(r) if method == INVOKE => Body::Call(
            serde_json::from_str::<InvokeToolParams>(r.get())
                .ok()
                .map(Box::new),
        ),
        Some(r) => Body::Text(r.get().to_owned()),
    }
}

fn reference(line: &str) -> Seen {
    match classify(line) {
        Err(e) => Seen::Refused(e),
        Ok(Incoming::Request { id, method, params }) => {
            let b = body(&method, params);
            Seen::Request(id, method.into_owned(), b)
        }
        Ok(Incoming::Notification { method, params }) => {
            let b = body(&method, params);
            Seen::Notification(method.into_owned(), b)
        }
        Ok(Incoming::Response { id, result }) => {
            Seen::Response(id, result.map(|r| r.get().to_owned()))
        }
    }
}

/// The one pass; also says whether it parsed the params itself.
fn one_pass(line: &str) -> (Seen, bool) {
    let typed = |method: &str, p: Option<Params<'_>>| match p {
        Some(Params::InvokeTool(call)) => (Body::Call(Some(call)), true),
        Some(Params::Raw(raw)) => (body(method, Some(raw)), false),
        None => (Body::Absent, false),
    };
    match classify_call(line) {
        Err(e) => (Seen::Refused(e), false),
        Ok(Incoming::Request { id, method, params }) => {
            let (b, t) = typed(&method, params);
            (Seen::Request(id, method.into_owned(), b), t)
        }
        Ok(Incoming::Notification { method, params }) => {
            let (b, t) = typed(&method, params);
            (Seen::Notification(method.into_owned(), b), t)
        }
        Ok(Incoming::Response { id, result }) => (
            Seen::Response(id, result.map(|r| r.get().to_owned())),
            false,
        ),
    }
}

/// A small deterministic generator (xorshift64*): the cases are the same
/// on every run.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// Mostly the first (good) entry, else any.
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        if self.below(5) < 4 {
            return from[0];
        }
        from[self.below(from.len())]
    }
}

const CALL_IDS: &[&str] = &[
    r#""c-1""#,
    r#""\u0063-2""#,
    r#""  padded  ""#,
    r#""é\n\"q\"""#,
    r#""""#,
    r#""   ""#,
    "7",
    "null",
];
const TOOLS: &[&str] = &[r#""noop""#, r#""echo\/x""#, r#""t""#, "[]"];
const ARGUMENTS: &[&str] = &[
    "{}",
    r#"{"q":"\"x\"","n":[1,-2,0.5,1e3],"o":{"a":null,"b":true}}"#,
    r#"{"k":1,"k":2}"#,
    "[]",
    "null",
    r#"{"deep":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}"#,
];
const TRACES: &[&str] = &[r#""tr""#, r#""tr\u00e9""#, "1"];
const TIMES: &[&str] = &[
    r#""2026-01-01T00:00:00Z""#,
    r#""2026-01-01T00:00:00.123+02:00""#,
    r#""2026-01-01 00:00""#,
    r#""yesterday""#,
];
const TURNS: &[&str] = &[
    r#""turn-1""#,
    r#""t\u002d1""#,
    r#""bad turn""#,
    r#""""#,
    "5",
];
const STEPS: &[&str] = &["", r#""step":3"#, r#""step":null"#, r#""step":-1"#];

/// Members in a shuffled order, some dropped, duplicated or unknown.
fn members(g: &mut Gen, mut all: Vec<String>) -> String {
    for i in (1..all.len()).rev() {
        let j = g.below(i + 1);
        all.swap(i, j);
    }
    match g.below(40) {
        0 => {
            all.remove(g.below(all.len()));
        }
        1 => {
            let dup = all[g.below(all.len())].clone();
            all.push(dup);
        }
        2 => all.push(r#""extra":{"a":[1,{"b":"\u0000"}]}"#.into()),
        _ => {}
    }
    format!("{{{}}}", all.join(","))
}

fn params(g: &mut Gen) -> String {
    let mut call = vec![
        format!(r#""id":{}"#, g.pick(CALL_IDS)),
        format!(r#""tool":{}"#, g.pick(TOOLS)),
        format!(r#""arguments":{}"#, g.pick(ARGUMENTS)),
        format!(r#""traceId":{}"#, g.pick(TRACES)),
        format!(r#""requestedAt":{}"#, g.pick(TIMES)),
    ];
    if g.below(20) == 0 {
        call.push(r#""unknown":1"#.into());
    }
    let call = members(g, call);
    let mut top = vec![
        format!(r#""turnId":{}"#, g.pick(TURNS)),
        format!(r#""call":{call}"#),
    ];
    let step = g.pick(STEPS);
    if !step.is_empty() {
        top.push(step.to_owned());
    }
    let p = members(g, top);
    match g.below(25) {
        0 => "null".into(),
        1 => "[]".into(),
        2 => p.chars().take(p.chars().count() / 2).collect(),
        _ => p,
    }
}

fn line(g: &mut Gen) -> String {
    let method = g.pick(&[
        r#""host/invokeTool""#,
        r#""host\/invokeTool""#,
        r#""host/emit""#,
        r#""host/invoketool""#,
        "null",
        "7",
    ]);
    let id = g.pick(&["1", r#""p-1""#, "9007199254740991", "null", "-1", r#""é""#]);
    let mut all = vec![
        r#""jsonrpc":"2.0""#.to_owned(),
        format!(r#""id":{id}"#),
        format!(r#""method":{method}"#),
        format!(r#""params":{}"#, params(g)),
    ];
    match g.below(30) {
        0 => all.push(r#""result":1"#.into()),
        1 => all[0] = r#""jsonrpc":"1.0""#.into(),
        2 => all[0] = r#""jsonrpc":null"#.into(),
        3 => all.push(r#""error":{"code":1,"message":"m"}"#.into()),
        4 => all[3] = all[3].replace("\"params\"", "\"p\\u0061rams\""),
        _ => {}
    }
    members(g, all)
}

#[test]
fn one_pass_and_fallback_agree_on_generated_requests() {
    let mut g = Gen(0x005e_ed0f_ca11);
    let (mut typed, mut calls) = (0, 0);
    for _ in 0..20_000 {
        let line = line(&mut g);
        let (seen, by_one_pass) = one_pass(&line);
        assert_eq!(seen, reference(&line), "{line}");
        typed += usize::from(by_one_pass);
        calls +=
            usize::from(matches!(&seen, Seen::Request(_, m, Body::Call(Some(_))) if m == INVOKE));
    }
    // The one pass did the work for many of the good calls (those whose id
    // and method come before their params), and never for anything else.
    assert!(typed > 500, "parsed in one pass: {typed} of {calls}");
    assert!(typed < calls, "{typed} of {calls}");
}

#[test]
fn the_sdks_member_order_is_read_in_one_pass() {
    let params = r#"{"turnId":"t-1","call":{"id":"c\"1","tool":"echo","arguments":{"q":[1,"é"]},"traceId":"tr","requestedAt":"2026-01-01T00:00:00Z"},"step":2}"#;
    for line in [
        format!(r#"{{"jsonrpc":"2.0","id":4,"method":"host/invokeTool","params":{params}}}"#),
        format!(r#"{{"id":4,"jsonrpc":"2.0","method":"host/invokeTool","params":{params}}}"#),
        format!(r#" {{"id":4,"method":"host\/invokeTool","params":{params},"jsonrpc":"2.0"}}"#),
    ] {
        let (seen, by_one_pass) = one_pass(&line);
        assert!(by_one_pass, "{line}");
        assert_eq!(seen, reference(&line));
        let Seen::Request(RequestId::Number(4), _, Body::Call(Some(call))) = seen else {
            panic!("{seen:?}");
        };
        assert_eq!(call.call.id.as_str(), "c\"1");
        assert_eq!(call.step, Some(2));
    }
    // params before the method: read raw, parsed by the consumer.
    let late =
        format!(r#"{{"jsonrpc":"2.0","params":{params},"id":4,"method":"host/invokeTool"}}"#);
    let (seen, by_one_pass) = one_pass(&late);
    assert!(!by_one_pass);
    assert_eq!(seen, reference(&late));
}

#[test]
fn what_the_one_pass_refuses_is_refused_as_before() {
    let p = r#"{"turnId":"t","call":{"id":"c","tool":"t","arguments":{},"traceId":"r","requestedAt":"2026-01-01T00:00:00Z"}}"#;
    for line in [
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{p},"params":{p}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{p},"method":"x"}}"#
        ),
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{p},"result":1}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":null,"method":"host/invokeTool","params":{p}}}"#),
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{p}}} x"#),
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{p},"id":2}}"#),
        format!(r#"{{"jsonrpc":"2.1","id":1,"method":"host/invokeTool","params":{p}}}"#),
        format!(r#"{{"id":1,"method":"host/invokeTool","params":{p}}}"#),
        format!(r#"[{{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{p}}}]"#),
        format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{}}}"#,
            &p[..40]
        ),
    ] {
        let (seen, _) = one_pass(&line);
        assert!(matches!(seen, Seen::Refused(_)), "{line}: {seen:?}");
        assert_eq!(seen, reference(&line), "{line}");
    }
    // Deeper than serde_json's limit inside the envelope, within it for
    // the params alone: the consumer's parse decides, as before.
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"host/invokeTool","params":{{"turnId":"t","call":{{"id":"c","tool":"t","arguments":{{"a":{}{}}},"traceId":"r","requestedAt":"2026-01-01T00:00:00Z"}}}}}}"#,
        "[".repeat(124),
        "]".repeat(124)
    );
    let (seen, by_one_pass) = one_pass(&deep);
    assert!(!by_one_pass);
    assert!(
        matches!(seen, Seen::Request(_, _, Body::Call(Some(_)))),
        "{seen:?}"
    );
    assert_eq!(seen, reference(&deep));
}
