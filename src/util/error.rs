//! One error type for the Experiment OS, with a stable kind that faces map to exit codes / tool errors.

use serde::Serialize;

/// What went wrong, in terms a face can act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request or a config file is malformed (schema, range, syntax). Nothing was written.
    Invalid,
    /// A node, job, dataset, checkpoint or action named in the request does not exist. Nothing was written.
    NotFound,
    /// The policy guard rejected the request. The rejection itself was recorded.
    Rejected,
    /// A concurrent writer won a race that could not be retried. Nothing was written.
    Conflict,
    /// The caller's role may not perform this action. Nothing was written.
    Forbidden,
    /// Storage, git or process failure.
    Internal,
}

impl ErrorKind {
    /// Process exit code used by the CLI (documented in README).
    pub fn exit_code(self) -> i32 {
        match self {
            ErrorKind::Internal => 1,
            ErrorKind::Invalid => 2,
            ErrorKind::NotFound => 3,
            ErrorKind::Rejected => 4,
            ErrorKind::Conflict => 5,
            ErrorKind::Forbidden => 6,
        }
    }
}

/// An error with its kind and a message naming what was wrong.
#[derive(Debug, Clone, thiserror::Error, Serialize)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    /// For policy rejections: the rule that fired.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// For policy rejections: the commit that records the rejection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            rule: None,
            commit: None,
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Invalid, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Forbidden, message)
    }
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Conflict, message)
    }
    /// Prefix the message with context ("while doing X: ...").
    pub fn context(mut self, ctx: impl std::fmt::Display) -> Self {
        self.message = format!("{ctx}: {}", self.message);
        self
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<git2::Error> for Error {
    fn from(e: git2::Error) -> Self {
        Error::internal(format!("git: {}", e.message()))
    }
}

impl From<rusqlite::Error> for Error {
    fn from(e: rusqlite::Error) -> Self {
        Error::internal(format!("index (sqlite): {e}"))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::internal(format!("io: {e}"))
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::internal(format!("json: {e}"))
    }
}

/// Attach a path to an io error.
pub trait IoContext<T> {
    fn at(self, what: &str, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, what: &str, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| Error::internal(format!("{what} {}: {e}", path.display())))
    }
}
