//! Mock upstreams on the host's loopback, a real kernel with a memory
//! audit sink, and a gateway bound to a turn, for the egress tests.
#![allow(dead_code)]

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use sharedos_host::egress::{
    EgressEvent, Gateway, GatewayLimits, NetworkRoutes, ServeHandle, TurnBinding,
};
use sharedos_kernel::{AuditRecord, ConfigGrantSource, Grant, Kernel, MemoryAuditSink, TurnKernel};
use sharedos_protocol::{AccessContext, Address, Identifier, Purpose, Timestamp};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};

pub const REAL_KEY: &str = "sk-real-4f1c9e0b7d2a";
pub const PLACEHOLDER: &str = "sk-placeholder";

/// What the upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub authorization: Option<String>,
    pub api_key: Option<String>,
    pub body: Vec<u8>,
}

/// How the mock upstream answers.
#[derive(Clone)]
pub enum Script {
    /// A JSON body with OpenAI usage.
    Json,
    /// Two SSE events; the second only after `release` is notified.
    Sse { release: Arc<Notify> },
}

pub struct Upstream {
    pub port: u16,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

type Body = BoxBody<Bytes, Infallible>;

async fn answer(
    req: Request<Incoming>,
    script: Script,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> Response<Body> {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let (authorization, api_key) = (header("authorization"), header("x-api-key"));
    let path = req.uri().path().to_owned();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    seen.lock().unwrap().push(Seen {
        path,
        authorization,
        api_key,
        body,
    });
    match script {
        Script::Json => {
            let body = json!({"choices": [{"message": {"content": "hi"}}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7}});
            Response::new(Full::new(Bytes::from(body.to_string())).boxed())
        }
        Script::Sse { release } => {
            let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            tokio::spawn(async move {
                let first = "data: {\"choices\":[{\"delta\":{\"content\":\"he\"}}]}\n\n";
                let _ = tx.send(Ok(Frame::data(Bytes::from(first)))).await;
                release.notified().await;
                let last = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
                let _ = tx.send(Ok(Frame::data(Bytes::from(last)))).await;
            });
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|i| (i, rx))
            });
            let mut resp = Response::new(StreamBody::new(stream).boxed());
            resp.headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            resp
        }
    }
}

/// A mock model server on 127.0.0.1; with `tls`, served with `tls`'s
/// certificate.
pub async fn upstream(script: Script, tls: Option<tokio_rustls::TlsAcceptor>) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (script, seen, tls) = (script.clone(), Arc::clone(&seen2), tls.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let (script, seen) = (script.clone(), Arc::clone(&seen));
                    async move { Ok::<_, Infallible>(answer(req, script, seen).await) }
                });
                let http = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(tcp).await {
                            let _ = http.serve_connection(TokioIo::new(s), svc).await;
                        }
                    }
                    None => {
                        let _ = http.serve_connection(TokioIo::new(tcp), svc).await;
                    }
                }
            });
        }
    });
    Upstream { port, seen }
}

/// A test CA and a `localhost` certificate it signed: the acceptor for
/// the upstream, and the CA's PEM written to `dir/ca.pem`.
pub fn test_ca(dir: &Path) -> (tokio_rustls::TlsAcceptor, std::path::PathBuf) {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, rcgen::KeyPair::generate().unwrap())
        .unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der().clone()], key)
    .unwrap();
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca_path)
}

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
    let lease = kernel.open_turn_authority(&ctx).await.unwrap();
    let (tx, events) = mpsc::unbounded_channel();
    let binding = Arc::new(TurnBinding::new(kernel, lease, ctx, tx));
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
