//! Helpers that know nothing of studies: errors, hashing, text, statistics, processes.
//! Invariant: imports nothing from the crate outside `util`.

pub mod error;
pub mod fair;
pub mod file;
pub mod hash;
pub mod json;
pub mod origin;
pub mod proc;
pub mod schema;
pub mod stats;
pub mod text;
