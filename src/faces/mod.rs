//! The faces: thin translations between a protocol (the command line, MCP, and next LSP and the
//! web page) and the Experiment OS. Invariant: only faces use clap, rmcp, axum or LSP types, and
//! no face writes the record or decides policy — everything goes through `os`.

pub mod bench;
pub mod cli;
pub mod init;
pub mod mcp;
