use super::*;

fn tool(name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("{name} does it"),
        schema: json!({"type": "object", "additionalProperties": false,
            "properties": {"path": {"type": "string"}}}),
    }
}

fn absorb_all(api: &mut GeminiApi, chunks: &[Value]) -> (Answer, String) {
    let mut a = Answer::default();
    let mut shown = String::new();
    for c in chunks {
        shown.push_str(&api.absorb(&c.to_string(), &mut a).unwrap());
    }
    api.stream_ended(&mut a);
    (a, shown)
}

#[test]
fn the_request_names_the_model_in_the_path_and_offers_the_catalogue() {
    let api = GeminiApi::new("hi".into(), vec![tool("files__write")], Some(512));
    let (path, headers, body) = api.request("gemini-2.5-flash", "placeholder");
    assert_eq!(
        path,
        "/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    assert_eq!(headers, vec![("x-goog-api-key", "placeholder".to_owned())]);
    assert_eq!(
        body["contents"],
        json!([{"role": "user", "parts": [{"text": "hi"}]}])
    );
    let declared = &body["tools"][0]["functionDeclarations"][0];
    assert_eq!(declared["name"], "files__write");
    assert_eq!(declared["description"], "files__write does it");
    // The JSON Schema as it is, `additionalProperties` included.
    assert_eq!(
        declared["parametersJsonSchema"]["additionalProperties"],
        false
    );
    assert_eq!(body["generationConfig"]["maxOutputTokens"], 512);

    // No catalogue, no limit: neither key is sent.
    let (_, _, body) = GeminiApi::new("hi".into(), vec![], None).request("m", "k");
    assert!(body.get("tools").is_none() && body.get("generationConfig").is_none());
}

#[test]
fn reads_text_thoughts_calls_usage_and_ends_with_the_stream_after_a_finish() {
    let mut api = GeminiApi::new("hi".into(), vec![tool("files__read")], None);
    let chunks = [
        json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "planning", "thought": true}, {"text": "Let "}]}}],
            "usageMetadata": {"promptTokenCount": 9}}),
        json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "me."}]}}]}),
        json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "files__read", "args": {"path": "a"}}, "thoughtSignature": "c2ln"},
            {"functionCall": {"name": "files__read", "args": {"path": "b"}, "id": "api-7"}}]},
            "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 20,
                "thoughtsTokenCount": 5, "totalTokenCount": 34}}),
    ];
    let (a, shown) = absorb_all(&mut api, &chunks);
    assert_eq!(shown, "Let me.");
    assert_eq!(a.text, "Let me.");
    assert!(a.done);
    assert_eq!(a.finish.as_deref(), Some("STOP"));
    assert_eq!(a.usage["input_tokens"], 9);
    assert_eq!(a.usage["output_tokens"], 25);
    assert_eq!(a.usage["total_tokens"], 34);
    assert_eq!(a.calls.len(), 2);
    assert_eq!(a.calls[0].name, "files__read");
    assert_eq!(a.calls[0].arguments, r#"{"path":"a"}"#);
    // A synthetic id for the call without one; the API's id kept.
    assert_eq!(a.calls[0].id, "gemini_call_1");
    assert_eq!(a.calls[1].id, "api-7");

    api.record_answer(&a);
    api.record_result(
        &a.calls[0],
        r#"{"status":"succeeded","output":1}"#.into(),
        true,
    );
    api.record_result(&a.calls[1], "not json".into(), false);
    let (_, _, body) = api.request("m", "k");
    let contents = body["contents"].as_array().unwrap();
    assert_eq!(contents.len(), 3);
    // The model's turn as it came: the thought, the text joined, the
    // calls with their signature.
    let parts = contents[1]["parts"].as_array().unwrap();
    assert_eq!(contents[1]["role"], "model");
    assert_eq!(parts[0]["thought"], true);
    assert_eq!(parts[1], json!({"text": "Let me."}));
    assert_eq!(parts[2]["thoughtSignature"], "c2ln");
    // Both results in one user turn, by name; the synthetic id stays here.
    assert_eq!(contents[2]["role"], "user");
    let results = contents[2]["parts"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    let first = &results[0]["functionResponse"];
    assert_eq!(first["name"], "files__read");
    assert!(first.get("id").is_none(), "{first}");
    assert_eq!(
        first["response"],
        json!({"status": "succeeded", "output": 1})
    );
    let second = &results[1]["functionResponse"];
    assert_eq!(second["id"], "api-7");
    assert_eq!(second["response"], json!({"output": "not json"}));
}

#[test]
fn a_stream_without_a_finish_is_not_done() {
    let mut api = GeminiApi::new("hi".into(), vec![], None);
    let chunk = json!({"candidates": [{"content": {"parts": [{"text": "Half"}]}}]});
    let (a, _) = absorb_all(&mut api, &[chunk]);
    assert!(!a.done);
}

#[test]
fn refusals_errors_and_broken_chunks_are_typed_failures() {
    let cases = [
        (
            json!({"promptFeedback": {"blockReason": "SAFETY"}}),
            "model_error: SAFETY: the model refused the prompt",
        ),
        (
            json!({"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "RECITATION"}]}),
            "model_error: RECITATION: the model stopped without an answer",
        ),
        (
            json!({"candidates": [{"finishReason": "MALFORMED_FUNCTION_CALL",
                "finishMessage": "bad call"}]}),
            "model_error: MALFORMED_FUNCTION_CALL",
        ),
        (
            json!({"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}),
            "model_error: UNAVAILABLE: overloaded",
        ),
        (
            json!({"candidates": [{"content": {"parts": [{"functionCall": {"args": {}}}]}}]}),
            "model_stream_invalid: a functionCall without a name",
        ),
        (json!([1, 2]), "model_stream_invalid"),
    ];
    for (chunk, expected) in cases {
        let mut api = GeminiApi::new("hi".into(), vec![], None);
        let err = api
            .absorb(&chunk.to_string(), &mut Answer::default())
            .unwrap_err();
        assert!(err.starts_with(expected), "{chunk}: {err}");
    }
    let mut api = GeminiApi::new("hi".into(), vec![], None);
    let err = api.absorb("{not json", &mut Answer::default()).unwrap_err();
    assert!(err.starts_with("model_stream_invalid"), "{err}");
    // MAX_TOKENS is an answer, cut short: it completes.
    let chunk = json!({"candidates": [{"content": {"parts": [{"text": "so"}]}, "finishReason": "MAX_TOKENS"}]});
    let (a, _) = absorb_all(&mut api, &[chunk]);
    assert!(a.done);
    assert_eq!(a.finish.as_deref(), Some("MAX_TOKENS"));
}

#[test]
fn model_ids_are_one_plain_path_segment() {
    for ok in ["gemini-2.5-flash", "gemini-2.0-flash-001", "test_model"] {
        assert!(model_id_ok(ok), "{ok}");
    }
    for bad in [
        "",
        "models/gemini-2.5-flash",
        "a:b",
        "..",
        "a b",
        "a?alt=json",
    ] {
        assert!(!model_id_ok(bad), "{bad}");
    }
}
