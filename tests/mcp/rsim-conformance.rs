//! `rsim` with the official MCP conformance suite's fixture tools, resources and prompts served
//! beside its own, for `tools/mcp-clients.sh` (`RSIM_CONFORMANCE_BIN`). Built by `cargo test` (or
//! `cargo build --example rsim-conformance`) into `target/debug/examples/`; never installed.

fn main() {
    rsi_master::faces::mcp::enable_conformance_fixtures();
    std::process::exit(rsi_master::faces::cli::main());
}
