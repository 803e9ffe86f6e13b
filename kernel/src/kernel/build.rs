//! Building a [`Kernel`]: from its parts, or from the host's
//! configuration (the embedded default).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::*;

/// Builds a [`Kernel`] from its parts.
pub struct KernelBuilder {
    registry: ToolRegistry,
    policy: HostPolicy,
    grants: Arc<dyn GrantSource>,
    config_grants: Option<Arc<ConfigGrantSource>>,
    usage: Arc<dyn UsageStore>,
    audit: Arc<dyn AuditSink>,
    hook: Arc<dyn ErrorHook>,
    timeout: Option<Duration>,
}

impl KernelBuilder {
    pub fn usage_store(mut self, usage: Arc<dyn UsageStore>) -> Self {
        self.usage = usage;
        self
    }
    /// Replaces the trusted grant source (a served host reads grants from
    /// its store); the configuration's in-memory source is dropped.
    pub fn grant_source(mut self, grants: Arc<dyn GrantSource>) -> Self {
        self.grants = grants;
        self.config_grants = None;
        self
    }
    pub fn error_hook(mut self, hook: Arc<dyn ErrorHook>) -> Self {
        self.hook = hook;
        self
    }
    /// The host's ceiling over every grant.
    pub fn host_policy(mut self, policy: HostPolicy) -> Self {
        self.policy = policy;
        self
    }
    /// Bounds outcome-path audit writes (`auditWriteTimeoutMs`).
    pub fn audit_write_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }
    pub fn tool(
        mut self,
        definition: ToolDefinition,
        handler: Arc<dyn ToolHandler>,
    ) -> Result<Self, RegistrationError> {
        self.registry.register(definition, handler)?;
        Ok(self)
    }
    /// Registers the four file tools over `root` (`<root>/<namespaceId>/<agentId>`).
    pub fn file_tools(
        self,
        root: &Path,
        config: crate::config::FilesConfig,
    ) -> Result<Self, KernelSetupError> {
        let files_root =
            files::FilesRoot::open(root, config).map_err(|e| KernelSetupError::FilesRoot {
                path: root.display().to_string(),
                message: e.to_string(),
            })?;
        let files_root = Arc::new(files_root);
        let mut this = self;
        for op in files::FileOp::ALL {
            this = this.tool(
                files::definition(op),
                Arc::new(files::FileTool::new(op, Arc::clone(&files_root))),
            )?;
        }
        Ok(this)
    }
    /// Registers `sharedos.escalate`.
    pub fn escalation_tool(self) -> Result<Self, RegistrationError> {
        self.tool(escalate::definition(), Arc::new(escalate::EscalateHandler))
    }
    pub fn build(self) -> Kernel {
        Kernel {
            registry: RwLock::new(Arc::new(self.registry)),
            grants: self.grants,
            config_grants: self.config_grants,
            shared: Arc::new(Shared {
                policy: RwLock::new(Arc::new(self.policy)),
                usage: self.usage,
                recorder: Recorder {
                    audit: self.audit,
                    hook: self.hook,
                    timeout: self.timeout,
                },
            }),
        }
    }
}

impl Kernel {
    /// A builder with the given trusted grant source and audit sink, an
    /// in-memory usage store, the tracing hook and no registered tools.
    pub fn builder(grants: Arc<dyn GrantSource>, audit: Arc<dyn AuditSink>) -> KernelBuilder {
        KernelBuilder {
            registry: ToolRegistry::new(),
            policy: HostPolicy::default(),
            grants,
            config_grants: None,
            usage: Arc::new(MemoryUsageStore::new()),
            audit,
            hook: Arc::new(TracingHook),
            timeout: None,
        }
    }

    /// The embedded default: grants from the host's configuration, the
    /// built-in tools the configuration enables (file tools over
    /// `files_root`), an in-memory usage store.
    pub fn from_config(
        config: &KernelConfig,
        files_root: &Path,
        audit: Arc<dyn AuditSink>,
    ) -> Result<Kernel, KernelSetupError> {
        Ok(Self::builder_from_config(config, files_root, audit)?.build())
    }

    /// [`Kernel::from_config`], stopped before `build` so a host can add
    /// its own tools, usage store or hook.
    pub fn builder_from_config(
        config: &KernelConfig,
        files_root: &Path,
        audit: Arc<dyn AuditSink>,
    ) -> Result<KernelBuilder, KernelSetupError> {
        config.validate()?;
        let source = Arc::new(ConfigGrantSource::new(config.grants.clone()));
        let mut builder = Self::builder(Arc::clone(&source) as Arc<dyn GrantSource>, audit)
            .audit_write_timeout(config.audit_write_timeout_ms.map(Duration::from_millis))
            .host_policy(config.host_policy.clone());
        builder.config_grants = Some(source);
        if let Some(path) = &config.usage_store_path {
            let store = crate::usage::JsonlUsageStore::open(path).map_err(|e| {
                KernelSetupError::UsageStore {
                    path: path.display().to_string(),
                    message: e.to_string(),
                }
            })?;
            builder = builder.usage_store(Arc::new(store));
        }
        if config.files.enabled {
            builder = builder.file_tools(files_root, config.files.clone())?;
        }
        if config.escalation.enabled {
            builder = builder.escalation_tool()?;
        }
        Ok(builder)
    }
}
