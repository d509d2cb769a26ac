//! An example of fusion in a user crate: `model` declares two transformer
//! blocks with `fusion_graph!`, `build.rs` compiles them, and the binary
//! runs them against the CPU reference.

pub mod model;
