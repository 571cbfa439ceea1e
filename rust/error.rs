//! The core's error type. Every rule the core enforces reports through [`Error`]; the Python
//! bindings map each [`ErrorKind`] onto one exception class of the package.

use std::fmt;

/// Which family of rule was broken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A state layout, or an engine's copy-function registration, breaks the layout contract.
    Layout,
    /// State tensors do not match the layout they are bound to.
    Binding,
    /// A copy or commit step is invalid (block ids, columns, accepted counts, hazards).
    Plan,
}

/// An error with a complete, human-readable message: what is wrong, where, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn layout(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Layout, message: message.into() }
    }
    pub fn binding(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Binding, message: message.into() }
    }
    pub fn plan(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Plan, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
