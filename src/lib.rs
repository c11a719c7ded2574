//! rsi-master: the Experiment OS in which LLM agents post-train a base model through a fixed set
//! of schema-validated, policy-checked, recorded actions. See ARCHITECTURE.md for the map.
//!
//! The modules are layers; each imports only the layers before it in this list (checked by
//! `tests/all/layering.rs`):
//! `util` → `model` → `api` → `config` → `policy` → `record` → `jobs` → `train` → `os` →
//! `campaign` → `bench` → `faces`.

pub mod api;
pub mod bench;
pub mod campaign;
pub mod config;
pub mod faces;
pub mod jobs;
pub mod model;
pub mod os;
pub mod policy;
pub mod record;
pub mod train;
pub mod util;

pub use os::Study;
pub use util::error::{Error, ErrorKind, Result};
