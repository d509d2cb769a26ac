//! The `fusion` command line.
fn main() {}
