//! The run-time error catalogue (`docs/errors.md`) against the tests it
//! names: every `gpu_errors::…` or `device::…` test listed for an
//! `Error` variant exists and asserts that variant. Runs on the CPU, so a
//! renamed test or a test that checks another error fails here rather than
//! going unnoticed until a GPU run.

use std::path::Path;

/// The body of `fn name(` in `source`, up to the next line that is a lone
/// closing brace at the function's indentation.
fn function_body<'a>(source: &'a str, name: &str) -> Option<&'a str> {
    let header = format!("fn {name}(");
    let start = source.find(&header)?;
    let indent = source[..start].rsplit('\n').next().unwrap_or("");
    let close = format!("\n{indent}}}\n");
    let end = source[start..].find(&close)?;
    Some(&source[start..start + end])
}

#[test]
fn every_runtime_error_row_names_a_test_that_asserts_its_variant() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read =
        |path: &str| std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let catalogue = read("docs/errors.md");
    let sources = [
        ("gpu_errors", read("tests/gpu_errors.rs")),
        ("device", read("src/device.rs")),
    ];
    let section = catalogue
        .split("## Run time")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/errors.md has a run-time section");
    let mut checked = 0;
    for line in section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ---"))
    {
        let cells: Vec<&str> = line.split(" | ").collect();
        let (Some(variants), Some(tests)) = (cells.get(1), cells.last()) else {
            continue;
        };
        // Only rows whose variant cell lists `Name`s are errors (not `M = 0`'s
        // "no error: a no-op").
        let variants: Vec<&str> = variants
            .split(", ")
            .filter_map(|v| v.strip_prefix('`').and_then(|v| v.strip_suffix('`')))
            .collect();
        if variants.is_empty() {
            continue;
        }
        // Each named test asserts one of the row's variants; together they
        // assert every one.
        let mut asserted = vec![false; variants.len()];
        let mut named = 0;
        for (module, source) in &sources {
            let prefix = format!("`{module}::");
            for piece in tests.split(&prefix).skip(1) {
                let name = piece.split('`').next().unwrap_or("");
                let body = function_body(source, name).unwrap_or_else(|| {
                    panic!(
                        "docs/errors.md names `{module}::{name}` for {variants:?}, but there is no such test"
                    )
                });
                let found: Vec<bool> = variants
                    .iter()
                    .map(|v| body.contains(&format!("Error::{v}")))
                    .collect();
                assert!(
                    found.contains(&true),
                    "`{module}::{name}` is catalogued for {variants:?} but asserts none of them"
                );
                asserted.iter_mut().zip(&found).for_each(|(a, f)| *a |= f);
                named += 1;
            }
        }
        if named > 0 {
            for (variant, asserted) in variants.iter().zip(&asserted) {
                assert!(
                    *asserted,
                    "no test named for `{variant}` asserts `Error::{variant}`"
                );
            }
        }
        checked += named;
    }
    // Every variant row but `Launch` names at least one such test.
    assert!(
        checked >= 10,
        "only {checked} catalogued tests found: has the table's format changed?"
    );
}
