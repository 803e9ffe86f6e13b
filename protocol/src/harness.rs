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
    /// The CLI's arguments, each a template. An element that is exactly a
    /// list variable (`{mcpArgs}`, `{mcpCommandLine}`, or the same as
    /// `{...name}`) is replaced by the list's elements, one argument each.
    #[serde(default)]
    pub args: Vec<String>,
    /// What the CLI reads on its stdin, a template (`"{prompt}"`), written
    /// whole and then closed; absent: stdin is `/dev/null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
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
    /// JSON on stdout, the value at `pointer` (an RFC 6901 JSON pointer,
    /// e.g. `/result`): a string as is, anything else as JSON text. Which
    /// JSON is `take`'s.
    Json {
        pointer: String,
        #[serde(default)]
        take: JsonTake,
    },
}

/// Which JSON of stdout a `from = "json"` final message reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum JsonTake {
    /// The last non-empty line, parsed as JSON.
    #[default]
    LastLine,
    /// All of stdout as one JSON document (pretty-printed across lines).
    Document,
    /// JSON lines: the last line that parses as JSON and has a non-null
    /// value at the pointer (lines that do not parse, or lack it, are
    /// skipped).
    Lines,
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
    McpCommandLine,
    ServerName,
}

impl Var {
    const ALL: [(&'static str, Var); 11] = [
        ("prompt", Var::Prompt),
        ("home", Var::Home),
        ("tmp", Var::Tmp),
        ("routeUrl", Var::RouteUrl),
        ("placeholderKey", Var::PlaceholderKey),
        ("mcpUrl", Var::McpUrl),
        ("mcpToken", Var::McpToken),
        ("mcpCommand", Var::McpCommand),
        ("mcpArgs", Var::McpArgs),
        ("mcpCommandLine", Var::McpCommandLine),
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

    /// A list variable: its value is a list of strings.
    pub fn is_list(self) -> bool {
        matches!(self, Var::McpArgs | Var::McpCommandLine)
    }
}

/// How a variable is inserted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `{name}`: the value as is (a list as a JSON/TOML array).
    Raw,
    /// `{json:name}`: a JSON string literal, also a valid TOML basic
    /// string; a list as a JSON/TOML array of them.
    Json,
    /// `{...name}`, lists only: the elements as quoted strings separated by
    /// `, `, to go inside an array next to other elements; as a whole
    /// argument, one argument each.
    Splice,
}

/// A piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Var { var: Var, form: Form },
}

/// A parsed template: `{name}`, `{json:name}` and `{...name}` are
/// variables, `{{` is a literal `{`, every other brace is literal text (so
/// JSON and TOML bodies need no escaping). A `{word}` naming no variable is
/// an error.
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
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, ':' | '_' | '.')))
                .unwrap_or(rest.len() - 1);
            let word = &rest[1..1 + word_len];
            if word.is_empty() || !rest[1 + word_len..].starts_with('}') {
                text.push('{');
                rest = &rest[1..];
                continue;
            }
            let (form, name) = if let Some(n) = word.strip_prefix("json:") {
                (Form::Json, n)
            } else if let Some(n) = word.strip_prefix("...") {
                (Form::Splice, n)
            } else {
                (Form::Raw, word)
            };
            let Some(var) = Var::parse(name) else {
                return Err(format!(
                    "{{{word}}} is not a template variable (known: {}; json:NAME for a JSON/TOML string, ...NAME to splice a list into an array; {{{{ for a literal brace)",
                    Var::ALL.map(|(n, _)| n).join(", ")
                ));
            };
            if form == Form::Splice && !var.is_list() {
                return Err(format!(
                    "{{{word}}} splices a list, and {name} is one value: write {{json:{name}}} inside the array"
                ));
            }
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(Piece::Var { var, form });
            rest = &rest[2 + word_len..];
        }
        text.push_str(rest);
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Template(pieces))
    }

    /// The variables used, with how they are inserted.
    pub fn vars(&self) -> impl Iterator<Item = (Var, Form)> + '_ {
        self.0.iter().filter_map(|p| match p {
            Piece::Var { var, form } => Some((*var, *form)),
            Piece::Text(_) => None,
        })
    }

    /// The list variable this template is, whole (`{mcpArgs}` or
    /// `{...mcpArgs}` and nothing else): as an argument it is spliced, one
    /// argument per element.
    pub fn whole_list(&self) -> Option<Var> {
        match self.0.as_slice() {
            [
                Piece::Var {
                    var,
                    form: Form::Raw | Form::Splice,
                },
            ] if var.is_list() => Some(*var),
            _ => None,
        }
    }

    /// Renders in one pass: a value is never scanned for variables again.
    pub fn render(&self, value: &dyn Fn(Var) -> VarValue) -> String {
        let mut out = String::new();
        for p in &self.0 {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Var { var, form } => match (value(*var), form) {
                    (VarValue::One(s), Form::Raw | Form::Splice) => out.push_str(&s),
                    (VarValue::One(s), Form::Json) => out.push_str(&quote(&s)),
                    (VarValue::List(l), Form::Splice) => out.push_str(&quote_list(&l)),
                    (VarValue::List(l), Form::Raw | Form::Json) => {
                        out.push('[');
                        out.push_str(&quote_list(&l));
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
    /// `{mcpArgs}`, `{mcpCommandLine}`: spliced as arguments, an array in
    /// files (never empty: `{...name}` inside an array needs no comma
    /// handling).
    List(Vec<String>),
}

/// The elements quoted ([`quote`]) and joined by `, `.
fn quote_list(l: &[String]) -> String {
    l.iter().map(|s| quote(s)).collect::<Vec<_>>().join(", ")
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
    Stdin,
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
        if let Some(stdin) = &self.stdin {
            self.check_template(
                &format!("{field}.stdin"),
                stdin,
                Place::Stdin,
                &mut problems,
            );
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
        self.check_final(field, &mut problems);
        problems
    }

    /// `final`: its file path a file template, its pointer a JSON pointer.
    fn check_final(&self, field: &str, problems: &mut Vec<String>) {
        match &self.final_message {
            FinalMessage::File { path } => self.check_template(
                &format!("{field}.final.path"),
                path,
                Place::FilePath,
                problems,
            ),
            FinalMessage::Json { pointer, .. } => {
                if !(pointer.is_empty() || pointer.starts_with('/')) {
                    problems.push(format!(
                        "{field}.final.pointer: {pointer:?} is not a JSON pointer (\"/result\")"
                    ));
                }
            }
            FinalMessage::Stdout { .. } => {}
        }
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
                    form: Form::Raw
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
        let whole_list = place == Place::Arg && t.whole_list().is_some();
        for (var, form) in t.vars() {
            let name = var.name();
            let needs = match var {
                Var::McpUrl | Var::McpToken if self.mcp != McpTransport::Http => {
                    Some("needs mcp = \"http\"")
                }
                Var::McpCommand | Var::McpArgs | Var::McpCommandLine
                    if self.mcp != McpTransport::Stdio =>
                {
                    Some("needs mcp = \"stdio\"")
                }
                Var::RouteUrl | Var::PlaceholderKey if self.route.is_none() => {
                    Some("needs route = \"<one of network.routes>\"")
                }
                Var::Prompt if place == Place::FileContent && form != Form::Json => Some(
                    "is raw here, so a prompt could break the file: write {json:prompt} (a quoted JSON/TOML string)",
                ),
                v if v.is_list()
                    && form == Form::Raw
                    && !whole_list
                    && place != Place::FileContent =>
                {
                    Some(
                        "is a list: use it as a whole argument (\"{NAME}\", one argument per element), as {json:NAME} (an array) or inside an array as [..., {...NAME}]",
                    )
                }
                _ => None,
            };
            if let Some(why) = needs {
                problems.push(format!("{at}: {{{name}}} {}", why.replace("NAME", name)));
            }
        }
    }
}

#[cfg(test)]
mod tests;
