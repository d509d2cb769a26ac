//! Fuzzing the graph front ends on the stable toolchain, with proptest as
//! the input generator: the TOML reader, the type and expression grammar
//! (inside TOML strings and inside `fusion_graph!` tokens) and lowering.
//!
//! The property, for every input: parsing and lowering return, never panic,
//! and every error they return has a location in the input (a line and
//! column the user can go to) and renders without panicking.
//!
//! Inputs are arbitrary strings, random soups of the grammar's own tokens,
//! random edits of valid graphs (the shipped ones and the corpus), and
//! expressions nested or chained thousands deep.
//!
//! - `cargo test -p fusion-compiler --test fuzz` (CI): replays every file of
//!   `tests/fuzz-corpus/` and runs a few hundred generated cases of each
//!   kind, from a fixed seed. Seconds.
//! - `FUSION_FUZZ_SECONDS=600 cargo test --release -p fusion-compiler --test fuzz
//!   -- --ignored --nocapture fuzz_toml` (and `fuzz_expressions`): the long
//!   runs, until the time is up; `FUSION_FUZZ_CASES=N` stops after N cases
//!   instead, `FUSION_FUZZ_SEED` replays a run (each run prints its seed).
//!
//! A failure prints proptest's smallest failing input; save it under
//! `tests/fuzz-corpus/` (`.toml` for a whole file, `.expr` for an expression,
//! `.graph` for a macro body) so that CI replays it from then on, and write
//! its `<file>.expected` with `FUSION_BLESS=1 cargo test -p fusion-compiler
//! --test fuzz corpus`: the replay checks each file's outcome (`ok`, or its
//! first error) against that sidecar.

use fusion_compiler::diagnostic::{Diagnostics, SourceFile};
use fusion_compiler::ir;
use fusion_compiler::syntax::{forget_token_spans, parse_tokens, parse_toml};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

// ---- the property -----------------------------------------------------------

/// Checks that every diagnostic points into `source` and renders.
fn check_located(source: &SourceFile, errors: &Diagnostics) -> Result<(), TestCaseError> {
    let lines = source.text.lines().count().max(1);
    for d in errors.iter() {
        let Some((start, _)) = source.locate(d.span) else {
            return Err(TestCaseError::fail(format!(
                "an error has no location: {}",
                d.message
            )));
        };
        // One past the last line is where "end of input" points.
        prop_assert!(
            start.line >= 1 && start.line <= lines + 1 && start.column >= 1,
            "error `{}` located at {}:{} outside the {lines}-line input",
            d.message,
            start.line,
            start.column
        );
        prop_assert!(!d.message.trim().is_empty(), "an error has an empty message");
    }
    let rendered = errors.render(source);
    prop_assert!(rendered.starts_with(&source.path.display().to_string()));
    Ok(())
}

/// What the front end made of one input, as a corpus file's `.expected`
/// sidecar records it: `ok`, or the first error's line, column and message
/// (its first line) with the number of errors.
fn outcome(source: &SourceFile, result: &Result<ir::Graph, Diagnostics>) -> String {
    let Err(errors) = result else {
        return "ok".to_owned();
    };
    let first = &errors.0[0];
    let at = source
        .locate(first.span)
        .map_or("no location".to_owned(), |(start, _)| {
            format!("{}:{}", start.line, start.column)
        });
    let count = match errors.0.len() {
        1 => "1 error".to_owned(),
        n => format!("{n} errors"),
    };
    format!(
        "{count}, the first at {at}: {}",
        first.message.lines().next().unwrap_or("")
    )
}

/// A whole TOML graph file.
fn check_toml_text(text: &str) -> Result<(), TestCaseError> {
    toml_outcome(text).map(drop)
}

fn toml_outcome(text: &str) -> Result<String, TestCaseError> {
    let source = SourceFile::new("fuzz.toml", text);
    let result = parse_toml(&source).and_then(|decl| ir::lower(&decl));
    let checked = match &result {
        Ok(_) => Ok(()),
        Err(errors) => check_located(&source, errors),
    };
    let outcome = outcome(&source, &result);
    drop(result);
    // parse_toml keeps no token spans, so the thread's tokenized text can go.
    forget_token_spans();
    checked.map(|()| outcome)
}

/// A `fusion_graph!` body as a build script reads it from Rust source.
fn macro_outcome(text: &str) -> Result<String, TestCaseError> {
    // Text that does not lex as Rust never reaches the parser (rustc refuses
    // it first); what lexes must parse or fail with a located error.
    let checked = match TokenStream2::from_str(text) {
        Err(_) => Ok("not Rust tokens".to_owned()),
        Ok(tokens) => {
            let source = SourceFile::new("fuzz.rs", text);
            let result = parse_tokens(tokens).and_then(|decl| ir::lower(&decl));
            let checked = match &result {
                Ok(_) => Ok(()),
                Err(errors) => check_located(&source, errors),
            };
            checked.map(|()| outcome(&source, &result))
        }
    };
    forget_token_spans();
    checked
}

type TokenStream2 = proc_macro2::TokenStream;

/// The declarations an expression may use, so that the expression itself is
/// what gets checked.
const EXPR_PRELUDE_TOML: &str = r#"[graph]
name = "g"

[dims]
M = "dyn"
K = 64
N = 64

[inputs]
x = "f16[M, K]"
r = "f16[M, N]"

[weights]
w = "f16[N, K]"
v = "f16[K, N]"
b = "f16[N]"
gamma = "f16[K]"

"#;

const EXPR_PRELUDE_MACRO: &str = "graph g { dims { M: dyn, K: 64, N: 64 } \
     input x: f16[M, K], r: f16[M, N]; \
     weight w: f16[N, K], v: f16[K, N], b: f16[N], gamma: f16[K]; ";

/// An expression, as a TOML output string and as a macro output.
fn check_expr(expr: &str) -> Result<(), TestCaseError> {
    expr_outcomes(expr).map(drop)
}

/// The outcome of each of [`check_expr`]'s three inputs, one a line.
fn expr_outcomes(expr: &str) -> Result<String, TestCaseError> {
    // A literal string keeps the text verbatim, so spans point inside it;
    // a basic string with escapes covers the other path of the reader.
    let literal = !expr.contains(['\'', '\n', '\r']) && !expr.chars().any(char::is_control);
    let value = if literal {
        format!("'{expr}'")
    } else {
        toml_basic_string(expr)
    };
    let output = toml_outcome(&format!("{EXPR_PRELUDE_TOML}[outputs]\ny = {value}\n"))?;
    let compute = toml_outcome(&format!(
        "{EXPR_PRELUDE_TOML}[compute]\nh = {value}\n\n[outputs]\ny = \"h\"\n"
    ))?;
    let macro_output = macro_outcome(&format!("{EXPR_PRELUDE_MACRO} output y = {expr}; }}"))?;
    Ok(format!(
        "toml output: {output}\ntoml compute: {compute}\nmacro output: {macro_output}"
    ))
}

fn toml_basic_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// ---- the inputs -------------------------------------------------------------

/// Pieces of the grammar and of TOML, joined into soups and spliced into
/// valid graphs.
const TOKENS: &[&str] = &[
    "x",
    "w",
    "v",
    "b",
    "r",
    "gamma",
    "h",
    "y",
    "@",
    "^",
    "T",
    "^T",
    "+",
    "*",
    "-",
    "/",
    "(",
    ")",
    ",",
    "=",
    "[",
    "]",
    "{",
    "}",
    ";",
    ":",
    ".",
    "'",
    "\"",
    "\\",
    "#",
    "\n",
    " ",
    "gelu",
    "silu",
    "relu",
    "sigmoid",
    "gelu_quick",
    "layernorm",
    "rmsnorm",
    "mul",
    "eps",
    "approximate",
    "\"tanh\"",
    "\"erf\"",
    "1e-5",
    "0",
    "1",
    "-1",
    "8",
    "64",
    "2147483647",
    "2147483648",
    "99999999999999999999",
    "1e999",
    "f16",
    "bf16",
    "f32",
    "f8",
    "M",
    "N",
    "K",
    "dyn",
    "graph",
    "dims",
    "input",
    "weight",
    "output",
    "let",
    "pub",
    "///",
    "//",
    "/*",
    "*/",
    "r#x",
    "é",
    "\u{0}",
    "[graph]",
    "[dims]",
    "[inputs]",
    "[weights]",
    "[compute]",
    "[outputs]",
    "name",
    "doc",
    "= \"",
    "\"\"\"",
    "'''",
];

fn soup() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(TOKENS), 0..48).prop_map(|tokens| {
        let mut out = String::new();
        for t in tokens {
            out.push_str(t);
            out.push(' ');
        }
        out
    })
}

/// Deep and long inputs, past what 48 tokens can reach: a fragment repeated
/// up to thousands of times, something in the middle, and a fragment
/// repeated after it (`((((x))))`, `relu(relu(x))`, `x + x + … x`, `w^T^T…`,
/// and unbalanced mixes of them).
fn deep_and_long() -> impl Strategy<Value = String> {
    const REPEATED: &[&str] = &[
        "(",
        ")",
        "relu(",
        "layernorm(",
        "[",
        "{",
        "x + ",
        "x * ",
        "x @ ",
        "^T",
        "(x @ v) * ",
        ", ",
        "+",
    ];
    let fragment = || prop::sample::select(REPEATED);
    (
        fragment(),
        0..3000usize,
        prop::sample::select(TOKENS),
        fragment(),
        0..3000usize,
    )
        .prop_map(|(before, n, middle, after, m)| format!("{}{middle}{}", before.repeat(n), after.repeat(m)))
}

/// One edit of a text, at a fraction of its length.
#[derive(Clone, Debug)]
enum Edit {
    Delete {
        at: f64,
        len: usize,
    },
    Insert {
        at: f64,
        token: &'static str,
    },
    Replace {
        at: f64,
        len: usize,
        token: &'static str,
    },
    DuplicateLine {
        at: f64,
    },
    SwapLines {
        a: f64,
        b: f64,
    },
}

fn edit() -> impl Strategy<Value = Edit> {
    let at = 0.0..1.0f64;
    prop_oneof![
        (at.clone(), 1..12usize).prop_map(|(at, len)| Edit::Delete { at, len }),
        (at.clone(), prop::sample::select(TOKENS)).prop_map(|(at, token)| Edit::Insert { at, token }),
        (at.clone(), 1..6usize, prop::sample::select(TOKENS)).prop_map(|(at, len, token)| Edit::Replace {
            at,
            len,
            token
        }),
        at.clone().prop_map(|at| Edit::DuplicateLine { at }),
        (at.clone(), at).prop_map(|(a, b)| Edit::SwapLines { a, b }),
    ]
}

/// The char boundary at or before `fraction` of `text`.
fn boundary(text: &str, fraction: f64) -> usize {
    let mut at = ((text.len() as f64) * fraction) as usize;
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn apply(text: &str, edit: &Edit) -> String {
    match *edit {
        Edit::Delete { at, len } | Edit::Replace { at, len, .. } => {
            let start = boundary(text, at);
            let mut end = (start + len).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            let token = if let Edit::Replace { token, .. } = edit {
                token
            } else {
                ""
            };
            format!("{}{token}{}", &text[..start], &text[end..])
        }
        Edit::Insert { at, token } => {
            let at = boundary(text, at);
            format!("{}{token}{}", &text[..at], &text[at..])
        }
        Edit::DuplicateLine { at } | Edit::SwapLines { a: at, .. } => {
            let mut lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                return text.to_owned();
            }
            let i = ((lines.len() as f64 * at) as usize).min(lines.len() - 1);
            if let Edit::SwapLines { b, .. } = *edit {
                let j = ((lines.len() as f64 * b) as usize).min(lines.len() - 1);
                lines.swap(i, j);
            } else {
                lines.insert(i, lines[i]);
            }
            lines.join("\n")
        }
    }
}

fn mutated(seeds: Vec<String>) -> impl Strategy<Value = String> {
    (prop::sample::select(seeds), prop::collection::vec(edit(), 1..6))
        .prop_map(|(seed, edits)| edits.iter().fold(seed, |text, e| apply(&text, e)))
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz-corpus")
}

fn files_with(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    files
}

/// Valid graphs to mutate: the shipped ones and the corpus's.
fn toml_seeds() -> Vec<String> {
    let graphs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs");
    files_with(&graphs, "toml")
        .into_iter()
        .chain(files_with(&corpus_dir(), "toml"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

fn expr_seeds() -> Vec<String> {
    let mut seeds: Vec<String> = [
        "gelu(x @ w^T + b)",
        "silu(x @ w^T) * (x @ w^T) + r",
        "layernorm(x, gamma, gamma, eps = 1e-5) @ v",
        "rmsnorm(x, gamma) @ w^T + b + r",
        "gelu_erf(x @ v + b)",
        "relu((x @ w^T))",
    ]
    .map(String::from)
    .to_vec();
    for file in files_with(&corpus_dir(), "expr") {
        seeds.push(std::fs::read_to_string(file).unwrap().trim_end().to_owned());
    }
    seeds
}

// ---- runners ----------------------------------------------------------------

/// How long a run goes: a number of cases, or a time budget.
struct Budget {
    cases: Option<u64>,
    time: Option<Duration>,
    seed: u64,
}

impl Budget {
    /// From the environment, or `default_cases` when it says nothing.
    fn from_env(default_cases: u64) -> Budget {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let time = var("FUSION_FUZZ_SECONDS").map(Duration::from_secs);
        let cases = var("FUSION_FUZZ_CASES").or(if time.is_none() { Some(default_cases) } else { None });
        let seed = var("FUSION_FUZZ_SEED").unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
        Budget { cases, time, seed }
    }

    /// A fixed, small run for CI.
    fn quick(cases: u64) -> Budget {
        Budget {
            cases: Some(cases),
            time: None,
            seed: 0x5eed,
        }
    }
}

/// Runs `property` on inputs from `strategy` until the budget is spent, in
/// batches so a time budget can stop it. Panics (with proptest's shrunk
/// input) on the first failure; returns the number of cases run.
fn fuzz<S: Strategy>(
    name: &str,
    budget: &Budget,
    strategy: S,
    property: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> u64 {
    const BATCH: u64 = 2000;
    eprintln!("{name}: FUSION_FUZZ_SEED={}", budget.seed);
    let started = Instant::now();
    let mut done = 0u64;
    let mut batch_index = 0u64;
    loop {
        let left = budget.cases.map_or(BATCH, |c| c.saturating_sub(done).min(BATCH));
        let out_of_time = budget.time.is_some_and(|t| started.elapsed() >= t);
        if left == 0 || out_of_time {
            break;
        }
        let mut seed = [0u8; 16];
        seed[..8].copy_from_slice(&budget.seed.to_le_bytes());
        seed[8..].copy_from_slice(&batch_index.to_le_bytes());
        let config = Config {
            cases: left as u32,
            failure_persistence: None,
            max_shrink_iters: 4096,
            ..Config::default()
        };
        let rng = TestRng::from_seed(RngAlgorithm::XorShift, &seed);
        let mut runner = TestRunner::new_with_rng(config, rng);
        if let Err(e) = runner.run(&strategy, &property) {
            panic!(
                "{name}: {e}\n(seed {}, batch {batch_index}; save the input under tests/fuzz-corpus/)",
                budget.seed
            );
        }
        done += left;
        batch_index += 1;
    }
    eprintln!(
        "{name}: {done} cases in {:.1}s, no panics, every error located",
        started.elapsed().as_secs_f64()
    );
    done
}

/// Each input kind in turn for TOML files.
fn run_toml(budget: &Budget) -> u64 {
    let seeds = toml_seeds();
    let arbitrary = fuzz("toml/arbitrary", budget, any::<String>(), |s| check_toml_text(&s));
    let soups = fuzz("toml/soup", budget, soup(), |s| check_toml_text(&s));
    let edits = fuzz("toml/mutated", budget, mutated(seeds), |s| check_toml_text(&s));
    arbitrary + soups + edits
}

fn run_expressions(budget: &Budget) -> u64 {
    let arbitrary = fuzz("expr/arbitrary", budget, "\\PC{0,40}", |s| check_expr(&s));
    let soups = fuzz("expr/soup", budget, soup(), |s| check_expr(&s));
    let edits = fuzz("expr/mutated", budget, mutated(expr_seeds()), |s| check_expr(&s));
    let deep = fuzz("expr/deep", budget, deep_and_long(), |s| check_expr(&s));
    arbitrary + soups + edits + deep
}

/// A time budget is split evenly between the input kinds (the expression
/// runs have one more, so they take a little longer).
fn per_kind(mut budget: Budget) -> Budget {
    budget.time = budget.time.map(|t| t / 3);
    budget
}

// ---- tests ------------------------------------------------------------------

/// Every corpus file has a sidecar `<file>.expected` holding what the front
/// end makes of it ([`outcome`]), so a bad input that starts to parse, or an
/// error that moves or changes, fails here. After an intended change,
/// rewrite the sidecars with
/// `FUSION_BLESS=1 cargo test -p fusion-compiler --test fuzz corpus` and review
/// the diff.
#[test]
fn corpus_replays_to_its_expected_outcomes_with_located_errors() {
    let dir = corpus_dir();
    let blessing = std::env::var_os("FUSION_BLESS").is_some_and(|v| v == "1");
    type Replay = fn(&str) -> Result<String, TestCaseError>;
    let replay: [(&str, Replay); 3] = [
        ("toml", toml_outcome),
        ("expr", |text| expr_outcomes(text.trim_end())),
        ("graph", macro_outcome),
    ];
    let mut replayed = Vec::new();
    let mut report = Vec::new();
    for (ext, run) in replay {
        for file in files_with(&dir, ext) {
            let text = std::fs::read_to_string(&file).unwrap();
            let actual = run(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display())) + "\n";
            let sidecar = expected_path(&file);
            let name = file.file_name().unwrap().to_string_lossy().into_owned();
            if blessing {
                std::fs::write(&sidecar, &actual).unwrap_or_else(|e| panic!("{}: {e}", sidecar.display()));
            } else {
                match std::fs::read_to_string(&sidecar) {
                    Ok(expected) if expected == actual => {}
                    Ok(expected) => report.push(format!("{name}: expected\n{expected}but got\n{actual}")),
                    Err(_) => report.push(format!("{name}: no {name}.expected; got\n{actual}")),
                }
            }
            replayed.push(sidecar);
        }
    }
    for sidecar in files_with(&dir, "expected") {
        if !replayed.contains(&sidecar) {
            let name = sidecar.file_name().unwrap().to_string_lossy().into_owned();
            report.push(format!("{name}: no corpus file beside it"));
        }
    }
    assert!(replayed.len() >= 10, "the corpus in {} is missing", dir.display());
    assert!(
        report.is_empty(),
        "{}\n(after an intended change: FUSION_BLESS=1 cargo test -p fusion-compiler --test fuzz corpus)",
        report.join("\n")
    );
}

/// `cycle.toml` → `cycle.toml.expected`.
fn expected_path(file: &Path) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".expected");
    PathBuf::from(name)
}

#[test]
fn a_short_fuzz_run_of_each_kind() {
    assert!(run_toml(&Budget::quick(300)) >= 900);
    assert!(run_expressions(&Budget::quick(300)) >= 1200);
}

#[test]
#[ignore = "long: set FUSION_FUZZ_SECONDS or FUSION_FUZZ_CASES"]
fn fuzz_toml() {
    let cases = run_toml(&per_kind(Budget::from_env(30_000)));
    eprintln!("fuzz_toml: {cases} cases in all");
}

#[test]
#[ignore = "long: set FUSION_FUZZ_SECONDS or FUSION_FUZZ_CASES"]
fn fuzz_expressions() {
    let cases = run_expressions(&per_kind(Budget::from_env(30_000)));
    eprintln!("fuzz_expressions: {cases} cases in all");
}

#[test]
fn the_property_itself_catches_unlocated_errors() {
    // A checker that accepted everything would make the runs above
    // meaningless: an error without a span must fail it.
    use fusion_compiler::diagnostic::{Diagnostic, Span};
    let source = SourceFile::new("fuzz.toml", "a = 1\n");
    let unlocated = Diagnostics(vec![Diagnostic::new(Span::None, "lost")]);
    assert!(check_located(&source, &unlocated).is_err());
    let located = Diagnostics(vec![Diagnostic::new(Span::source(0, 1), "here")]);
    assert!(check_located(&source, &located).is_ok());
}
