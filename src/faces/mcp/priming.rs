//! SSE priming events only for clients that can take them.
//!
//! rmcp starts every SSE stream with a priming event (an event id and a `retry:` with empty
//! data, SEP-1699, protocol 2025-11-25): a client that reconnects after a dropped stream resumes
//! from it. Clients of earlier protocol versions do not expect an event without data, and some
//! (the TypeScript SDK bundled in Gemini CLI) try to parse the empty data as JSON, fail, and lose
//! every tool of the session. So a client whose protocol version is before 2025-11-25 (from its
//! `MCP-Protocol-Version` header, or from its `initialize`) gets its SSE streams without events
//! whose data is empty; later clients keep them and can resume.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, BodyDataStream, Bytes};
use axum::extract::Request;
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;

/// The first protocol version whose clients expect priming events.
const PRIMING_SINCE: &str = "2025-11-25";

/// Largest `initialize` body read to learn its protocol version (rmcp's own limit applies after).
const MAX_INIT_BYTES: usize = 1 << 20;

/// The middleware: strip empty-data SSE events from responses to clients before 2025-11-25.
pub async fn strip_for_old_clients(req: Request, next: Next) -> Response {
    let (version, req) = protocol_version(req).await;
    let keeps = version.as_deref().is_some_and(|v| v >= PRIMING_SINCE);
    let resp = next.run(req).await;
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if keeps || !is_sse {
        return resp;
    }
    resp.map(|body| {
        Body::from_stream(Strip {
            inner: body.into_data_stream(),
        })
    })
}

/// The client's protocol version: the `MCP-Protocol-Version` header, else the `protocolVersion`
/// of an `initialize` in the body (read and put back).
async fn protocol_version(req: Request) -> (Option<String>, Request) {
    if let Some(v) = req
        .headers()
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
    {
        let v = v.trim().to_string();
        return (Some(v), req);
    }
    let small = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n <= MAX_INIT_BYTES);
    // Only a small body of known length is read here (an `initialize` is a few hundred bytes);
    // anything else goes to rmcp untouched, which enforces its own size limit (413).
    if req.method() != axum::http::Method::POST || !small {
        return (None, req);
    }
    let (parts, body) = req.into_parts();
    match axum::body::to_bytes(body, MAX_INIT_BYTES).await {
        Ok(bytes) => {
            let version = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .filter(|v| v["method"] == "initialize")
                .and_then(|v| v["params"]["protocolVersion"].as_str().map(String::from));
            (version, Request::from_parts(parts, Body::from(bytes)))
        }
        // A body that broke off: rmcp answers what is left.
        Err(_) => (None, Request::from_parts(parts, Body::empty())),
    }
}

/// The SSE body without events whose data is empty (keep-alive comments and every event with
/// data pass unchanged). rmcp's SSE encoder writes each event as one frame.
struct Strip {
    inner: BodyDataStream,
}

impl futures_core::Stream for Strip {
    type Item = Result<Bytes, axum::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match Pin::new(&mut self.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let kept = without_empty_events(&frame);
                    if !kept.is_empty() {
                        return Poll::Ready(Some(Ok(kept)));
                    }
                }
                other => return other,
            }
        }
    }
}

/// `frame` without its events that have `data:` lines, all empty.
fn without_empty_events(frame: &Bytes) -> Bytes {
    let Ok(text) = std::str::from_utf8(frame) else {
        return frame.clone();
    };
    let mut out = String::with_capacity(text.len());
    let mut dropped = false;
    for event in text.split_inclusive("\n\n") {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .collect();
        if !data.is_empty() && data.iter().all(|d| d.trim().is_empty()) {
            dropped = true;
        } else {
            out.push_str(event);
        }
    }
    if dropped {
        Bytes::from(out)
    } else {
        frame.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_events_with_empty_data_are_dropped() {
        let priming = Bytes::from("id: 0\nretry: 3000\ndata:\n\n");
        assert!(without_empty_events(&priming).is_empty());
        let message = Bytes::from("data: {\"jsonrpc\":\"2.0\"}\nid: 1\n\n");
        assert_eq!(without_empty_events(&message), message);
        let keep_alive = Bytes::from(":\n\n");
        assert_eq!(without_empty_events(&keep_alive), keep_alive);
        let both = Bytes::from("data:\nid: 0\nretry: 3000\n\ndata: {}\nid: 1\n\n");
        assert_eq!(
            without_empty_events(&both),
            Bytes::from("data: {}\nid: 1\n\n")
        );
    }
}
