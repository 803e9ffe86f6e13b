//! The outcome of a request is written before the plugin sees its answer
//! end: an audit sink that holds `effect.completed` holds the end.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::json;
use sharedos_kernel::{
    AuditError, AuditRecord, AuditSink, ConfigGrantSource, Grant, Kernel, MemoryAuditSink,
    TurnKernel,
};
use sharedos_protocol::{AccessContext, Address, Identifier, Purpose, Timestamp};
use tokio::sync::{Notify, mpsc};

use crate::mock::{MockModel, Reply};
use crate::{Gateway, GatewayLimits, NetworkRoutes, TurnBinding};

/// Holds every `effect.completed` record until `release` is notified.
struct HeldSink {
    inner: MemoryAuditSink,
    release: Arc<Notify>,
}

#[async_trait]
impl AuditSink for HeldSink {
    async fn append(&self, record: &AuditRecord) -> Result<(), AuditError> {
        if record.kind == "effect.completed" {
            self.release.notified().await;
        }
        self.inner.append(record).await
    }
}

fn context() -> AccessContext {
    let id = |s: &str| Identifier::new(s).unwrap();
    AccessContext {
        namespace_id: id("tenant-1"),
        actor: Address::Agent {
            agent_id: id("alice"),
        },
        authority: Address::Service {
            service_id: id("host"),
        },
        owner: Address::Human {
            user_id: id("olivia"),
        },
        purpose: Purpose::new("testing").unwrap(),
        trace_id: id("trace-1"),
        enabled_tool_namespaces: vec![],
        now: Timestamp::parse("2026-01-01T00:00:00Z").unwrap(),
    }
}

/// Serves a gateway to `up` whose audit holds outcomes until `release`.
async fn held_gateway(up: &MockModel, release: Arc<Notify>) -> (std::net::SocketAddr, impl Drop) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "sk-real").unwrap();
    let policy: NetworkRoutes = serde_json::from_value(json!({"routes": [{"name": "m",
        "upstream": up.base_url(), "secret": format!("file:{}", key.display()),
        "api": "openai", "allow": ["loopback"]}]}))
    .unwrap();
    let gateway = Arc::new(Gateway::from_policy(&policy, GatewayLimits::default()).unwrap());
    let grant: Grant = serde_json::from_value(json!({
        "id": "egress-m", "subject": {"kind": "agent", "agentId": "alice"},
        "issuer": {"kind": "service", "serviceId": "host"}, "namespaceId": "tenant-1",
        "capabilities": [{"namespace": "egress", "path": ["m"], "scope": "exact", "actions": ["request"]}],
    }))
    .unwrap();
    let sink = Arc::new(HeldSink {
        inner: MemoryAuditSink::new(),
        release,
    });
    let kernel = Kernel::builder(Arc::new(ConfigGrantSource::new(vec![grant])), sink).build();
    let turn = kernel.open_turn(&context()).await.unwrap();
    let (events, _) = mpsc::unbounded_channel();
    let binding = Arc::new(TurnBinding::new(turn, context(), events));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (addr, gateway.serve(listener, binding))
}

/// The whole answer of one request, as the plugin reads it.
async fn request(addr: std::net::SocketAddr) -> String {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::post("/m/chat/completions")
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8_lossy(&body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_ends_only_once_its_outcome_is_written() {
    // A sized answer (hyper stops asking for frames once it has every
    // byte) and an event stream (chunked, ended by the body's end).
    let replies = [
        Reply::Json(json!({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})),
        Reply::Stream(vec![
            "data: {\"choices\":[]}\n\n".into(),
            "data: [DONE]\n\n".into(),
        ]),
    ];
    for reply in replies {
        let up = MockModel::start(vec![reply]).await.unwrap();
        let release = Arc::new(Notify::new());
        let (addr, _serving) = held_gateway(&up, Arc::clone(&release)).await;
        let mut answer = tokio::spawn(request(addr));
        // While the outcome is held, the plugin never sees the end.
        let early = tokio::time::timeout(Duration::from_millis(300), &mut answer).await;
        assert!(
            early.is_err(),
            "the answer ended before its outcome was written"
        );
        assert_eq!(up.seen().len(), 1);
        release.notify_one();
        let body = answer.await.unwrap();
        assert!(body.contains("choices"), "{body}");
    }
}
