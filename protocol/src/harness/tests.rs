use super::*;

fn spec(toml_like: serde_json::Value) -> HarnessSpec {
    serde_json::from_value(toml_like).unwrap()
}

fn stdio() -> HarnessSpec {
    spec(serde_json::json!({
        "command": "/opt/cli/bin/cli",
        "args": ["run", "{prompt}", "--mcp", "{mcpCommand}", "{mcpArgs}"],
        "mcp": "stdio",
        "env": {"CLI_HOME": "{home}/.cli"},
        "final": {"from": "file", "path": "{home}/last.txt"},
        "files": [{"path": "{home}/.cli/config.json",
                   "content": "{\"prompt\": {json:prompt}, \"server\": {\"command\": {json:mcpCommand}, \"args\": {json:mcpArgs}}}"}]
    }))
}

#[test]
fn a_cli_pin_is_64_lowercase_hex_digits() {
    let mut s = stdio();
    s.sha256 = Some("ab".repeat(32));
    assert_eq!(s.check("h", &[]), Vec::<String>::new());
    for bad in ["AB".repeat(32), "ab".repeat(31)] {
        s.sha256 = Some(bad);
        let problems = s.check("h", &[]);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("h.sha256: must be 64 lowercase hex digits"));
    }
}

#[test]
fn a_good_spec_has_no_problems() {
    assert_eq!(
        stdio().check("runtimes[0].harness", &[]),
        Vec::<String>::new()
    );
}

#[test]
fn unknown_and_misplaced_variables_are_named() {
    let mut s = stdio();
    s.args.push("{promt}".into());
    s.env.insert("K".into(), "{mcpUrl}".into());
    s.files[0].content = "x = {prompt}".into();
    s.files.push(HarnessFile {
        path: "/etc/passwd".into(),
        content: String::new(),
    });
    s.args.push("--url={routeUrl}".into());
    let p = s.check("runtimes[2].harness", &[]);
    let all = p.join("\n");
    assert!(
        all.contains("runtimes[2].harness.args[5]: {promt} is not a template variable"),
        "{all}"
    );
    assert!(
        all.contains("runtimes[2].harness.env.K: {mcpUrl} needs mcp = \"http\""),
        "{all}"
    );
    assert!(
        all.contains("files[0].content: {prompt} is raw here"),
        "{all}"
    );
    assert!(
        all.contains("files[1].path: \"/etc/passwd\" must be {home}/"),
        "{all}"
    );
    assert!(all.contains("args[6]: {routeUrl} needs route"), "{all}");
    assert_eq!(p.len(), 5, "{all}");
}

#[test]
fn a_route_must_be_one_of_the_runtimes() {
    let mut s = stdio();
    s.route = Some("openai".into());
    assert!(s.check("h", &["openai"]).is_empty());
    let p = s.check("h", &["anthropic"]);
    assert_eq!(p.len(), 1);
    assert!(
        p[0].starts_with("h.route: \"openai\" is not one of"),
        "{p:?}"
    );
}

#[test]
fn paths_that_climb_out_are_refused() {
    let mut s = stdio();
    s.files[0].path = "{home}/../etc/x".into();
    s.final_message = FinalMessage::File {
        path: "{home}{tmp}/x".into(),
    };
    assert_eq!(s.check("h", &[]).len(), 2);
}

#[test]
fn a_hostile_prompt_stays_one_string_in_json_and_toml() {
    let hostile =
        "\"}, \"evil\": true, \"x\": {\"\n\"\"\"\n[evil]\nkey = 1\u{7f}\u{0}\\ {home} '''";
    let t = Template::parse("a = {json:prompt}\n[b]\nc = {json:mcpArgs}\n").unwrap();
    let v = |var: Var| match var {
        Var::Prompt => VarValue::One(hostile.into()),
        Var::McpArgs => VarValue::List(vec!["relay".into(), hostile.into()]),
        _ => VarValue::One(String::new()),
    };
    let rendered = t.render(&v);
    let parsed: toml::Table = toml::from_str(&rendered).expect("valid TOML");
    assert_eq!(parsed["a"].as_str(), Some(hostile));
    assert_eq!(parsed.len(), 2, "{parsed:?}");
    let j = Template::parse("{\"p\": {json:prompt}, \"a\": {json:mcpArgs}}").unwrap();
    let parsed: serde_json::Value = serde_json::from_str(&j.render(&v)).expect("valid JSON");
    assert_eq!(parsed["p"], hostile);
    assert_eq!(parsed["a"][1], hostile);
    assert_eq!(parsed.as_object().unwrap().len(), 2);
}

fn lists(var: Var) -> VarValue {
    match var {
        Var::McpArgs => VarValue::List(vec!["mcp-relay".into(), "/tmp/x/mcp.sock".into()]),
        Var::McpCommandLine => VarValue::List(vec![
            "/h/sharedos-harness".into(),
            "mcp-relay".into(),
            "/tmp/x/mcp.sock".into(),
        ]),
        Var::McpCommand => VarValue::One("/h/sharedos-harness".into()),
        _ => VarValue::One("\"q\"".into()),
    }
}

/// `{json:mcpCommandLine}` is the whole command as one array, and
/// `{...mcpArgs}` puts the list's elements inside an array the
/// template opens: both give opencode's `"command": [cmd, arg...]`.
#[test]
fn a_list_is_spliced_into_an_array_of_a_file() {
    let want =
        serde_json::json!({"command": ["/h/sharedos-harness", "mcp-relay", "/tmp/x/mcp.sock"]});
    for text in [
        "{\"command\": {json:mcpCommandLine}}",
        "{\"command\": {mcpCommandLine}}",
        "{\"command\": [{json:mcpCommand}, {...mcpArgs}]}",
        "{\"command\": [{...mcpCommandLine}]}",
    ] {
        let rendered = Template::parse(text).unwrap().render(&lists);
        let v: serde_json::Value = serde_json::from_str(&rendered).expect(&rendered);
        assert_eq!(v, want, "{text}");
    }
    let toml_text = "cmd = [{json:mcpCommand}, {...mcpArgs}, \"--x\"]";
    let rendered = Template::parse(toml_text).unwrap().render(&lists);
    let t: toml::Table = toml::from_str(&rendered).expect(&rendered);
    assert_eq!(t["cmd"].as_array().map(Vec::len), Some(4));
}

/// As an argument a list variable alone is spliced; anywhere else in
/// an argument it must say how (JSON array, or spliced in one), and
/// `...` of a single value is refused naming the fix.
#[test]
fn list_variables_are_used_only_in_ways_that_say_how() {
    let mut s = stdio();
    s.args = vec![
        "{mcpCommandLine}".into(),
        "{...mcpArgs}".into(),
        "--mcp=[{...mcpArgs}]".into(),
        "--mcp={json:mcpCommandLine}".into(),
    ];
    assert_eq!(s.check("h", &[]), Vec::<String>::new());
    for (i, t) in ["{mcpCommandLine}", "{mcpArgs}", "{...mcpArgs}"]
        .iter()
        .enumerate()
    {
        let p = Template::parse(t).unwrap();
        assert!(p.whole_list().is_some(), "{i}");
    }
    assert_eq!(Template::parse("--x={mcpArgs}").unwrap().whole_list(), None);
    s.args = vec!["--mcp={mcpCommandLine}".into(), "{...prompt}".into()];
    s.env.insert("E".into(), "{mcpArgs}".into());
    let p = s.check("h", &[]);
    assert_eq!(p.len(), 3, "{p:#?}");
    assert!(p[0].starts_with("h.args[0]: {mcpCommandLine} is a list: use it as a whole argument (\"{mcpCommandLine}\""), "{p:#?}");
    assert!(
        p[1].starts_with(
            "h.args[1]: {...prompt} splices a list, and prompt is one value: write {json:prompt}"
        ),
        "{p:#?}"
    );
    assert!(p[2].starts_with("h.env.E: {mcpArgs} is a list"), "{p:#?}");
    let mut h = stdio();
    h.mcp = McpTransport::Http;
    h.args = vec!["{mcpCommandLine}".into()];
    h.files.clear();
    assert_eq!(
        h.check("h", &[]),
        vec!["h.args[0]: {mcpCommandLine} needs mcp = \"stdio\"".to_owned()]
    );
}

/// `stdin` is a template like the others: the prompt raw is fine
/// there (no file or command line to break), an unknown or misplaced
/// variable is named.
#[test]
fn stdin_is_a_checked_template() {
    let mut s = stdio();
    s.stdin = Some("{prompt}".into());
    assert_eq!(s.check("h", &[]), Vec::<String>::new());
    s.stdin = Some("{prompt} {mcpUrl} {promt}".into());
    let p = s.check("h", &[]);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with("h.stdin: {promt} is not a template variable"),
        "{p:#?}"
    );
    s.stdin = Some("{prompt} {mcpUrl}".into());
    assert_eq!(
        s.check("h", &[]),
        vec!["h.stdin: {mcpUrl} needs mcp = \"http\"".to_owned()]
    );
}

/// `final.take` of `from = "json"` defaults to the last line (the
/// old behaviour); a take that is not one of the three is refused.
#[test]
fn json_final_takes_parse() {
    let f: FinalMessage =
        serde_json::from_value(serde_json::json!({"from": "json", "pointer": "/r"})).unwrap();
    assert_eq!(
        f,
        FinalMessage::Json {
            pointer: "/r".into(),
            take: JsonTake::LastLine
        }
    );
    let f: FinalMessage = serde_json::from_value(
        serde_json::json!({"from": "json", "pointer": "", "take": "document"}),
    )
    .unwrap();
    assert!(matches!(
        f,
        FinalMessage::Json {
            take: JsonTake::Document,
            ..
        }
    ));
    let e = serde_json::from_value::<FinalMessage>(
        serde_json::json!({"from": "json", "pointer": "", "take": "all"}),
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("unknown variant `all`, expected one of `lastLine`, `document`, `lines`"),
        "{e}"
    );
}

#[test]
fn braces_that_are_not_variables_are_text() {
    let t = Template::parse("{\"a\": {\"b\": 1}} {{home} { home} {}").unwrap();
    assert_eq!(
        t.render(&|_| VarValue::One("X".into())),
        "{\"a\": {\"b\": 1}} {home} { home} {}"
    );
}
