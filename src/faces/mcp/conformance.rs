//! Fixture tools, resources and prompts of the official MCP conformance suite
//! (`@modelcontextprotocol/conformance`, server scenarios), served only by the `rsim-conformance`
//! test binary (`enable_conformance_fixtures`), so the suite's scenarios exercise this server for
//! real (as the SDKs' own CI does).
//! Names and contents are the ones the scenarios ask for.
#![allow(deprecated)] // logging and sampling are deprecated for 2026-07-28 but tested for 2025-xx

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::*;
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskExit, TaskManager, TaskOptions};
use rmcp::{ErrorData as McpError, RoleServer};
use serde_json::{Value, json};

/// A 1×1 red PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// An empty 8 kHz mono WAV.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=";

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(JsonObject::new()),
    }
}

fn no_args() -> Arc<JsonObject> {
    schema(json!({"type": "object", "properties": {}}))
}

fn tool(name: &'static str, description: &'static str, input: Arc<JsonObject>) -> Tool {
    Tool::new_with_raw(name, Some(description.into()), input)
}

pub fn tools() -> Vec<Tool> {
    let string_arg = |arg: &str, d: &str| {
        schema(
            json!({"type": "object", "properties": {arg: {"type": "string", "description": d}}, "required": [arg]}),
        )
    };
    vec![
        tool("test_simple_text", "Returns simple text", no_args()),
        tool("test_image_content", "Returns an image", no_args()),
        tool("test_audio_content", "Returns audio", no_args()),
        tool(
            "test_embedded_resource",
            "Returns an embedded resource",
            no_args(),
        ),
        tool(
            "test_multiple_content_types",
            "Returns text, image and resource",
            no_args(),
        ),
        tool(
            "test_tool_with_logging",
            "Sends three log messages",
            no_args(),
        ),
        tool(
            "test_tool_with_progress",
            "Reports progress 0, 50, 100 of 100",
            no_args(),
        ),
        tool("test_error_handling", "Always fails", no_args()),
        tool(
            "test_sampling",
            "Asks the client's LLM",
            string_arg("prompt", "The prompt to send to the LLM"),
        ),
        tool(
            "test_elicitation",
            "Asks the user",
            string_arg("message", "The message to show the user"),
        ),
        tool(
            "test_elicitation_sep1034_defaults",
            "Elicitation with defaults for every primitive type",
            no_args(),
        ),
        tool(
            "test_elicitation_sep1330_enums",
            "Elicitation with every enum variant",
            no_args(),
        ),
        tool(
            "greet",
            "Says hello (synchronous)",
            string_arg("name", "Who to greet"),
        ),
        tool(
            "slow_compute",
            "Sleeps `seconds` then answers; a task for clients with the tasks extension",
            schema(
                json!({"type": "object", "properties": {"seconds": {"type": "number"}, "label": {"type": "string"}}}),
            ),
        ),
        tool("failing_job", "A task that ends in a tool error", no_args()),
        tool(
            "protocol_error_job",
            "A task that ends in a protocol error",
            no_args(),
        ),
        tool(
            "confirm_delete",
            "A task that asks the user to confirm (elicitation input request)",
            schema(json!({"type": "object", "properties": {"filename": {"type": "string"}}})),
        ),
        tool(
            "multi_input",
            "A task that asks two questions at once",
            no_args(),
        ),
        tool(
            "test_custom_header",
            "Echoes a parameter that is mirrored into the Mcp-Param-Region header (SEP-2243)",
            schema(
                json!({"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}, "required": ["region"]}),
            ),
        ),
        tool(
            "json_schema_2020_12_tool",
            "Tool with JSON Schema 2020-12 features",
            schema(json!({
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "$defs": {"address": {"$anchor": "addressDef", "type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
                "properties": {
                    "name": {"type": "string"},
                    "address": {"$ref": "#/$defs/address"},
                    "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                    "phone": {"type": "string"},
                    "email": {"type": "string"}
                },
                "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
                "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
                "then": {"required": ["phone"]},
                "else": {"required": ["email"]},
                "additionalProperties": false
            })),
        ),
    ]
}

fn text(s: impl Into<String>) -> CallToolResult {
    CallToolResult::success(vec![ContentBlock::text(s)])
}

async fn elicit(
    ctx: &RequestContext<RoleServer>,
    params: Value,
) -> Result<CallToolResult, McpError> {
    let p: ElicitRequestParams = serde_json::from_value(params)
        .map_err(|e| McpError::internal_error(format!("elicitation request: {e}"), None))?;
    match ctx.peer.create_elicitation(p).await {
        Ok(r) => {
            let v = serde_json::to_value(&r).unwrap_or(Value::Null);
            Ok(text(format!(
                "Elicitation completed: action={}, content={}",
                v["action"].as_str().unwrap_or("?"),
                v.get("content").cloned().unwrap_or(Value::Null)
            )))
        }
        Err(e) => Ok(CallToolResult::error(vec![ContentBlock::text(format!(
            "elicitation failed: {e}"
        ))])),
    }
}

fn confirm_request(message: &str) -> Result<InputRequest, TaskExit> {
    serde_json::from_value(json!({
        "method": "elicitation/create",
        "params": {"message": message, "requestedSchema": {"type": "object", "properties": {
            "confirm": {"type": "boolean", "description": "Confirm"}}, "required": ["confirm"]}}
    }))
    .map_err(|e| {
        TaskExit::Error(McpError::internal_error(
            format!("input request: {e}"),
            None,
        ))
    })
}

/// The first string under a key `name` anywhere in `v`.
fn find_name(v: &Value) -> Option<String> {
    match v {
        Value::Object(m) => m
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| m.values().find_map(find_name)),
        Value::Array(a) => a.iter().find_map(find_name),
        _ => None,
    }
}

/// The tasks-extension and input-required fixtures: tasks for clients that declared the extension, -32021 for others.
pub fn call_task(
    name: &str,
    request: &CallToolRequestParams,
    ctx: &RequestContext<RoleServer>,
    tasks: &TaskManager,
) -> Option<Result<CallToolResponse, McpError>> {
    if let Some(r) = mrtr_call(name, request, ctx) {
        return Some(r);
    }
    let args = request.arguments.clone().unwrap_or_default();
    if name == "greet" {
        let who = args.get("name").and_then(Value::as_str).unwrap_or("World");
        return Some(Ok(text(format!("Hello, {who}!")).into()));
    }
    if name == "test_tool_with_task" {
        let answered = request
            .input_responses
            .as_ref()
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null))
            .filter(|v| v.as_object().is_some_and(|m| !m.is_empty()));
        let Some(answer) = answered else {
            let r: Result<InputRequiredResult, _> = serde_json::from_value(json!({
                "resultType": "input_required",
                "inputRequests": {"user_name": {"method": "elicitation/create", "params": {
                    "message": "What is your name?",
                    "requestedSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
                }}}
            }));
            return Some(
                r.map(CallToolResponse::InputRequired)
                    .map_err(|e| McpError::internal_error(format!("input request: {e}"), None)),
            );
        };
        if !ctx
            .client_capabilities()
            .is_some_and(|c| c.supports_tasks())
        {
            return Some(Err(McpError::missing_required_client_capability(
                ClientCapabilities::builder().enable_tasks().build(),
            )));
        }
        let who = find_name(&answer).unwrap_or_else(|| answer.to_string());
        let task = tasks.spawn(TaskOptions::new().with_poll_interval_ms(100), move |_| {
            Box::pin(async move { Ok(text(format!("Hello, {who}! (gathered before the task)"))) })
        });
        return Some(Ok(CallToolResponse::Task(CreateTaskResult::new(task))));
    }
    if ![
        "slow_compute",
        "failing_job",
        "protocol_error_job",
        "confirm_delete",
        "multi_input",
    ]
    .contains(&name)
    {
        return None;
    }
    let seconds = args
        .get("seconds")
        .and_then(Value::as_f64)
        .unwrap_or(1.0)
        .clamp(0.0, 600.0);
    let label = args
        .get("label")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if name == "slow_compute" && seconds == 0.0 {
        return Some(Ok(text(format!("computed {label} immediately")).into()));
    }
    if !ctx
        .client_capabilities()
        .is_some_and(|c| c.supports_tasks())
    {
        return Some(Err(McpError::missing_required_client_capability(
            ClientCapabilities::builder().enable_tasks().build(),
        )));
    }
    let name = name.to_string();
    let filename = args
        .get("filename")
        .and_then(Value::as_str)
        .unwrap_or("file")
        .to_string();
    let task = tasks.spawn(TaskOptions::new().with_poll_interval_ms(100), move |tctx| {
        Box::pin(async move {
            match name.as_str() {
                "slow_compute" => tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs_f64(seconds)) => Ok(text(format!("computed {label} after {seconds} s"))),
                    _ = tctx.cancelled() => Err(TaskExit::Cancelled),
                },
                "failing_job" => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok(CallToolResult::error(vec![ContentBlock::text("the job failed (as designed)")]))
                }
                "protocol_error_job" => Err(TaskExit::Error(McpError::internal_error("protocol error (as designed)", None))),
                "confirm_delete" => {
                    let r = tctx.request_input("confirm", confirm_request(&format!("Delete {filename}?"))?).await?;
                    Ok(text(format!("confirm_delete {filename}: {r}")))
                }
                _ => {
                    let (a, b) = tokio::join!(
                        tctx.request_input("first", confirm_request("First question")?),
                        tctx.request_input("second", confirm_request("Second question")?),
                    );
                    Ok(text(format!("multi_input: {} {}", a?, b?)))
                }
            }
        })
    });
    Some(Ok(CallToolResponse::Task(CreateTaskResult::new(task))))
}

/// The fixture tool `name`, or None if it is not one.
pub async fn call(
    name: &str,
    request: &CallToolRequestParams,
    ctx: &RequestContext<RoleServer>,
) -> Option<Result<CallToolResult, McpError>> {
    let arg = |k: &str| {
        request
            .arguments
            .as_ref()
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let r = match name {
        "test_simple_text" => text("This is a simple text response for testing."),
        "test_image_content" => {
            CallToolResult::success(vec![ContentBlock::image(PNG, "image/png")])
        }
        "test_audio_content" => {
            CallToolResult::success(vec![ContentBlock::audio(WAV, "audio/wav")])
        }
        "test_embedded_resource" => CallToolResult::success(vec![ContentBlock::resource(
            ResourceContents::text(
                "This is an embedded resource content.",
                "test://embedded-resource",
            )
            .with_mime_type("text/plain"),
        )]),
        "test_multiple_content_types" => CallToolResult::success(vec![
            ContentBlock::text("Multiple content types test:"),
            ContentBlock::image(PNG, "image/png"),
            ContentBlock::resource(
                ResourceContents::text(
                    r#"{"test":"data","value":123}"#,
                    "test://mixed-content-resource",
                )
                .with_mime_type("application/json"),
            ),
        ]),
        "test_tool_with_logging" => {
            for (i, m) in [
                "Tool execution started",
                "Tool processing data",
                "Tool execution completed",
            ]
            .iter()
            .enumerate()
            {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let _ = ctx
                    .peer
                    .notify_logging_message(LoggingMessageNotificationParam::new(
                        LoggingLevel::Info,
                        json!(m),
                    ))
                    .await;
            }
            text("Tool with logging executed successfully")
        }
        "test_tool_with_progress" => {
            let token = ctx.meta.get_progress_token();
            for (i, p) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if let Some(t) = &token {
                    let _ = ctx
                        .peer
                        .notify_progress(
                            ProgressNotificationParam::new(t.clone(), p).with_total(100.0),
                        )
                        .await;
                }
            }
            text("Tool with progress executed successfully")
        }
        "test_error_handling" => CallToolResult::error(vec![ContentBlock::text(
            "This tool intentionally returns an error for testing",
        )]),
        "test_sampling" => {
            let p: Result<CreateMessageRequestParams, _> = serde_json::from_value(json!({
                "messages": [{"role": "user", "content": {"type": "text", "text": arg("prompt")}}],
                "maxTokens": 100
            }));
            match p {
                Err(e) => {
                    return Some(Err(McpError::internal_error(
                        format!("sampling request: {e}"),
                        None,
                    )));
                }
                Ok(p) => match ctx.peer.create_message(p).await {
                    Ok(r) => {
                        let v = serde_json::to_value(&r).unwrap_or(Value::Null);
                        let t = v["content"]["text"]
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| v["content"].to_string());
                        text(format!("LLM response: {t}"))
                    }
                    Err(e) => CallToolResult::error(vec![ContentBlock::text(format!(
                        "sampling failed: {e}"
                    ))]),
                },
            }
        }
        "test_elicitation" => {
            return Some(
                elicit(
                    ctx,
                    json!({"message": arg("message"), "requestedSchema": {"type": "object", "properties": {
                        "username": {"type": "string", "description": "User's response"},
                        "email": {"type": "string", "description": "User's email address"}
                    }, "required": ["username", "email"]}}),
                )
                .await,
            );
        }
        "test_elicitation_sep1034_defaults" => {
            return Some(
                elicit(
                    ctx,
                    json!({"message": "Please review and update the form fields with defaults", "requestedSchema": {"type": "object", "properties": {
                        "name": {"type": "string", "description": "User name", "default": "John Doe"},
                        "age": {"type": "integer", "description": "User age", "default": 30},
                        "score": {"type": "number", "description": "User score", "default": 95.5},
                        "status": {"type": "string", "description": "User status", "enum": ["active", "inactive", "pending"], "default": "active"},
                        "verified": {"type": "boolean", "description": "Verification status", "default": true}
                    }, "required": []}}),
                )
                .await,
            );
        }
        "test_elicitation_sep1330_enums" => {
            return Some(
                elicit(
                    ctx,
                    json!({"message": "Please select options from the enum fields", "requestedSchema": {"type": "object", "properties": {
                        "untitledSingle": {"type": "string", "description": "Select one option", "enum": ["option1", "option2", "option3"]},
                        "titledSingle": {"type": "string", "description": "Select one option with titles", "oneOf": [
                            {"const": "value1", "title": "First Option"}, {"const": "value2", "title": "Second Option"}, {"const": "value3", "title": "Third Option"}]},
                        "legacyEnum": {"type": "string", "description": "Select one option (legacy)", "enum": ["opt1", "opt2", "opt3"], "enumNames": ["Option One", "Option Two", "Option Three"]},
                        "untitledMulti": {"type": "array", "description": "Select multiple options", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                        "titledMulti": {"type": "array", "description": "Select multiple options with titles", "items": {"anyOf": [
                            {"const": "value1", "title": "First Choice"}, {"const": "value2", "title": "Second Choice"}, {"const": "value3", "title": "Third Choice"}]}}
                    }, "required": []}}),
                )
                .await,
            );
        }
        "test_custom_header" => text(format!("region: {}", arg("region"))),
        "json_schema_2020_12_tool" => text(format!(
            "received {}",
            Value::Object(request.arguments.clone().unwrap_or_default())
        )),
        _ => return None,
    };
    Some(Ok(r))
}

pub fn resources() -> Vec<Resource> {
    vec![
        Resource::new("test://static-text", "static-text")
            .with_description("A static text resource")
            .with_mime_type("text/plain"),
        Resource::new("test://static-binary", "static-binary")
            .with_description("A static binary resource (PNG)")
            .with_mime_type("image/png"),
        Resource::new("test://watched-resource", "watched-resource")
            .with_description("A resource clients may subscribe to")
            .with_mime_type("text/plain"),
    ]
}

pub fn resource_templates() -> Vec<ResourceTemplate> {
    vec![
        ResourceTemplate::new("test://template/{id}/data", "template-data")
            .with_description("Data for an id")
            .with_mime_type("application/json"),
    ]
}

/// The fixture resource `uri`, or None if it is not one.
pub fn read(uri: &str) -> Option<Result<ReadResourceResult, McpError>> {
    let c = match uri {
        "test://static-text" => {
            ResourceContents::text("This is the content of the static text resource.", uri)
                .with_mime_type("text/plain")
        }
        "test://static-binary" => ResourceContents::blob(PNG, uri).with_mime_type("image/png"),
        "test://watched-resource" => {
            ResourceContents::text("Watched resource content.", uri).with_mime_type("text/plain")
        }
        _ => {
            let id = uri
                .strip_prefix("test://template/")?
                .strip_suffix("/data")?;
            ResourceContents::text(
                json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")})
                    .to_string(),
                uri,
            )
            .with_mime_type("application/json")
        }
    };
    Some(Ok(ReadResourceResult::new(vec![c])))
}

pub fn prompts() -> Vec<Prompt> {
    let arg = |n: &str, d: &str| {
        let mut a = PromptArgument::new(n);
        a.description = Some(d.to_string());
        a.required = Some(true);
        a
    };
    vec![
        Prompt::new(
            "test_simple_prompt",
            Some("A simple prompt without arguments"),
            None,
        ),
        Prompt::new(
            "test_prompt_with_arguments",
            Some("A prompt with arguments"),
            Some(vec![
                arg("arg1", "First test argument"),
                arg("arg2", "Second test argument"),
            ]),
        ),
        Prompt::new(
            "test_prompt_with_embedded_resource",
            Some("A prompt with an embedded resource"),
            Some(vec![arg("resourceUri", "URI of the resource to embed")]),
        ),
        Prompt::new(
            "test_prompt_with_image",
            Some("A prompt with an image"),
            None::<Vec<PromptArgument>>,
        ),
    ]
}

/// The fixture prompt, or None if it is not one.
pub fn prompt(request: &GetPromptRequestParams) -> Option<Result<GetPromptResult, McpError>> {
    let arg = |k: &str| {
        request
            .arguments
            .as_ref()
            .and_then(|a| a.get(k))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let user = || rmcp::model::Role::User;
    let messages = match request.name.as_str() {
        "test_simple_prompt" => vec![PromptMessage::new_text(
            user(),
            "This is a simple prompt for testing.",
        )],
        "test_prompt_with_arguments" => vec![PromptMessage::new_text(
            user(),
            format!(
                "Prompt with arguments: arg1='{}', arg2='{}'",
                arg("arg1"),
                arg("arg2")
            ),
        )],
        "test_prompt_with_embedded_resource" => vec![
            PromptMessage::new(
                user(),
                ContentBlock::resource(
                    ResourceContents::text(
                        "Embedded resource content for testing.",
                        arg("resourceUri"),
                    )
                    .with_mime_type("text/plain"),
                ),
            ),
            PromptMessage::new_text(user(), "Please process the embedded resource above."),
        ],
        "test_prompt_with_image" => vec![
            PromptMessage::new(user(), ContentBlock::image(PNG, "image/png")),
            PromptMessage::new_text(user(), "Please analyze the image above."),
        ],
        _ => return None,
    };
    Some(Ok(GetPromptResult::new(messages)))
}

/// `completion/complete` for the fixture prompt's arguments.
pub fn complete(request: &CompleteRequestParams) -> CompleteResult {
    let v = &request.argument.value;
    let values: Vec<String> = ["paris", "park", "party"]
        .iter()
        .filter(|c| c.starts_with(v.as_str()))
        .map(|c| c.to_string())
        .collect();
    CompleteResult::new(CompletionInfo::new(values).unwrap_or_default())
}

/// Capabilities the fixtures need on top of the server's own.
pub fn capabilities(caps: &mut ServerCapabilities) {
    caps.logging = Some(JsonObject::new());
    caps.completions = Some(JsonObject::new());
    if let Some(r) = caps.resources.as_mut() {
        r.subscribe = Some(true);
    }
}

// ---------------------------------------------------------------- input-required results (SEP-2322)

/// The MRTR fixture tools.
pub fn mrtr_tools() -> Vec<Tool> {
    [
        "test_input_required_result_elicitation",
        "test_input_required_result_sampling",
        "test_input_required_result_list_roots",
        "test_input_required_result_multiple_inputs",
        "test_input_required_result_request_state",
        "test_input_required_result_tampered_state",
        "test_input_required_result_multi_round",
        "test_input_required_result_capabilities",
        "test_missing_capability",
        "test_streaming_elicitation",
        "test_logging_tool",
    ]
    .into_iter()
    .map(|n| {
        tool(
            n,
            "Asks the client for input (InputRequiredResult), then completes",
            no_args(),
        )
    })
    .collect()
}

fn elicit_req(message: &str, field: &str, ty: &str) -> Value {
    json!({"method": "elicitation/create", "params": {"message": message, "requestedSchema": {
        "type": "object", "properties": {field: {"type": ty}}, "required": [field]}}})
}

fn sampling_req(text: &str, max: u32) -> Value {
    json!({"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": max}})
}

fn roots_req() -> Value {
    json!({"method": "roots/list", "params": {}})
}

/// A process-wide secret for signing request state.
fn state_key() -> &'static [u8; 32] {
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    KEY.get_or_init(rand::random)
}

/// Integrity-protected request state: `payload.sha256(key ‖ payload)`.
fn sign(payload: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(state_key());
    h.update(payload.as_bytes());
    format!("{payload}.{}", hex::encode(h.finalize()))
}

/// The payload of a signed state, or an error naming the tampering.
fn verify(state: Option<&str>) -> Result<Option<String>, McpError> {
    let Some(s) = state else { return Ok(None) };
    let (payload, _) = s
        .rsplit_once('.')
        .ok_or_else(|| McpError::invalid_params("requestState: integrity check failed", None))?;
    if sign(payload) != s {
        return Err(McpError::invalid_params(
            "requestState: integrity check failed (tampered)",
            None,
        ));
    }
    Ok(Some(payload.to_string()))
}

fn input_required(requests: Value, state: Option<&str>) -> Result<InputRequiredResult, McpError> {
    let mut v = json!({"resultType": "input_required", "inputRequests": requests});
    if let Some(s) = state {
        v["requestState"] = json!(sign(s));
    }
    serde_json::from_value(v)
        .map_err(|e| McpError::internal_error(format!("input request: {e}"), None))
}

fn responses_of(r: Option<&InputResponses>) -> serde_json::Map<String, Value> {
    match r.map(serde_json::to_value) {
        Some(Ok(Value::Object(m))) => m,
        _ => serde_json::Map::new(),
    }
}

fn sampled_text(v: &Value) -> String {
    v.pointer("/content/text")
        .or_else(|| v.pointer("/result/content/text"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// An MRTR fixture tool: Some(response) if `name` is one.
pub fn mrtr_call(
    name: &str,
    request: &CallToolRequestParams,
    ctx: &RequestContext<RoleServer>,
) -> Option<Result<CallToolResponse, McpError>> {
    let got = responses_of(request.input_responses.as_ref());
    let state = request.request_state.as_deref();
    let done = |t: String| Ok(CallToolResponse::Complete(text(t)));
    let ask = |reqs: Value, st: Option<&str>| {
        input_required(reqs, st).map(CallToolResponse::InputRequired)
    };
    let r = match name {
        "test_input_required_result_elicitation" => {
            match got.get("user_name").filter(|v| v.is_object()) {
                Some(v) => done(format!(
                    "Hello, {}!",
                    find_name(v).unwrap_or_else(|| v.to_string())
                )),
                None => ask(
                    json!({"user_name": elicit_req("What is your name?", "name", "string")}),
                    None,
                ),
            }
        }
        "test_input_required_result_sampling" => match got.get("capital_question") {
            Some(v) => done(format!("The model said: {}", sampled_text(v))),
            None => ask(
                json!({"capital_question": sampling_req("What is the capital of France?", 100)}),
                None,
            ),
        },
        "test_input_required_result_list_roots" => match got.get("client_roots") {
            Some(v) => done(format!("Client roots: {}", v.get("roots").unwrap_or(v))),
            None => ask(json!({"client_roots": roots_req()}), None),
        },
        "test_input_required_result_multiple_inputs" => {
            let all = ["user_name", "greeting", "client_roots"]
                .iter()
                .all(|k| got.contains_key(*k));
            match verify(state) {
                Err(e) => Err(e),
                Ok(Some(p)) if all && p == "multiple_inputs" => {
                    done("All inputs received: user_name, greeting, client_roots".into())
                }
                _ => ask(
                    json!({"user_name": elicit_req("What is your name?", "name", "string"),
                           "greeting": sampling_req("Generate a greeting", 50),
                           "client_roots": roots_req()}),
                    Some("multiple_inputs"),
                ),
            }
        }
        "test_input_required_result_request_state"
        | "test_input_required_result_tampered_state" => match verify(state) {
            Err(e) => Err(e),
            Ok(Some(p)) if got.contains_key("confirm") && p == name => {
                done("Confirmed: state-ok".into())
            }
            _ => ask(
                json!({"confirm": elicit_req("Please confirm", "ok", "boolean")}),
                Some(name),
            ),
        },
        "test_input_required_result_multi_round" => match verify(state) {
            Err(e) => Err(e),
            Ok(Some(p)) if p == "round-2" && got.contains_key("step2") => {
                done("Multi-round complete".into())
            }
            Ok(Some(p)) if p == "round-1" && got.contains_key("step1") => ask(
                json!({"step2": elicit_req("Step 2: What is your favorite color?", "color", "string")}),
                Some("round-2"),
            ),
            _ => ask(
                json!({"step1": elicit_req("Step 1: What is your name?", "name", "string")}),
                Some("round-1"),
            ),
        },
        // SEP-2575 diagnostics.
        "test_missing_capability" => {
            let has_sampling = ctx
                .meta
                .client_capabilities()
                .or_else(|| ctx.client_capabilities())
                .and_then(|c| serde_json::to_value(c).ok())
                .is_some_and(|c| c.get("sampling").is_some());
            if has_sampling {
                done("the client declared sampling".into())
            } else {
                match serde_json::from_value::<ClientCapabilities>(json!({"sampling": {}})) {
                    Ok(caps) => Err(McpError::missing_required_client_capability(caps)),
                    Err(e) => Err(McpError::internal_error(format!("capabilities: {e}"), None)),
                }
            }
        }
        "test_streaming_elicitation" => match got.get("answer") {
            Some(v) => done(format!("answered: {v}")),
            None => ask(
                json!({"answer": elicit_req("Anything to add?", "text", "string")}),
                None,
            ),
        },
        // Logs only when the request asked for them (it never does here).
        "test_logging_tool" => done("ran without logging (no logLevel in the request)".into()),
        "test_input_required_result_capabilities" => {
            if !got.is_empty() {
                done(format!(
                    "Received inputs: {}",
                    got.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            } else {
                let caps = ctx
                    .meta
                    .client_capabilities()
                    .or_else(|| ctx.client_capabilities())
                    .and_then(|c| serde_json::to_value(c).ok())
                    .unwrap_or(Value::Null);
                let mut reqs = serde_json::Map::new();
                if caps.get("sampling").is_some() {
                    reqs.insert("sample".into(), sampling_req("Say hello", 20));
                }
                if caps.get("elicitation").is_some() {
                    reqs.insert(
                        "ask".into(),
                        elicit_req("What is your name?", "name", "string"),
                    );
                }
                if caps.get("roots").is_some() {
                    reqs.insert("roots".into(), roots_req());
                }
                if reqs.is_empty() {
                    done("The client declared no capability to ask with".into())
                } else {
                    ask(Value::Object(reqs), None)
                }
            }
        }
        _ => return None,
    };
    Some(r)
}

/// The MRTR fixture prompt.
pub fn mrtr_prompt_def() -> Prompt {
    Prompt::new(
        "test_input_required_result_prompt",
        Some("A prompt that asks the client for context first"),
        None::<Vec<PromptArgument>>,
    )
}

pub fn mrtr_prompt(
    request: &GetPromptRequestParams,
) -> Option<Result<GetPromptResponse, McpError>> {
    if request.name != "test_input_required_result_prompt" {
        return None;
    }
    let got = responses_of(request.input_responses.as_ref());
    Some(match got.get("user_context") {
        Some(v) => Ok(GetPromptResponse::Complete(GetPromptResult::new(vec![PromptMessage::new_text(
            rmcp::model::Role::User,
            format!("Use this context: {}", v),
        )]))),
        None => input_required(
            json!({"user_context": elicit_req("What context should the prompt use?", "context", "string")}),
            None,
        )
        .map(GetPromptResponse::InputRequired),
    })
}
