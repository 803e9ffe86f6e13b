//! Files-as-memory: `files.read`, `files.write`, `files.list`,
//! `files.delete` over each agent's directory,
//! `<root>/<namespaceId>/<agentId>/`.
//!
//! Every path is resolved segment by segment with `openat2` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` from a descriptor of the agent's
//! directory, so no `..`, absolute path, symlink or symlink swapped in
//! during the call leaves it: the kernel refuses the resolution instead.
//! The leaf is then acted on by name relative to its parent's descriptor
//! (`renameat`, `unlinkat`, `O_NOFOLLOW` opens), which never follows it.
//! Writes are atomic: a temp file, `fsync`, `renameat`, `fsync` of the
//! directory. The temp file holds an exclusive `flock` while it exists, so
//! a host opening the root later removes the ones a crash left behind
//! (their lock died with the writer) and no live one ([`super::leftovers`]).

use std::sync::Arc;

mod root;

use async_trait::async_trait;
use serde_json::{Value, json};
use sharedos_protocol::text::first_unsafe_in_name;
use sharedos_protocol::{
    AccessContext, CapabilityRequirement, JsonObject, PathSegment, ReadWrite, ResourceRef,
    ShortName, ToolAnnotations, ToolCall, ToolDefinition, ToolResult, ident,
};
use tokio_util::sync::CancellationToken;

use super::leftovers::TEMP_PREFIX;
use super::{Def, FILES_NAMESPACE, agent_id};
use crate::registry::{HandlerAnswer, ToolError, ToolHandler};

/// At most this many segments below the agent's directory.
const MAX_SEGMENTS: usize = 63;

/// Which file operation a handler performs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOp {
    Read,
    Write,
    List,
    Delete,
}

impl FileOp {
    pub const ALL: [FileOp; 4] = [FileOp::Read, FileOp::Write, FileOp::List, FileOp::Delete];

    pub fn tool_name(self) -> &'static str {
        match self {
            FileOp::Read => "files.read",
            FileOp::Write => "files.write",
            FileOp::List => "files.list",
            FileOp::Delete => "files.delete",
        }
    }
    pub fn action(self) -> &'static str {
        match self {
            FileOp::Read => "read",
            FileOp::Write => "write",
            FileOp::List => "list",
            FileOp::Delete => "delete",
        }
    }
}

fn path_schema(required: bool) -> Value {
    let mut s = json!({
        "type": "object",
        "properties": {"path": {"type": "string", "maxLength": 4096,
            "description": "Relative path below the agent's directory, segments separated by '/'."}},
        "additionalProperties": false
    });
    if required {
        s["properties"]["path"]["minLength"] = json!(1);
        s["required"] = json!(["path"]);
    }
    s
}

/// The definition of one file tool.
pub fn definition(op: FileOp) -> ToolDefinition {
    let (description, read_write, schema, annotations) = match op {
        FileOp::Read => (
            "Read a UTF-8 text file from the agent's memory directory.",
            ReadWrite::Read,
            path_schema(true),
            ToolAnnotations {
                read_only: Some(true),
                destructive: Some(false),
                idempotent: Some(true),
            },
        ),
        FileOp::Write => (
            "Write (create or replace) a UTF-8 text file in the agent's memory directory, atomically. \
             Missing parent directories are created.",
            ReadWrite::Write,
            json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "minLength": 1, "maxLength": 4096},
                    "content": {"type": "string"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }),
            ToolAnnotations {
                read_only: Some(false),
                destructive: Some(true),
                idempotent: Some(true),
            },
        ),
        FileOp::List => (
            "List a directory of the agent's memory (the root when path is empty or absent).",
            ReadWrite::Read,
            path_schema(false),
            ToolAnnotations {
                read_only: Some(true),
                destructive: Some(false),
                idempotent: Some(true),
            },
        ),
        FileOp::Delete => (
            "Delete a file or an empty directory from the agent's memory directory.",
            ReadWrite::Write,
            path_schema(true),
            ToolAnnotations {
                read_only: Some(false),
                destructive: Some(true),
                idempotent: Some(true),
            },
        ),
    };
    Def {
        name: op.tool_name(),
        description,
        namespace: FILES_NAMESPACE,
        read_write,
        schema,
        cap_namespace: FILES_NAMESPACE,
        action: op.action(),
        annotations,
    }
    .build()
}

/// Splits a relative path into checked segments. The error names the field
/// and the rule, never the value.
pub fn parse_path(path: &str, allow_empty: bool) -> Result<Vec<String>, String> {
    if path.is_empty() {
        return if allow_empty {
            Ok(vec![])
        } else {
            Err("/path: must not be empty".into())
        };
    }
    if path.starts_with('/') {
        return Err("/path: must be relative to the agent's directory, not absolute".into());
    }
    let segments: Vec<&str> = path.split('/').collect();
    if segments.len() > MAX_SEGMENTS {
        return Err(format!("/path: has more than {MAX_SEGMENTS} segments"));
    }
    let mut out = Vec::with_capacity(segments.len());
    for s in segments {
        if let Some(c) = first_unsafe_in_name(s) {
            return Err(format!(
                "/path: contains U+{:04X}; file names may not hold control, Unicode format or \
                 bidi characters, or characters that look like a space or like nothing \
                 (docs/KERNEL.md, file names)",
                u32::from(c)
            ));
        }
        let ok = PathSegment::new(s).is_ok_and(|p| p.as_str() == s);
        if !ok {
            return Err(
                "/path: every segment must be a non-empty name other than '.' or '..', without \
                        '\\', control characters or surrounding spaces"
                    .into(),
            );
        }
        if s.starts_with(TEMP_PREFIX) {
            return Err(format!(
                "/path: names starting with {TEMP_PREFIX:?} are reserved"
            ));
        }
        out.push(s.to_owned());
    }
    Ok(out)
}

use root::FileFail;
pub use root::{FileError, FilesRoot, INLINE_READ_BYTES};

/// The handler of one file tool.
#[derive(Debug, Clone)]
pub struct FileTool {
    op: FileOp,
    root: Arc<FilesRoot>,
}

impl FileTool {
    pub fn new(op: FileOp, root: Arc<FilesRoot>) -> Self {
        Self { op, root }
    }
}

/// `work` on the blocking pool, unless the turn is stopped first.
async fn pooled(
    work: impl FnOnce() -> Result<Value, FileFail> + Send + 'static,
    abort: &CancellationToken,
) -> Result<Result<Value, FileFail>, ToolError> {
    tokio::select! {
        biased;
        joined = tokio::task::spawn_blocking(work) => {
            joined.map_err(|e| ToolError::Failed(format!("file task: {e}")))
        }
        _ = abort.cancelled() => Err(ToolError::Aborted),
    }
}

fn path_arg(arguments: &JsonObject) -> &str {
    arguments.get("path").and_then(Value::as_str).unwrap_or("")
}

#[async_trait]
impl ToolHandler for FileTool {
    fn parse_arguments(&self, arguments: &JsonObject) -> Result<JsonObject, String> {
        parse_path(path_arg(arguments), self.op == FileOp::List)?;
        if self.op == FileOp::Write {
            let len = arguments
                .get("content")
                .and_then(Value::as_str)
                .map_or(0, str::len) as u64;
            if len > self.root.config.max_write_bytes {
                return Err(format!(
                    "/content: longer than {} bytes",
                    self.root.config.max_write_bytes
                ));
            }
        }
        Ok(arguments.clone())
    }

    fn resolve_requirement(
        &self,
        context: &AccessContext,
        call: &ToolCall,
    ) -> Result<Option<CapabilityRequirement>, String> {
        let agent = agent_id(&context.actor).ok_or("the file tools need an agent actor")?;
        let mut path =
            vec![PathSegment::new(agent.as_str()).map_err(|e| format!("agent id: {e}"))?];
        for s in parse_path(path_arg(&call.arguments), self.op == FileOp::List)? {
            path.push(PathSegment::new(&s).map_err(|e| format!("path: {e}"))?);
        }
        Ok(Some(CapabilityRequirement {
            resource: ResourceRef {
                namespace: ident(FILES_NAMESPACE),
                path,
                owner: None,
            },
            action: ShortName::new(self.op.action()).map_err(|e| e.to_string())?,
        }))
    }

    async fn invoke(
        &self,
        context: &AccessContext,
        call: &ToolCall,
        abort: CancellationToken,
    ) -> Result<HandlerAnswer, ToolError> {
        if abort.is_cancelled() {
            return Err(ToolError::Aborted);
        }
        let agent = agent_id(&context.actor)
            .ok_or_else(|| ToolError::Failed("file tool called without an agent actor".into()))?
            .to_string();
        let ns = context.namespace_id.to_string();
        let segs = parse_path(path_arg(&call.arguments), self.op == FileOp::List)
            .map_err(ToolError::Failed)?;
        let content = call
            .arguments
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let root = Arc::clone(&self.root);
        let op = self.op;
        let answer = match op {
            // A small file on a local disk is read here (see
            // `INLINE_READ_BYTES`); the open is one `openat2` either way.
            FileOp::Read if root.local => match root.open_regular(&ns, &agent, &segs) {
                Ok((file, size)) if size <= INLINE_READ_BYTES => {
                    root.read_answer(file, size, &segs)
                }
                Ok((file, size)) => {
                    pooled(move || root.read_answer(file, size, &segs), &abort).await?
                }
                Err(e) => Err(e),
            },
            _ => {
                let work = move || match op {
                    FileOp::Read => root.read(&ns, &agent, &segs),
                    FileOp::Write => root.write(&ns, &agent, &segs, &content),
                    FileOp::List => root.list(&ns, &agent, &segs),
                    FileOp::Delete => root.delete(&ns, &agent, &segs),
                };
                pooled(work, &abort).await?
            }
        };
        let at = context.now.clone();
        match answer {
            Ok(output) => Ok(ToolResult::succeeded(call, output, at).into()),
            Err(FileFail::Result(code, message)) => {
                Ok(ToolResult::failed(call, code, message, at).into())
            }
            Err(FileFail::Io(text)) => Err(ToolError::Failed(text)),
        }
    }
}
