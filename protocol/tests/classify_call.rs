//! `classify_call` (one pass, a tool call's params parsed while the line
//! is classified) against `classify` followed by the consumer's own parse
//! of the raw params (the reference): the same outcome, error or value,
//! for generated requests in every member order, with escapes, duplicates,
//! unknown members and bad params of many kinds.

use serde_json::value::RawValue;
use sharedos_protocol::InvokeToolParams;
use sharedos_protocol::jsonrpc::{
    EnvelopeError, Incoming, Params, RequestId, WireError, classify, classify_call,
    classify_call_by_hand,
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
    seen(classify_call(line))
}

/// What a consumer of `classify_call`'s answer ends up with, and whether
/// the params came parsed.
fn seen(answer: Result<Incoming<'_, Params<'_>>, EnvelopeError>) -> (Seen, bool) {
    let typed = |method: &str, p: Option<Params<'_>>| match p {
        Some(Params::InvokeTool(call)) => (Body::Call(Some(call)), true),
        Some(Params::Raw(raw)) => (body(method, Some(raw)), false),
        None => (Body::Absent, false),
    };
    match answer {
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
    r#""😀 ünï""#,
    r#""\ud83d\ude00""#,
    r#""\ud83d""#,
    "\"\t\"",
    "\"a\u{7f}\"",
    r#""\u2003x\u00a0""#,
    "\"\u{2003}x\u{a0}\"",
    r#"{"id":1}"#,
    "true",
];
const TOOLS: &[&str] = &[r#""noop""#, r#""echo\/x""#, r#""t""#, "[]", r#""é""#];
const ARGUMENTS: &[&str] = &[
    "{}",
    r#"{"q":"\"x\"","n":[1,-2,0.5,1e3],"o":{"a":null,"b":true}}"#,
    r#"{"k":1,"k":2}"#,
    "[]",
    "null",
    r#"{"deep":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}"#,
    r#"{"s":"}]{[\\","t":"\\\"}","u":"😀"}"#,
    r#"{ "a" : [ 1 , { } ] , "b" : "" }"#,
    r#"{"a":1,}"#,
    r#"{"a":}"#,
    r#"{"a":[}"#,
    r#"{"a":1}}"#,
    r#"{"n":1e400}"#,
    r#"{"n":-0,"m":18446744073709551616,"f":1.5e-7}"#,
    "{\"c\":\"\u{1}\"}",
    r#"{"":{"":{"":[]}}}"#,
];
const TRACES: &[&str] = &[r#""tr""#, r#""tr\u00e9""#, "1", r#""trace é""#];
const TIMES: &[&str] = &[
    r#""2026-01-01T00:00:00Z""#,
    r#""2026-01-01T00:00:00.123+02:00""#,
    r#""2026-01-01 00:00""#,
    r#""yesterday""#,
    r#""2026-01-01t00:00:00.123456789z""#,
    r#""2016-12-31T23:59:60Z""#,
    r#""2026-02-29T00:00:00Z""#,
    r#""2026-01-01T00:00:00+24:00""#,
    r#""0000-01-01T00:00:00-01:00""#,
    r#""9999-12-31T23:59:59-23:59""#,
    r#""2026-01-01T00:00:00\u005a""#,
    "null",
];
const TURNS: &[&str] = &[
    r#""turn-1""#,
    r#""t\u002d1""#,
    r#""bad turn""#,
    r#""""#,
    "5",
    r#""a.b:c_D-9""#,
    r#""tü""#,
    "null",
];
const STEPS: &[&str] = &[
    "",
    r#""step":3"#,
    r#""step":null"#,
    r#""step":-1"#,
    r#""step":0"#,
    r#""step":-0"#,
    r#""step":007"#,
    r#""step":1.0"#,
    r#""step":1e2"#,
    r#""step":18446744073709551615"#,
    r#""step":18446744073709551616"#,
    r#""step":99999999999999999999999"#,
    r#""step":"3""#,
    r#""step":3 "#,
];

/// A long string member value of `n` copies of `unit`.
fn long(unit: &str, n: usize) -> String {
    format!("\"{}\"", unit.repeat(n))
}

/// JSON whitespace (or, rarely, something that is not) after some of the
/// line's structural characters: where a parser must skip it.
fn spaced(g: &mut Gen, line: String) -> String {
    if g.below(4) != 0 {
        return line;
    }
    let mut out = String::with_capacity(line.len() * 2);
    for c in line.chars() {
        out.push(c);
        if matches!(c, '{' | '[' | ',' | ':' | '}') && g.below(3) == 0 {
            out.push_str([" ", "\t", "\r\n", "  ", "\u{a0}", "\u{c}"][g.below(6)]);
        }
    }
    if g.below(3) == 0 {
        out.insert_str(0, [" ", "\n", "\t "][g.below(3)]);
    }
    if g.below(3) == 0 {
        out.push_str([" ", "\r", "\n \t"][g.below(3)]);
    }
    out
}

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
        3 | 4 => {
            let i = g.below(all.len());
            all[i] = renamed(g, &all[i]);
        }
        _ => {}
    }
    format!("{{{}}}", all.join(","))
}

/// `member` (`"name":value`) under a near miss of its name: one
/// character short or long, a letter escaped, a space or a control
/// character inside the quotes, a quote escaped. Only the exact name is
/// that member; an escaped letter still is, for a full JSON reader.
fn renamed(g: &mut Gen, member: &str) -> String {
    let Some(end) = member[1..].find('"').map(|i| i + 1) else {
        return member.to_owned();
    };
    let (name, rest) = (&member[1..end], &member[end..]);
    let Some(first) = name.chars().next() else {
        return member.to_owned();
    };
    let name = match g.below(8) {
        0 => name[..name.len() - 1].to_owned(),
        1 => format!("{name}s"),
        2 => format!("\\u{:04x}{}", u32::from(first), &name[1..]),
        3 => format!("{name} "),
        4 => format!(" {name}"),
        5 => format!("{name}\\u0000"),
        6 => format!("{name}\u{1}"),
        _ => format!("{name}\\\""),
    };
    format!("\"{name}{rest}")
}

/// `arguments`, sometimes nested around the depths where a reader's
/// limits lie.
fn arguments(g: &mut Gen) -> String {
    if g.below(30) != 0 {
        return g.pick(ARGUMENTS).to_owned();
    }
    let depth = [2, 20, 62, 63, 64, 65, 100, 124, 125, 126, 127, 200][g.below(12)];
    let (open, close) = if g.below(2) == 0 {
        ("[", "]")
    } else {
        (r#"{"a":"#, "}")
    };
    format!(
        r#"{{"d":{}1{}}}"#,
        open.repeat(depth - 1),
        close.repeat(depth - 1)
    )
}

/// A call id, now and then a long one around `Identifier`'s bound.
fn call_id(g: &mut Gen) -> String {
    match g.below(60) {
        0 => long("x", [255, 256, 257][g.below(3)]),
        1 => long("é", [256, 257][g.below(2)]),
        2 => long("😀", [256, 257][g.below(2)]),
        3 => format!("\" {} \"", "y".repeat(256)),
        _ => g.pick(CALL_IDS).to_owned(),
    }
}

fn turn_id(g: &mut Gen) -> String {
    match g.below(60) {
        0 => long("t", [128, 129][g.below(2)]),
        _ => g.pick(TURNS).to_owned(),
    }
}

fn params(g: &mut Gen) -> String {
    let mut call = vec![
        format!(r#""id":{}"#, call_id(g)),
        format!(r#""tool":{}"#, g.pick(TOOLS)),
        format!(r#""arguments":{}"#, arguments(g)),
        format!(r#""traceId":{}"#, g.pick(TRACES)),
        format!(r#""requestedAt":{}"#, g.pick(TIMES)),
    ];
    if g.below(20) == 0 {
        call.push(r#""unknown":1"#.into());
    }
    let call = members(g, call);
    let mut top = vec![
        format!(r#""turnId":{}"#, turn_id(g)),
        format!(r#""call":{call}"#),
    ];
    let step = g.pick(STEPS);
    if !step.is_empty() {
        top.push(step.to_owned());
    }
    if g.below(30) == 0 {
        top.push(r#""callId":"c""#.into());
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
        r#""host/invokeToo""#,
        r#""host/invokeTools""#,
        r#""host/invokeTool ""#,
        r#""\u0068ost/invokeTool""#,
        "null",
        "7",
    ]);
    let long_id = long("i", 64 + g.below(2));
    let id = g.pick(&[
        "1",
        r#""p-1""#,
        "9007199254740991",
        "null",
        "-1",
        r#""é""#,
        "0",
        "01",
        "9007199254740992",
        "1.0",
        "1e2",
        r#""\u0031""#,
        &long_id,
        "18446744073709551616",
    ]);
    let mut all = vec![
        r#""jsonrpc":"2.0""#.to_owned(),
        format!(r#""id":{id}"#),
        format!(r#""method":{method}"#),
        format!(r#""params":{}"#, params(g)),
    ];
    match g.below(36) {
        0 => all.push(r#""result":1"#.into()),
        1 => all[0] = r#""jsonrpc":"1.0""#.into(),
        2 => all[0] = r#""jsonrpc":null"#.into(),
        3 => all.push(r#""error":{"code":1,"message":"m"}"#.into()),
        4 => all[3] = all[3].replace("\"params\"", "\"p\\u0061rams\""),
        5 => all.push(r#""extra":[1,"x"]"#.into()),
        6 => all[0] = r#""jsonrpc":"2\u002e0""#.into(),
        8 => all[0] = r#""jsonrpc":"2.00""#.into(),
        9 => all[0] = r#""jsonrpc":"2.""#.into(),
        10 => all[0] = r#""jsonrpc":2.0"#.into(),
        7 => all.push(r#""params":{}"#.into()),
        _ => {}
    }
    let line = members(g, all);
    let line = spaced(g, line);
    match g.below(60) {
        0 => format!("{line} x"),
        1 => format!("{line}}}"),
        2 => format!("\u{feff}{line}"),
        _ => line,
    }
}

#[test]
fn one_pass_and_fallback_agree_on_generated_requests() {
    let mut g = Gen(0x005e_ed0f_ca11);
    let (mut typed, mut calls) = (0, 0);
    for _ in 0..60_000 {
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

/// The hand reading on its own: whatever line it takes, it gives what
/// `classify` and the consumer's parse give (a tool call with its params
/// parsed); it takes the plain lines in any member order.
#[test]
fn the_hand_reading_agrees_with_the_reference_on_what_it_takes() {
    let mut g = Gen(0x0bad_c0de_5eed);
    let (mut taken, mut calls) = (0, 0);
    for _ in 0..100_000 {
        let line = line(&mut g);
        let reference = reference(&line);
        let is_call = matches!(&reference, Seen::Request(_, m, Body::Call(Some(_))) if m == INVOKE);
        calls += usize::from(is_call);
        let Some(by_hand) = classify_call_by_hand(&line) else {
            continue;
        };
        taken += 1;
        let (seen, typed) = seen(Ok(by_hand));
        assert!(typed, "{line}");
        assert_eq!(seen, reference, "{line}");
    }
    // Most good calls are plain ones; the hand reading takes them.
    assert!(taken * 2 > calls, "taken by hand: {taken} of {calls}");
}

#[test]
fn the_bench_and_sdk_lines_are_read_by_hand() {
    let call = r#"{"id":"p17","tool":"noop","arguments":{},"traceId":"trace-1","requestedAt":"2026-01-01T00:00:00Z"}"#;
    let python = r#"{"id":"c1","tool":"echo","arguments":{"q":[1,"é"]},"traceId":"tr","requestedAt":"2026-12-02T01:02:03.456Z"}"#;
    let typescript = r#"{"requestedAt":"2026-12-02T01:02:03.456Z","id":"c1","tool":"echo","arguments":{"a":{"b":null}},"traceId":"tr"}"#;
    for line in [
        format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"host/invokeTool","params":{{"turnId":"turn-1","call":{call}}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":8,"method":"host/invokeTool","params":{{"turnId":"turn-1","call":{python},"step":2}}}}"#
        ),
        format!(
            r#"{{"jsonrpc":"2.0","id":9,"method":"host/invokeTool","params":{{"turnId":"turn-1","call":{typescript},"step":0}}}}"#
        ),
        format!(
            r#"{{"params":{{"step":1,"call":{typescript},"turnId":"t"}},"method":"host/invokeTool","id":"r-1","jsonrpc":"2.0"}}"#
        ),
    ] {
        let by_hand = classify_call_by_hand(&line);
        assert!(by_hand.is_some(), "{line}");
        let (seen, typed) = seen(Ok(by_hand.unwrap()));
        assert!(typed);
        assert_eq!(seen, reference(&line), "{line}");
        assert_eq!(one_pass(&line).0, seen);
    }
}
