//! The error catalogue (`docs/errors.md`) against the tests it names: every
//! test it names, in any section, exists, and every test of the run time's
//! rows listed for an `Error` variant asserts that variant: the variant's
//! path inside an `assert!` (such as `assert!(matches!(e, Error::Shape {
//! .. }))`), not merely named. Runs on the CPU, so a renamed test or a test
//! that checks another error fails here rather than going unnoticed until a
//! GPU run.

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

/// Whether `body` asserts `Error::{variant}`: the path, followed by no more
/// of an identifier (`Error::Shape` is not `Error::ShapeMismatch`), in code
/// (not in a string or a comment) inside the parentheses of an `assert!`,
/// `assert_eq!` or `assert_ne!`.
fn asserts_variant(body: &str, variant: &str) -> bool {
    let code = code_only(body);
    let path = format!("Error::{variant}");
    let assertions: Vec<(usize, usize)> = ["assert!(", "assert_eq!(", "assert_ne!("]
        .iter()
        .flat_map(|mac| {
            let code = &code;
            code.match_indices(mac).filter_map(move |(at, _)| {
                let open = at + mac.len() - 1;
                closing_paren(code, open).map(|close| (open, close))
            })
        })
        .collect();
    code.match_indices(&path).any(|(at, _)| {
        let whole = !code[at + path.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
        whole && assertions.iter().any(|&(open, close)| open < at && at < close)
    })
}

/// `source` with the contents of its string literals and line comments
/// blanked out, each byte a space, so that offsets stay as they were.
fn code_only(source: &str) -> String {
    let mut code = String::with_capacity(source.len());
    let (mut in_string, mut in_comment, mut escaped) = (false, false, false);
    let mut chars = source.chars().peekable();
    while let Some(c) = chars.next() {
        let blank = if in_comment {
            in_comment = c != '\n';
            in_comment
        } else if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            in_string
        } else {
            match c {
                '"' => in_string = true,
                '/' if chars.peek() == Some(&'/') => in_comment = true,
                _ => {}
            }
            in_comment
        };
        if blank {
            code.extend(std::iter::repeat_n(' ', c.len_utf8()));
        } else {
            code.push(c);
        }
    }
    code
}

/// The index of the `)` that closes the `(` at `open` in `code`.
fn closing_paren(code: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

#[test]
fn a_variant_counts_only_when_an_assertion_matches_it() {
    let asserted = "let e = f().unwrap_err();\n    assert!(matches!(e, Error::Shape { .. }), \"{e} (\");";
    assert!(asserts_variant(asserted, "Shape"));
    let spread = "assert!(\n        matches!(\n            err,\n            Error::DimMismatch {\n                first_value: 4,\n                ..\n            }\n        ),\n        \"{err}\"\n    );";
    assert!(asserts_variant(spread, "DimMismatch"));
    assert!(asserts_variant(
        "assert_eq!(r, Err(Error::Setting { .. }))",
        "Setting"
    ));
    // Named, but not asserted.
    for mention in [
        "// Error::Shape is what a bad shape gets\n    let _ = f();",
        "let e = Error::Shape { tensor, expected, actual };\n    assert!(e.to_string().contains(\"x\"));",
        "if matches!(e, Error::Shape { .. }) {\n        return;\n    }",
        "assert!(f().is_err(), \"Error::Shape (\");\n    let _ = Error::Shape;",
    ] {
        assert!(!asserts_variant(mention, "Shape"), "{mention}");
    }
    // Another variant whose name starts with this one's.
    let longer = "assert!(matches!(e, Error::TensorFileTooLarge { .. }));";
    assert!(!asserts_variant(longer, "TensorFile"));
    assert!(asserts_variant(longer, "TensorFileTooLarge"));
}

/// A file of the repository, by its path from the root.
fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn every_runtime_error_row_names_a_test_that_asserts_its_variant() {
    let catalogue = read("docs/errors.md");
    // The tests of `fusion::Error` values; not `cli` or `run::tests`, which
    // check the messages `fusion run` prints.
    let sources = [
        ("gpu_errors", read("tests/gpu_errors.rs")),
        ("gpu_cublaslt", read("fusion-cli/tests/gpu_cublaslt.rs")),
        ("gpu_graphs", read("tests/gpu_graphs.rs")),
        ("device", read("src/device.rs")),
        ("tensor::tests", read("src/tensor.rs")),
        ("launch::tests", read("src/launch.rs")),
        ("plan::tests", read("src/plan.rs")),
        ("weights::tests", read("src/weights.rs")),
        ("gpu_safetensors", read("tests/gpu_safetensors.rs")),
        ("gpu_candle", read("tests/gpu_candle.rs")),
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
                let found: Vec<bool> = variants.iter().map(|v| asserts_variant(body, v)).collect();
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

/// Where the tests of each prefix the catalogue uses live (its "Test
/// locations" paragraph).
const TEST_FILES: &[(&str, &str)] = &[
    ("syntax", "fusion-compiler/tests/syntax.rs"),
    ("ir", "fusion-compiler/tests/ir.rs"),
    ("fuzz", "fusion-compiler/tests/fuzz.rs"),
    ("large_graphs", "fusion-compiler/tests/large_graphs.rs"),
    ("reference", "fusion-compiler/tests/reference.rs"),
    ("build_errors", "fusion-compiler/tests/build_errors.rs"),
    ("build_compile", "fusion-compiler/tests/build_compile.rs"),
    ("build_libclang", "fusion-compiler/tests/build_libclang.rs"),
    ("build_tile_budget", "fusion-compiler/tests/build_tile_budget.rs"),
    ("build_fp8", "fusion-compiler/tests/build_fp8.rs"),
    ("codegen", "fusion-compiler/src/codegen/tests.rs"),
    ("select", "fusion-compiler/src/select/tests.rs"),
    ("build::builder::tests", "fusion-compiler/src/build/builder.rs"),
    ("cache", "fusion-compiler/src/build/cache.rs"),
    ("nvcc", "fusion-compiler/src/build/nvcc.rs"),
    ("cli", "fusion-cli/tests/cli.rs"),
    ("device", "src/device.rs"),
    ("tensor::tests", "src/tensor.rs"),
    ("launch::tests", "src/launch.rs"),
    ("plan::tests", "src/plan.rs"),
    ("weights::tests", "src/weights.rs"),
    ("run::tests", "fusion-cli/src/run.rs"),
    ("gpu", "tests/gpu.rs"),
    ("gpu_errors", "tests/gpu_errors.rs"),
    ("gpu_graphs", "tests/gpu_graphs.rs"),
    ("gpu_property", "tests/gpu_property.rs"),
    ("gpu_stress", "tests/gpu_stress.rs"),
    ("gpu_workspace", "tests/gpu_workspace.rs"),
    ("gpu_safetensors", "tests/gpu_safetensors.rs"),
    ("gpu_run", "fusion-cli/tests/gpu_run.rs"),
    ("gpu_cublaslt", "fusion-cli/tests/gpu_cublaslt.rs"),
    ("gpu_candle", "tests/gpu_candle.rs"),
];

#[test]
fn every_test_the_catalogue_names_exists() {
    let catalogue = read("docs/errors.md");
    let mut checked = 0;
    let mut missing = Vec::new();
    for (prefix, file) in TEST_FILES {
        let source = read(file);
        // A pattern such as `gpu::*_alone_at_its_hardest_inputs` is not a
        // name and is skipped.
        for piece in catalogue.split(&format!("`{prefix}::")).skip(1) {
            let name = piece.split('`').next().unwrap_or("");
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                continue;
            }
            if function_body(&source, name).is_none() {
                missing.push(format!("`{prefix}::{name}` (no `fn {name}(` in {file})"));
            }
            checked += 1;
        }
    }
    assert!(
        missing.is_empty(),
        "docs/errors.md names tests that do not exist: {missing:#?}"
    );
    assert!(
        checked >= 60,
        "only {checked} named tests found: has the catalogue's format changed?"
    );
}
