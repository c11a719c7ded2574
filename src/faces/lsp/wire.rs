//! The LSP wire in front of tower-lsp-server: frames (`Content-Length` headers, then a body) are
//! read here, and only well-formed JSON-RPC messages are passed on. tower-lsp-server's own reader
//! stops for good at the first frame it cannot decode (its framed stream ends after an error), so
//! one malformed message from an editor would end the server; here it gets its JSON-RPC error
//! (parse error, invalid request, message too large) and the server keeps serving. Frames the
//! server writes are passed to the editor whole, interleaved with those errors.

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tower_lsp_server::jsonrpc;

/// The largest message accepted (an `rsim.toml` is kilobytes; documents past the server's own
/// bound are answered with a diagnostic, not kept).
pub const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// The longest header line.
const MAX_HEADER_LINE: usize = 8 << 10;

fn frame(body: &[u8]) -> Vec<u8> {
    let mut out = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    out.extend_from_slice(body);
    out
}

fn error_frame(id: Value, code: i64, message: &str) -> Vec<u8> {
    let v = json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}});
    frame(v.to_string().as_bytes())
}

/// What to do with one body an editor sent.
enum Verdict {
    Pass,
    Reply(Vec<u8>),
}

/// The most JSON values one message may hold: a document's text is one value however long, and
/// no request of the protocol needs more (decoded, a value costs some hundred bytes: a 64 MiB
/// frame of zeros was 3 GB).
pub const MAX_VALUES: usize = 1 << 19;

fn check(body: &[u8]) -> Verdict {
    // Counted before anything is decoded (not strict: the protocol's own readers decide the rest).
    let counted = std::str::from_utf8(body)
        .map_err(|e| format!("not UTF-8 (at byte {})", e.valid_up_to()))
        .and_then(|text| crate::util::json::check(text, MAX_VALUES, false));
    if let Err(why) = counted
        && why.contains("JSON values")
    {
        return Verdict::Reply(error_frame(
            Value::Null,
            -32700,
            &format!("parse error: {why}"),
        ));
    }
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Verdict::Reply(error_frame(
                Value::Null,
                -32700,
                &format!("parse error: the message is not JSON ({e})"),
            ));
        }
    };
    let is_request = serde_json::from_value::<jsonrpc::Request>(v.clone()).is_ok();
    let is_response = !is_request && serde_json::from_value::<jsonrpc::Response>(v.clone()).is_ok();
    if is_request || is_response {
        return Verdict::Pass;
    }
    let id = match v.get("id") {
        Some(id @ (Value::Number(_) | Value::String(_))) => id.clone(),
        _ => Value::Null,
    };
    Verdict::Reply(error_frame(
        id,
        -32600,
        "invalid request: expected a JSON-RPC 2.0 request, notification or response object",
    ))
}

/// Read one header block: Ok(Some(length)), Ok(None) at the end of input, Err(reason) for a
/// block without a usable `Content-Length` (the block is consumed).
async fn read_headers<R: AsyncRead + Unpin>(
    r: &mut BufReader<R>,
) -> std::io::Result<Option<Result<usize, String>>> {
    let mut length: Option<Result<usize, String>> = None;
    let mut any = false;
    loop {
        let mut line = Vec::new();
        let n = (&mut *r)
            .take(MAX_HEADER_LINE as u64)
            .read_until(b'\n', &mut line)
            .await?;
        if n == 0 {
            return Ok(None);
        }
        if !line.ends_with(b"\n") {
            // A header line too long: skip the rest of it.
            let mut rest = Vec::new();
            loop {
                rest.clear();
                let m = (&mut *r)
                    .take(MAX_HEADER_LINE as u64)
                    .read_until(b'\n', &mut rest)
                    .await?;
                if m == 0 || rest.ends_with(b"\n") {
                    break;
                }
            }
            length = Some(Err("a header line is too long".into()));
            any = true;
            continue;
        }
        let text = String::from_utf8_lossy(&line);
        let t = text.trim();
        if t.is_empty() {
            if !any {
                continue;
            }
            return Ok(Some(length.unwrap_or_else(|| {
                Err("a message without Content-Length".into())
            })));
        }
        any = true;
        if let Some((k, v)) = t.split_once(':')
            && k.trim().eq_ignore_ascii_case("content-length")
        {
            length = Some(
                v.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("Content-Length {:?} is not a length", v.trim())),
            );
        }
    }
}

/// Discard `n` bytes of input.
async fn skip<R: AsyncRead + Unpin>(r: &mut BufReader<R>, n: usize) -> std::io::Result<()> {
    let copied = tokio::io::copy(&mut (&mut *r).take(n as u64), &mut tokio::io::sink()).await?;
    if copied < n as u64 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Pass the editor's well-formed messages to `server_in`; answer the others on `out`.
pub async fn filter_input<R, W>(input: R, mut server_in: W, out: mpsc::Sender<Vec<u8>>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut r = BufReader::new(input);
    loop {
        let len = match read_headers(&mut r).await {
            Ok(Some(Ok(len))) => len,
            Ok(Some(Err(why))) => {
                let _ = out
                    .send(error_frame(
                        Value::Null,
                        -32700,
                        &format!("parse error: {why}"),
                    ))
                    .await;
                continue;
            }
            Ok(None) | Err(_) => break,
        };
        if len > MAX_MESSAGE_BYTES {
            if skip(&mut r, len).await.is_err() {
                break;
            }
            let msg =
                format!("invalid request: a message of {len} bytes (at most {MAX_MESSAGE_BYTES})");
            let _ = out.send(error_frame(Value::Null, -32600, &msg)).await;
            continue;
        }
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).await.is_err() {
            break;
        }
        match check(&body) {
            Verdict::Pass => {
                if server_in.write_all(&frame(&body)).await.is_err() {
                    break;
                }
            }
            Verdict::Reply(f) => {
                let _ = out.send(f).await;
            }
        }
    }
    // The editor closed its end: so does the server's input (the server then ends).
    let _ = server_in.shutdown().await;
}

/// Cut the server's output into whole frames for `out`.
pub async fn frames_of<R: AsyncRead + Unpin>(server_out: R, out: mpsc::Sender<Vec<u8>>) {
    let mut r = BufReader::new(server_out);
    while let Ok(Some(Ok(len))) = read_headers(&mut r).await {
        let mut body = vec![0u8; len];
        if r.read_exact(&mut body).await.is_err() {
            break;
        }
        if out.send(frame(&body)).await.is_err() {
            break;
        }
    }
}

/// Write frames to the editor, each whole.
pub async fn write_frames<W: AsyncWrite + Unpin>(mut output: W, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(f) = rx.recv().await {
        if output.write_all(&f).await.is_err() || output.flush().await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_rpc_messages_pass() {
        assert!(matches!(
            check(br#"{"jsonrpc":"2.0","id":1,"method":"x"}"#),
            Verdict::Pass
        ));
        assert!(matches!(
            check(br#"{"jsonrpc":"2.0","method":"x"}"#),
            Verdict::Pass
        ));
        assert!(matches!(
            check(br#"{"jsonrpc":"2.0","id":1,"result":null}"#),
            Verdict::Pass
        ));
        for bad in [&b"{nope"[..], b"[1,2]", br#"{"id":3}"#, b"\xff\xfe"] {
            assert!(matches!(check(bad), Verdict::Reply(_)), "{bad:?}");
        }
    }

    /// A message of more values than `MAX_VALUES` is answered before it is decoded; a long
    /// document's text is one value.
    #[test]
    fn a_message_of_too_many_values_is_refused_undecoded() {
        let zeros = vec!["0"; MAX_VALUES].join(",");
        let many = format!(r#"{{"jsonrpc":"2.0","method":"x","params":[{zeros}]}}"#);
        match check(many.as_bytes()) {
            Verdict::Reply(r) => {
                let r = String::from_utf8_lossy(&r);
                assert!(r.contains("JSON values"), "{r}");
            }
            Verdict::Pass => panic!("passed"),
        }
        let text = "x".repeat(4 << 20);
        let doc = format!(
            r#"{{"jsonrpc":"2.0","method":"textDocument/didOpen","params":{{"textDocument":{{"uri":"file:///a","text":"{text}"}}}}}}"#
        );
        assert!(matches!(check(doc.as_bytes()), Verdict::Pass));
    }
}
