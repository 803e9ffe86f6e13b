//! JSON-RPC error codes for protocol-level faults only (protocol.md B.6).
//!
//! Every decision about a tool call, every refusal included, is a
//! `ToolResult`; these codes are for the cases where the in-process call
//! would reject. `error.data.kind` is the stable machine contract.

use serde::{Deserialize, Serialize};

/// The numeric codes the host and SDKs use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcErrorCode {
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    Internal,
    Cancelled,
    UnsupportedProtocolVersion,
    NotInitialized,
    TurnNotActive,
    Overloaded,
    MessageTooLarge,
}

impl RpcErrorCode {
    pub const fn code(self) -> i32 {
        match self {
            RpcErrorCode::InvalidRequest => -32600,
            RpcErrorCode::MethodNotFound => -32601,
            RpcErrorCode::InvalidParams => -32602,
            RpcErrorCode::Internal => -32603,
            RpcErrorCode::Cancelled => -32800,
            RpcErrorCode::UnsupportedProtocolVersion => -32050,
            RpcErrorCode::NotInitialized => -32051,
            RpcErrorCode::TurnNotActive => -32052,
            RpcErrorCode::Overloaded => -32055,
            RpcErrorCode::MessageTooLarge => -32057,
        }
    }
    /// The kind a code stands for, for an error object without `data.kind`.
    pub const fn kind(self) -> ErrorKind {
        match self {
            RpcErrorCode::InvalidRequest => ErrorKind::InvalidRequest,
            RpcErrorCode::MethodNotFound => ErrorKind::MethodNotFound,
            RpcErrorCode::InvalidParams => ErrorKind::InvalidParams,
            RpcErrorCode::Internal => ErrorKind::Internal,
            RpcErrorCode::Cancelled => ErrorKind::Cancelled,
            RpcErrorCode::UnsupportedProtocolVersion => ErrorKind::UnsupportedProtocolVersion,
            RpcErrorCode::NotInitialized => ErrorKind::NotInitialized,
            RpcErrorCode::TurnNotActive => ErrorKind::TurnNotActive,
            RpcErrorCode::Overloaded => ErrorKind::Overloaded,
            RpcErrorCode::MessageTooLarge => ErrorKind::MessageTooLarge,
        }
    }
    pub fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            -32600 => RpcErrorCode::InvalidRequest,
            -32601 => RpcErrorCode::MethodNotFound,
            -32602 => RpcErrorCode::InvalidParams,
            -32603 => RpcErrorCode::Internal,
            -32800 => RpcErrorCode::Cancelled,
            -32050 => RpcErrorCode::UnsupportedProtocolVersion,
            -32051 => RpcErrorCode::NotInitialized,
            -32052 => RpcErrorCode::TurnNotActive,
            -32055 => RpcErrorCode::Overloaded,
            -32057 => RpcErrorCode::MessageTooLarge,
            _ => return None,
        })
    }
}

/// `error.data.kind`: what SDKs switch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    InvalidRequest,
    MethodNotFound,
    InvalidParams,
    Internal,
    AuditUnavailable,
    Cancelled,
    UnsupportedProtocolVersion,
    NotInitialized,
    TurnNotActive,
    Overloaded,
    MessageTooLarge,
}

impl ErrorKind {
    pub fn code(self) -> RpcErrorCode {
        match self {
            ErrorKind::InvalidRequest => RpcErrorCode::InvalidRequest,
            ErrorKind::MethodNotFound => RpcErrorCode::MethodNotFound,
            ErrorKind::InvalidParams => RpcErrorCode::InvalidParams,
            ErrorKind::Internal | ErrorKind::AuditUnavailable => RpcErrorCode::Internal,
            ErrorKind::Cancelled => RpcErrorCode::Cancelled,
            ErrorKind::UnsupportedProtocolVersion => RpcErrorCode::UnsupportedProtocolVersion,
            ErrorKind::NotInitialized => RpcErrorCode::NotInitialized,
            ErrorKind::TurnNotActive => RpcErrorCode::TurnNotActive,
            ErrorKind::Overloaded => RpcErrorCode::Overloaded,
            ErrorKind::MessageTooLarge => RpcErrorCode::MessageTooLarge,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::MethodNotFound => "method_not_found",
            ErrorKind::InvalidParams => "invalid_params",
            ErrorKind::Internal => "internal",
            ErrorKind::AuditUnavailable => "audit_unavailable",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::UnsupportedProtocolVersion => "unsupported_protocol_version",
            ErrorKind::NotInitialized => "not_initialized",
            ErrorKind::TurnNotActive => "turn_not_active",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::MessageTooLarge => "message_too_large",
        }
    }
    // Returns an Option (an unknown kind is not an error to report), so not `FromStr`.
    #[allow(clippy::should_implement_trait)]
    pub fn from_str(kind: &str) -> Option<Self> {
        serde_json::from_value(serde_json::Value::String(kind.to_owned())).ok()
    }
}
