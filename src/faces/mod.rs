//! The faces: thin translations between a protocol (the command line, MCP, the LSP, the web
//! page) and the Experiment OS. Invariant: only faces use clap, rmcp, axum or LSP types, and
//! no face writes the record or decides policy — everything goes through `os`.

// Command output goes to stdout through these (they shadow the std macros in every face): when
// the reader goes away (`rsim audit --json | head -1`), the command ends quietly with status 0
// instead of panicking on the broken pipe. Servers never print their protocol through them.
macro_rules! println {
    ($($t:tt)*) => {
        $crate::faces::out(format_args!("{}\n", format_args!($($t)*)))
    };
}
macro_rules! print {
    ($($t:tt)*) => {
        $crate::faces::out(format_args!($($t)*))
    };
}

pub mod cli;
pub mod dagview;
pub mod init;
pub mod lsp;
pub mod mcp;
pub mod web;

/// Write command output to stdout. A closed pipe ends the process quietly (status 0): the
/// reader has all it wanted. Any other write error ends it with status 1 and a message.
pub fn out(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    if let Err(e) = o.write_fmt(args).and_then(|()| o.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}
