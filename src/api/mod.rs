//! The wire contract of the Experiment OS: every action's and query's request and result types
//! and their JSON Schemas. Invariant: data only — no IO, no study, no policy; knows `model` and
//! `util`, nothing above them.

pub mod actions;
pub mod schema;
pub mod types;
