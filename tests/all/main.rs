//! Every integration test in one binary (one link of the crate and its dependencies instead of
//! one per file), with the helpers they share. Run one area with `cargo test --test all mcp::`.

mod common;
mod fuzz_support;

mod api;
mod cli;
mod fuzz;
mod governance;
mod layering;
mod mcp;
mod nix;
mod orchestra;
mod redteam;
mod redteam_clone;
mod redteam_code;
mod redteam_dev;
mod redteam_limits;
mod session;
mod sharing;
mod slurm;
mod tiny_code;
mod web;
