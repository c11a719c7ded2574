//! MCP over stdio, with every line checked before rmcp sees it. rmcp's stdio transport dropped a
//! line it could not decode (invalid UTF-8, a lone surrogate, `1e400`, a key given twice) without
//! the JSON-RPC parse-error reply, so the client waited out its timeout. Here each line is read
//! as strict JSON first: a line that is not gets `{"error": {"code": -32700, …}, "id": null}` at
//! once, on the same stdout, between whole lines of rmcp's own output; a line longer than
//! `MAX_LINE` is answered the same way and skipped, never held in memory.

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest request line read (bytes).
pub const MAX_LINE: usize = 16 << 20;

/// `(reader, writer)` for rmcp: the checked lines of `input`, and a writer whose lines reach
/// `output` interleaved whole with the parse-error replies; and the task that writes `output`,
/// to await once rmcp is done (its last answers are still on their way).
pub fn checked<R, W>(
    input: R,
    output: W,
) -> (
    (tokio::io::DuplexStream, tokio::io::DuplexStream),
    tokio::task::JoinHandle<()>,
)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (mut to_rmcp, rmcp_reads) = tokio::io::duplex(1 << 20);
    let (rmcp_writes, from_rmcp) = tokio::io::duplex(1 << 20);
    // Bounded: a client that sends bad lines and never reads its answers is slowed (its stdin is
    // no longer read) instead of growing the server's memory.
    let (errors, mut error_rx) = tokio::sync::mpsc::channel::<String>(64);
    tokio::spawn(async move {
        let mut input = BufReader::new(input);
        loop {
            let line = match read_line(&mut input).await {
                Ok(Some(l)) => l,
                Ok(None) | Err(_) => break,
            };
            let body = line.strip_suffix(b"\n").unwrap_or(&line);
            let body = body.strip_suffix(b"\r").unwrap_or(body);
            if body.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match check(body) {
                Ok(()) => {
                    if to_rmcp.write_all(body).await.is_err()
                        || to_rmcp.write_all(b"\n").await.is_err()
                    {
                        break;
                    }
                }
                Err(why) => {
                    if errors.send(parse_error(&why)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to_rmcp.shutdown().await;
    });
    let writer = tokio::spawn(async move {
        let mut out = output;
        let mut from_rmcp = BufReader::new(from_rmcp);
        let mut rmcp_open = true;
        loop {
            let mut line = Vec::new();
            tokio::select! {
                n = from_rmcp.read_until(b'\n', &mut line), if rmcp_open => {
                    match n {
                        Ok(0) | Err(_) => rmcp_open = false,
                        Ok(_) => {
                            if out.write_all(&line).await.is_err() || out.flush().await.is_err() {
                                return;
                            }
                        }
                    }
                }
                e = error_rx.recv() => {
                    let Some(e) = e else {
                        if !rmcp_open { return; }
                        continue;
                    };
                    if out.write_all(e.as_bytes()).await.is_err() || out.flush().await.is_err() {
                        return;
                    }
                }
            }
            if !rmcp_open && error_rx.is_empty() && error_rx.is_closed() {
                return;
            }
        }
    });
    ((rmcp_reads, rmcp_writes), writer)
}

/// One line (with its newline), or `None` at the end; a line past `MAX_LINE` is consumed and
/// returned as its first `MAX_LINE + 1` bytes (which fail the check as too long).
async fn read_line<R: AsyncRead + Unpin>(r: &mut BufReader<R>) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if line.len() <= MAX_LINE {
            let room = (MAX_LINE + 1).saturating_sub(line.len());
            line.extend_from_slice(&buf[..take.min(room)]);
        }
        r.consume(take);
        if done {
            return Ok(Some(line));
        }
    }
}

/// Whether `line` is one strict JSON value: UTF-8, numbers that fit, no lone surrogates, no key
/// given twice in an object.
pub fn check(line: &[u8]) -> Result<(), String> {
    if line.len() > MAX_LINE {
        return Err(format!("the request is longer than {MAX_LINE} bytes"));
    }
    let text = std::str::from_utf8(line)
        .map_err(|e| format!("the request is not UTF-8 (at byte {})", e.valid_up_to()))?;
    crate::util::json::check(text, MAX_VALUES, true)
}

/// The most JSON values (numbers, strings, arrays, objects…) one request may hold. Decoded, a
/// value costs the server some hundred bytes, whatever its size in the request: 16 MB of `0,`
/// were 1.6 GB. A request of inline rows within `policy.max_inline_rows` (three values a row)
/// stays well under it.
pub const MAX_VALUES: usize = 1 << 19;

fn parse_error(why: &str) -> String {
    let reply = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": -32700, "message": format!("Parse error: {why}") },
    });
    format!("{reply}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_json_refuses_what_rmcp_dropped_and_takes_the_rest() {
        for bad in [
            &b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\xff\"}"[..],
            br#"{"jsonrpc":"2.0","id":1,"method":"\ud800"}"#,
            br#"{"jsonrpc":"2.0","id":1e400,"method":"ping"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","method":"tools/list"}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"ping"} {}"#,
            b"{not json",
        ] {
            assert!(check(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        for good in [
            &br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":[1,2.5,-3,"\ud83d\ude00",null,true]}}"#[..],
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
        ] {
            assert!(check(good).is_ok(), "{}", String::from_utf8_lossy(good));
        }
    }

    /// A request of more values than `MAX_VALUES` is refused unread by rmcp, however few bytes
    /// each takes; one at the bound passes.
    #[test]
    fn a_request_of_too_many_values_is_refused() {
        let zeros = |n: usize| {
            let mut l = String::from(r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":["#);
            l.push_str(&vec!["0"; n].join(","));
            l.push_str("]}}");
            l
        };
        // The object, three values, the params object and its array: 6 beside the zeros.
        assert!(check(zeros(MAX_VALUES - 6).as_bytes()).is_ok());
        let err = check(zeros(MAX_VALUES - 5).as_bytes()).expect_err("one too many");
        assert!(err.contains("JSON values"), "{err}");
    }

    #[tokio::test]
    async fn a_bad_line_gets_a_parse_error_between_whole_lines() {
        let input: &[u8] = b"{\"a\":1}\n\xff\xfe\n{\"a\":1,\"a\":2}\n\n{\"b\":2}\n";
        let (out_w, mut out_r) = tokio::io::duplex(1 << 16);
        let ((mut rmcp_reads, mut rmcp_writes), _writer) = checked(input, out_w);
        let mut got = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut rmcp_reads, &mut got)
            .await
            .expect("read");
        assert_eq!(
            got, "{\"a\":1}\n{\"b\":2}\n",
            "only the good lines reach rmcp"
        );
        rmcp_writes
            .write_all(b"{\"ok\":true}\n")
            .await
            .expect("write");
        drop(rmcp_writes);
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut out_r, &mut out)
            .await
            .expect("read");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        assert_eq!(
            lines.iter().filter(|l| l.contains("-32700")).count(),
            2,
            "{out}"
        );
        assert!(
            out.contains("given twice") && out.contains("not UTF-8"),
            "{out}"
        );
        assert!(lines.contains(&"{\"ok\":true}"), "{out}");
    }
}
