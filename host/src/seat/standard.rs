//! The standard runtime's table: the model driver (`driver`, passed as
//! `--driver <kind> --base-url <url> --model <model>`) checked at load,
//! and the arguments the seat passes for it.

use serde::{Deserialize, Serialize};

use crate::limits::MAX_TOKENS_RANGE;

/// A model driver of the standard runtime, passed as
/// `--driver <kind> --base-url <url> --model <model>`; the plugin gets a
/// placeholder key only (`SHAREDOS_MODEL_KEY`), the gateway adds the real
/// one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModelDriver {
    /// `openai-chat`, `openai-responses`, `anthropic-messages` or
    /// `gemini-generate-content`.
    pub kind: String,
    /// The gateway's route as the plugin sees it,
    /// `http://127.0.0.1:<port>/<route>`.
    pub base_url: String,
    pub model: String,
    /// `anthropic-messages`: the API's `max_tokens`, absent 4096;
    /// `gemini-generate-content`: `generationConfig.maxOutputTokens`,
    /// absent not sent; 1..=131072 (passed as `--max-tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
}

/// The kinds `sharedos-standard --driver` takes (its `DriverKind`).
pub const DRIVER_KINDS: [&str; 4] = [
    "openai-chat",
    "openai-responses",
    "anthropic-messages",
    "gemini-generate-content",
];

/// The kinds that take `maxTokens`.
const MAX_TOKENS_KINDS: [&str; 2] = ["anthropic-messages", "gemini-generate-content"];

/// Whether a Gemini model can be the path segment `models/<model>:...`
/// (the standard runtime's `gemini::model_id_ok`).
fn gemini_model_ok(model: &str) -> bool {
    model.bytes().any(|b| b.is_ascii_alphanumeric())
        && model
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl ModelDriver {
    /// What the seat passes the plugin for this driver:
    /// `--driver <kind> --base-url <url> --model <model>`, and
    /// `--max-tokens <n>` when set.
    pub(crate) fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--driver".into(),
            self.kind.clone(),
            "--base-url".into(),
            self.base_url.clone(),
            "--model".into(),
            self.model.clone(),
        ];
        if let Some(n) = self.max_tokens {
            args.extend(["--max-tokens".into(), n.to_string()]);
        }
        args
    }

    pub(crate) fn check(
        &self,
        entry: &str,
        network: &sharedos_egress::NetworkPolicy,
    ) -> Result<(), String> {
        if !DRIVER_KINDS.contains(&self.kind.as_str()) {
            return Err(format!(
                "{entry}.driver.kind: {:?} is not a driver kind (one of {})",
                self.kind,
                DRIVER_KINDS.map(|k| format!("{k:?}")).join(", ")
            ));
        }
        if !self.base_url.starts_with("http://") {
            return Err(format!(
                "{entry}.driver.baseUrl: must be the gateway's http:// route (the host adds TLS)"
            ));
        }
        if self.model.trim().is_empty() {
            return Err(format!("{entry}.driver.model: must name the model"));
        }
        if self.kind == "gemini-generate-content" && !gemini_model_ok(&self.model) {
            return Err(format!(
                "{entry}.driver.model: {:?} must be a plain Gemini model id such as \
                 \"gemini-2.5-flash\" (letters, digits, '.', '_', '-'; no \"models/\" prefix)",
                self.model
            ));
        }
        if let Some(n) = self.max_tokens {
            if !MAX_TOKENS_KINDS.contains(&self.kind.as_str()) {
                return Err(format!(
                    "{entry}.driver.maxTokens: applies to kinds \"anthropic-messages\" and \"gemini-generate-content\" only; remove it"
                ));
            }
            if !MAX_TOKENS_RANGE.contains(&n) {
                return Err(format!(
                    "{entry}.driver.maxTokens: must be {}..={}, got {n}",
                    MAX_TOKENS_RANGE.start(),
                    MAX_TOKENS_RANGE.end()
                ));
            }
        }
        if *network == sharedos_egress::NetworkPolicy::None {
            return Err(format!(
                "{entry}.driver: a model driver needs a route; set {entry}.network"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ModelDriver;

    #[test]
    fn the_seat_passes_the_driver_as_the_standard_runtime_reads_it() {
        let mut d = ModelDriver {
            kind: "anthropic-messages".into(),
            base_url: "http://127.0.0.1:9/model".into(),
            model: "m".into(),
            max_tokens: None,
        };
        let plain = [
            "--driver",
            "anthropic-messages",
            "--base-url",
            "http://127.0.0.1:9/model",
            "--model",
            "m",
        ];
        assert_eq!(d.args(), plain);
        d.max_tokens = Some(512);
        let mut with = plain.to_vec();
        with.extend(["--max-tokens", "512"]);
        assert_eq!(d.args(), with);
    }
}
