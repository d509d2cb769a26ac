//! The TOML front end.

use super::ast::GraphDecl;
use crate::diagnostic::{Diagnostics, SourceFile};

/// Parses a `graphs/*.toml` file.
pub fn parse_toml(_source: &SourceFile) -> Result<GraphDecl, Diagnostics> {
    todo!("TOML front end")
}
