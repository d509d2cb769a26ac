//! The names both halves of `fusion_graph!` agree on: where the build script
//! writes a macro graph's wrappers and what the graph's struct is called.
//! Always present, because the macro links only this, `syntax` and `ir`.

/// The directory under `OUT_DIR` that holds one wrapper file per
/// `fusion_graph!` graph, `<graph>.rs`; the macro includes it from there.
pub const MACRO_GRAPHS_DIR: &str = "fusion_graphs";

/// The name of a graph's generated struct: `swiglu_ffn` → `SwigluFfn`.
pub fn struct_name(graph: &str) -> String {
    camel_case(graph)
}

fn camel_case(name: &str) -> String {
    name.split('_')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut chars = s.chars();
            chars
                .next()
                .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect()
}
