//! The one error type of xtask: a sentence for the user, never a panic.

use std::fmt;

/// Why a command failed.
#[derive(Debug)]
pub enum Error {
    /// One line saying what went wrong and what to do; `main` prints it after `error: `.
    Message(String),
    /// The failure has already been explained on the terminal (a step runner's
    /// summary); only the exit code is left to set.
    Reported,
}

impl Error {
    pub fn new(message: impl Into<String>) -> Self {
        Error::Message(message.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Message(message) => f.write_str(message),
            Error::Reported => f.write_str("the failure was reported above"),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
