//! The harness spec: how the MCP harness runtime (`sharedos-harness`)
//! seats a vendor CLI, as data (envelope.md E.1, docs/HARNESS.md).
//!
//! The host reads it from the runtime's `[runtimes.harness]` table, checks
//! it at load ([`HarnessSpec::check`]: every template parses, names only
//! known variables and only where they are safe) and hands the plugin a
//! [`HarnessLaunch`] as `--harness <json>`: the spec plus the facts only
//! the host knows (the route's gateway URL, the placeholder key). The
//! plugin checks it again and renders the templates for one turn.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The MCP server name the CLI is told (`{serverName}`).
pub const SERVER_NAME: &str = "sharedos";

/// The port of the streamable HTTP MCP listener on the sandbox's own
/// loopback (`mcp = "http"`): the harness binds `127.0.0.1:<port>`.
pub const MCP_HTTP_PORT: u16 = 8788;

/// The most bytes of `--harness <json>`: one argument of `execve` may hold
/// 128 KiB on Linux, and the spec must fit in one.
pub const MAX_LAUNCH_BYTES: usize = 96 * 1024;

/// One harness spec (`[runtimes.harness]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HarnessSpec {
    /// The CLI's absolute host path (no variables); the sandbox must see
    /// it (name its directory in `sandbox.extraRoPaths`).
    pub command: String,
    /// The CLI's content pin: the SHA-256 of `command`'s bytes, 64
    /// lowercase hex digits. Checked by the host at load and by the harness
    /// before every start, which then executes the descriptor it hashed
    /// (docs/HARNESS.md, "Pinning the CLI").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// The CLI's arguments, each a template. An element that is exactly
    /// `{mcpArgs}` is replaced by the relay's arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The `network.routes` entry the CLI's model traffic uses.
    #[serde(default)]
    pub route: Option<String>,
    /// How the CLI reaches the MCP server.
    pub mcp: McpTransport,
    /// The CLI's environment (besides `HOME`, `TMPDIR`, `PATH`, `LANG`),
    /// values templated. The plugin's own environment is not passed on.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Where the CLI's final message is read.
    #[serde(rename = "final")]
    pub final_message: FinalMessage,
    /// Offer `sharedos.escalate` to the CLI when the turn's catalogue has
    /// it, behind the escalation latch (envelope.md E.3).
    #[serde(default)]
    pub escalation: bool,
    /// Files written before the CLI starts (its configuration).
    #[serde(default)]
    pub files: Vec<HarnessFile>,
    /// After a drain asks the CLI to stop (SIGTERM), how long it has before
    /// SIGKILL, in ms (the turn's hard deadline comes first).
    #[serde(default = "default_term_grace")]
    pub term_grace_ms: u64,
}

fn default_term_grace() -> u64 {
    1000
}

/// How the CLI reaches the MCP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum McpTransport {
    /// The CLI spawns `{mcpCommand} {mcpArgs}`, which relays its
    /// stdin/stdout to the harness over a unix socket in the turn's tmp.
    Stdio,
    /// Streamable HTTP at `{mcpUrl}` on the sandbox's own loopback, with
    /// `Authorization: Bearer {mcpToken}`.
    Http,
}

/// A file written before the CLI starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HarnessFile {
    /// A template that starts with `{home}/` or `{tmp}/`.
    pub path: String,
    /// A template; the prompt only as `{json:prompt}`.
    pub content: String,
}

/// Where the final message comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "from", rename_all = "lowercase", deny_unknown_fields)]
pub enum FinalMessage {
    /// A file the CLI writes (`path` a template under `{home}` or `{tmp}`),
    /// trimmed.
    File { path: String },
    /// The CLI's stdout: `take = "lastLine"` (the last non-empty line, the
    /// default) or `"all"` (all of it, trimmed; only the last
    /// [`STDOUT_TAIL_BYTES`] are kept).
    Stdout {
        #[serde(default)]
        take: StdoutTake,
    },
    /// The last non-empty stdout line parsed as JSON, the string at
    /// `pointer` (an RFC 6901 JSON pointer, e.g. `/result`).
    Json { pointer: String },
}

/// The most bytes of stdout the harness keeps (the tail); more is read and
/// dropped, so a CLI writing gigabytes costs no memory.
pub const STDOUT_TAIL_BYTES: usize = 64 * 1024;

/// Which part of stdout is the final message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StdoutTake {
    #[default]
    LastLine,
    All,
}

/// What the host hands the plugin: the spec and what only the host knows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HarnessLaunch {
    /// The trusted registry entry's manifest, which the plugin reports.
    pub manifest: crate::RuntimeManifest,
    pub spec: HarnessSpec,
    /// The route's gateway URL as the plugin sees it, when `spec.route` is
    /// set (`http://127.0.0.1:8787/<route>`).
    #[serde(default)]
    pub route_url: Option<String>,
    /// The key the CLI is given; the gateway replaces it with the real one.
    pub placeholder_key: String,
}

/// A template variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Var {
    Prompt,
    Home,
    Tmp,
    RouteUrl,
    PlaceholderKey,
    McpUrl,
    McpToken,
    McpCommand,
    McpArgs,
    ServerName,
}

impl Var {
    const ALL: [(&'static str, Var); 10] = [
        ("prompt", Var::Prompt),
        ("home", Var::Home),
        ("tmp", Var::Tmp),
        ("routeUrl", Var::RouteUrl),
        ("placeholderKey", Var::PlaceholderKey),
        ("mcpUrl", Var::McpUrl),
        ("mcpToken", Var::McpToken),
        ("mcpCommand", Var::McpCommand),
        ("mcpArgs", Var::McpArgs),
        ("serverName", Var::ServerName),
    ];

    pub fn name(self) -> &'static str {
        Var::ALL
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("?", |(n, _)| n)
    }

    fn parse(name: &str) -> Option<Var> {
        Var::ALL.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

/// A piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    /// `{name}` (raw) or `{json:name}` (a JSON string literal, also a valid
    /// TOML basic string).
    Var {
        var: Var,
        json: bool,
    },
}

/// A parsed template: `{name}` and `{json:name}` are variables, `{{` is a
/// literal `{`, every other brace is literal text (so JSON and TOML bodies
/// need no escaping). A `{word}` naming no variable is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(pub Vec<Piece>);

impl Template {
    pub fn parse(s: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = s;
        while let Some(i) = rest.find('{') {
            text.push_str(&rest[..i]);
            rest = &rest[i..];
            if let Some(after) = rest.strip_prefix("{{") {
                text.push('{');
                rest = after;
                continue;
            }
            let word_len = rest[1..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == ':' || c == '_'))
                .unwrap_or(rest.len() - 1);
            let word = &rest[1..1 + word_len];
            if word.is_empty() || !rest[1 + word_len..].starts_with('}') {
                text.push('{');
                rest = &rest[1..];
                continue;
            }
            let (json, name) = match word.strip_prefix("json:") {
                Some(n) => (true, n),
                None => (false, word),
            };
            let Some(var) = Var::parse(name) else {
                return Err(format!(
                    "{{{word}}} is not a template variable (known: {}; json:NAME for a JSON/TOML string; {{{{ for a literal brace)",
                    Var::ALL.map(|(n, _)| n).join(", ")
                ));
            };
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(Piece::Var { var, json });
            rest = &rest[2 + word_len..];
        }
        text.push_str(rest);
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Template(pieces))
    }

    /// The variables used, with whether they are JSON-encoded.
    pub fn vars(&self) -> impl Iterator<Item = (Var, bool)> + '_ {
        self.0.iter().filter_map(|p| match p {
            Piece::Var { var, json } => Some((*var, *json)),
            Piece::Text(_) => None,
        })
    }

    /// Renders in one pass: a value is never scanned for variables again.
    pub fn render(&self, value: &dyn Fn(Var) -> VarValue) -> String {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Var { var, json } => match (value(*var), json) {
                    (VarValue::One(s), false) => out.push_str(&s),
                    (VarValue::One(s), true) => out.push_str(&quote(&s)),
                    (VarValue::List(l), _) => {
                        out.push('[');
                        out.push_str(&l.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", "));
                        out.push(']');
                    }
                },
            }
        }
        out
    }
}

/// A variable's value for one turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VarValue {
    One(String),
    /// `{mcpArgs}`: spliced as arguments, an array in files.
    List(Vec<String>),
}

/// `s` as a double-quoted string literal valid in both JSON and TOML: every
/// control character (DEL included, which TOML refuses raw and JSON
/// encoders leave alone), `"` and `\` escaped.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Where a template appears, which decides what it may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Arg,
    Env,
    FilePath,
    FileContent,
}

impl HarnessSpec {
    /// A `sha256` that is not 64 lowercase hex digits.
    fn pin_problem(&self, field: &str) -> Option<String> {
        let pin = self.sha256.as_deref()?;
        let hex = pin.len() == 64 && pin.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        (!hex).then(|| {
            format!(
                "{field}.sha256: must be 64 lowercase hex digits (`sha256sum {}`), or absent for an unpinned CLI",
                self.command
            )
        })
    }

    /// Every check that needs no filesystem: templates, variables per
    /// place and transport, the route, the pin's form. `field` prefixes each problem
    /// (`runtimes[2].harness`); `routes` are the runtime's route names.
    pub fn check(&self, field: &str, routes: &[&str]) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.command.starts_with('/') {
            problems.push(format!(
                "{field}.command: {:?} must be an absolute path to the CLI",
                self.command
            ));
        } else if self.command.contains('{') {
            problems.push(format!("{field}.command: takes no template variables"));
        }
        problems.extend(self.pin_problem(field));
        if let Some(route) = &self.route
            && !routes.contains(&route.as_str())
        {
            problems.push(format!(
                "{field}.route: {route:?} is not one of {field}'s runtime's network.routes ({})",
                if routes.is_empty() {
                    "it has none; add [runtimes.network] routes".to_string()
                } else {
                    routes.join(", ")
                }
            ));
        }
        if !(1..=60_000).contains(&self.term_grace_ms) {
            problems.push(format!(
                "{field}.termGraceMs: must be 1..=60000, got {}",
                self.term_grace_ms
            ));
        }
        for (i, a) in self.args.iter().enumerate() {
            self.check_template(&format!("{field}.args[{i}]"), a, Place::Arg, &mut problems);
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                problems.push(format!("{field}.env: {k:?} is not a valid variable name"));
            } else if k == "HOME" || k == "TMPDIR" || k == "PATH" {
                problems.push(format!(
                    "{field}.env.{k}: the harness sets {k} itself; remove the key"
                ));
            }
            self.check_template(&format!("{field}.env.{k}"), v, Place::Env, &mut problems);
        }
        for (i, f) in self.files.iter().enumerate() {
            let at = format!("{field}.files[{i}]");
            self.check_template(
                &format!("{at}.path"),
                &f.path,
                Place::FilePath,
                &mut problems,
            );
            self.check_template(
                &format!("{at}.content"),
                &f.content,
                Place::FileContent,
                &mut problems,
            );
        }
        match &self.final_message {
            FinalMessage::File { path } => self.check_template(
                &format!("{field}.final.path"),
                path,
                Place::FilePath,
                &mut problems,
            ),
            FinalMessage::Json { pointer } => {
                if !(pointer.is_empty() || pointer.starts_with('/')) {
                    problems.push(format!(
                        "{field}.final.pointer: {pointer:?} is not a JSON pointer (\"/result\")"
                    ));
                }
            }
            FinalMessage::Stdout { .. } => {}
        }
        problems
    }

    fn check_template(&self, at: &str, text: &str, place: Place, problems: &mut Vec<String>) {
        let t = match Template::parse(text) {
            Ok(t) => t,
            Err(e) => return problems.push(format!("{at}: {e}")),
        };
        if place == Place::FilePath {
            let starts_ok = matches!(
                t.0.first(),
                Some(Piece::Var {
                    var: Var::Home | Var::Tmp,
                    json: false
                })
            ) && matches!(t.0.get(1), Some(Piece::Text(s)) if s.starts_with('/'));
            let dotdot = t.0.iter().any(|p| match p {
                Piece::Text(s) => s.split('/').any(|c| c == ".." || c == "."),
                Piece::Var { .. } => false,
            });
            if !starts_ok || dotdot || t.vars().count() != 1 {
                problems.push(format!(
                    "{at}: {text:?} must be {{home}}/... or {{tmp}}/... with no other variable and no `.` or `..`"
                ));
                return;
            }
        }
        let whole_mcp_args = place == Place::Arg && text == "{mcpArgs}";
        for (var, json) in t.vars() {
            let name = var.name();
            let needs = match var {
                Var::McpUrl | Var::McpToken if self.mcp != McpTransport::Http => {
                    Some("needs mcp = \"http\"")
                }
                Var::McpCommand | Var::McpArgs if self.mcp != McpTransport::Stdio => {
                    Some("needs mcp = \"stdio\"")
                }
                Var::RouteUrl | Var::PlaceholderKey if self.route.is_none() => {
                    Some("needs route = \"<one of network.routes>\"")
                }
                Var::Prompt if place == Place::FileContent && !json => Some(
                    "is raw here, so a prompt could break the file: write {json:prompt} (a quoted JSON/TOML string)",
                ),
                Var::McpArgs if !json && !whole_mcp_args && place != Place::FileContent => Some(
                    "is a list: use it as a whole argument \"{mcpArgs}\" or as {json:mcpArgs} in a file",
                ),
                _ => None,
            };
            if let Some(why) = needs {
                problems.push(format!("{at}: {{{name}}} {why}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
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

    #[test]
    fn braces_that_are_not_variables_are_text() {
        let t = Template::parse("{\"a\": {\"b\": 1}} {{home} { home} {}").unwrap();
        assert_eq!(
            t.render(&|_| VarValue::One("X".into())),
            "{\"a\": {\"b\": 1}} {home} { home} {}"
        );
    }
}
