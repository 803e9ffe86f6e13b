//! A real kernel with a memory audit sink and a gateway bound to a turn,
//! for the egress tests; the mock model is `sharedos_egress::mock`.
#![allow(dead_code)]

mod ca;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::json;
use sharedos_egress::{
    EgressEvent, Gateway, GatewayLimits, NetworkRoutes, ServeHandle, TurnBinding,
};
use sharedos_kernel::{AuditRecord, ConfigGrantSource, Grant, Kernel, MemoryAuditSink, TurnKernel};
use sharedos_protocol::{AccessContext, Address, Identifier, Purpose, Timestamp};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};

pub use sharedos_egress::mock::{MockModel, MockOptions, Reply};

#[allow(unused_imports)]
pub use ca::test_ca;

pub const REAL_KEY: &str = "sk-real-4f1c9e0b7d2a";
pub const PLACEHOLDER: &str = "sk-placeholder";

fn ident(s: &str) -> Identifier {
    Identifier::new(s).unwrap()
}

pub fn context(agent: &str) -> AccessContext {
    AccessContext {
        namespace_id: ident("tenant-1"),
        actor: Address::Agent {
            agent_id: ident(agent),
        },
        authority: Address::Service {
            service_id: ident("host"),
        },
        owner: Address::Human {
            user_id: ident("olivia"),
        },
        purpose: Purpose::new("testing").unwrap(),
        trace_id: ident("trace-1"),
        enabled_tool_namespaces: vec![],
        now: Timestamp::parse("2026-01-01T00:00:00Z").unwrap(),
    }
}

/// A grant to `agent` of `egress` / `[path]` / `action`.
pub fn egress_grant(agent: &str, path: &str, action: &str, max_uses: Option<u64>) -> Grant {
    serde_json::from_value(json!({
        "id": format!("egress-{agent}-{path}"),
        "subject": {"kind": "agent", "agentId": agent},
        "issuer": {"kind": "service", "serviceId": "host"},
        "namespaceId": "tenant-1",
        "maxUses": max_uses,
        "capabilities": [{"namespace": "egress", "path": [path], "scope": "exact", "actions": [action]}],
    }))
    .unwrap()
}

/// A gateway serving a fresh loopback listener for one turn of `agent`.
pub struct Served {
    pub addr: std::net::SocketAddr,
    pub audit: Arc<MemoryAuditSink>,
    pub events: mpsc::UnboundedReceiver<EgressEvent>,
    pub _handle: ServeHandle,
}

impl Served {
    pub fn records(&self, kind: &str) -> Vec<AuditRecord> {
        self.audit
            .records()
            .into_iter()
            .filter(|r| r.kind == kind)
            .collect()
    }
    pub fn drain_events(&mut self) -> Vec<EgressEvent> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }
}

pub async fn serve(
    policy: serde_json::Value,
    grants: Vec<Grant>,
    agent: &str,
    limits: GatewayLimits,
) -> Served {
    let policy: NetworkRoutes = serde_json::from_value(policy).unwrap();
    let gateway = Arc::new(Gateway::from_policy(&policy, limits).unwrap());
    let audit = Arc::new(MemoryAuditSink::new());
    let kernel =
        Arc::new(Kernel::builder(Arc::new(ConfigGrantSource::new(grants)), audit.clone()).build());
    let ctx = context(agent);
    let turn = kernel.open_turn(&ctx).await.unwrap();
    let (tx, events) = mpsc::unbounded_channel();
    let binding = Arc::new(TurnBinding::new(turn, ctx, tx));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handle = gateway.serve(listener, binding);
    Served {
        addr,
        audit,
        events,
        _handle: handle,
    }
}

/// One HTTP/1.1 request to the gateway, as a plugin would send it.
pub async fn post(addr: std::net::SocketAddr, path: &str, body: &str) -> (u16, String) {
    let (status, mut resp) = open(addr, path, body.to_owned()).await;
    let bytes = (&mut resp)
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Sends a request and returns the status and the still-streaming body.
pub async fn open(addr: std::net::SocketAddr, path: &str, body: String) -> (u16, Incoming) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::post(path)
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {PLACEHOLDER}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    (resp.status().as_u16(), resp.into_body())
}

/// A secret file holding the real key.
pub fn key_file(dir: &Path) -> String {
    let p = dir.join("key");
    std::fs::write(&p, REAL_KEY).unwrap();
    format!("file:{}", p.display())
}

/// A mock model answering every request with a JSON body reporting
/// OpenAI usage (11 input, 7 output tokens).
pub async fn json_upstream(tls: Option<tokio_rustls::TlsAcceptor>) -> MockModel {
    let body = json!({"choices": [{"message": {"content": "hi"}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7}});
    let options = MockOptions {
        tls,
        on_request: None,
    };
    MockModel::start_with(vec![Reply::Json(body)], options)
        .await
        .unwrap()
}

/// A mock model streaming one SSE event at once and the rest (usage 3+2,
/// `[DONE]`) only once `release` is notified.
pub async fn sse_upstream(release: Arc<Notify>) -> MockModel {
    let first = "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n".to_owned();
    let last = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n".to_owned();
    let reply = Reply::Gated {
        before: vec![first],
        gate: release,
        after: vec![last],
    };
    MockModel::start(vec![reply]).await.unwrap()
}
