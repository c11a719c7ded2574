//! rsi-master: the Experiment OS in which LLM agents post-train a base model through a fixed set
//! of schema-validated, policy-checked, recorded actions. See ARCHITECTURE.md for the map.

pub mod api;
pub mod audit;
pub mod bench;
pub mod cli;
pub mod config;
pub mod contamination;
pub mod dag;
pub mod datasets;
pub mod error;
pub mod fsck;
pub mod gpt;
pub mod index;
pub mod init;
pub mod jobs;
pub mod mcp;
pub mod model;
pub mod orchestra;
pub mod policy;
pub mod record;
pub mod report;
pub mod slurm;
pub mod stats;
pub mod store;
pub mod trainer;

pub use api::Study;
pub use error::{Error, ErrorKind, Result};
