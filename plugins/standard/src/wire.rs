//! What a model API's wire is to the driver loop: the interface each of
//! the four APIs implements ([`ModelApi`]) and the values they exchange
//! with the loop in `model.rs`. It lives apart from the loop so the APIs
//! and the loop that picks among them do not import each other.

use serde_json::{Map, Value};

/// One tool of the catalogue as the model sees it.
pub struct ToolSpec {
    /// The function name (`.` written `__`, which function names may not
    /// hold).
    pub name: String,
    pub description: String,
    /// The tool's input JSON Schema, an object schema.
    pub schema: Value,
}

/// One tool call the model made.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Call {
    /// The API's id for it, echoed with its result.
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them (JSON text, in fragments).
    pub arguments: String,
    /// A namespace the model put the function in (Codex-style Responses
    /// calls carry one).
    pub namespace: Option<String>,
}

/// What one streamed answer said.
#[derive(Debug, Default)]
pub struct Answer {
    pub text: String,
    pub calls: Vec<Call>,
    pub finish: Option<String>,
    /// The answer's usage, as the API reports it (later reports win).
    pub usage: Map<String, Value>,
    /// The API's own end of the answer was seen.
    pub done: bool,
}

/// One model API's wire.
pub trait ModelApi: Send {
    /// The path under the base URL, the headers and the body of the next
    /// request, for the conversation so far.
    fn request(&self, model: &str, key: &str) -> (String, Vec<(&'static str, String)>, Value);
    /// Reads one streamed event's `data` into the answer; returns the
    /// text it added. `Err` is a code and a message.
    fn absorb(&mut self, data: &str, answer: &mut Answer) -> Result<String, String>;
    /// The stream ended (the body's end, not an error). An API whose
    /// stream has no end event of its own (Gemini's) marks the answer
    /// done here once it has seen its finish; the others need nothing.
    fn stream_ended(&mut self, _answer: &mut Answer) {}
    /// Keeps the answer (with its calls) as the model's turn.
    fn record_answer(&mut self, answer: &Answer);
    /// Keeps the result of one of the answer's calls (`ok`: it
    /// succeeded).
    fn record_result(&mut self, call: &Call, content: String, ok: bool);
}
