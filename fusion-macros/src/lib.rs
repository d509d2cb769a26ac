//! `fusion_graph!`: declares a graph in Rust source.
