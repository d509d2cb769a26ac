//! The `fusion` binary as a user runs it: failures are one readable message
//! on stderr and exit status 1, never a panic.

use std::process::Command;

fn fusion() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fusion"))
}

#[test]
fn a_missing_graph_file_exits_1_with_a_message() {
    let path = std::env::temp_dir().join(format!("fusion-cli-{}-absent.toml", std::process::id()));
    let output = fusion().arg("plan").arg(&path).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.starts_with("error: cannot read "), "{stderr}");
    assert!(stderr.contains("absent.toml"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn plan_without_a_graph_is_a_usage_error() {
    let output = fusion().arg("plan").output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("GRAPH.toml"), "{stderr}");
}

fn graphs() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
}

#[test]
fn plan_works_for_every_shipped_graph() {
    let files = graphs();
    assert!(files.len() >= 12, "{files:?}");
    for file in files {
        let output = fusion().arg("plan").arg(&file).output().unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(
            output.status.success(),
            "{}: {}",
            file.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        let name = file.file_stem().unwrap().to_str().unwrap();
        assert!(stdout.starts_with(&format!("graph `{name}`")), "{stdout}");
    }
}

#[test]
fn plan_of_the_ffn_shows_two_kernels_and_writes_dot() {
    let dot = std::env::temp_dir().join(format!("fusion-cli-{}-ffn.dot", std::process::id()));
    let output = fusion()
        .args(["plan", "graphs/swiglu_ffn.toml", "--dot"])
        .arg(&dot)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .unwrap();
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.starts_with("graph `swiglu_ffn`: 7 ops → 2 kernels"),
        "{stdout}"
    );
    for pattern in ["gemm_silu_glu", "gemm_bias_residual"] {
        assert!(stdout.contains(pattern), "{stdout}");
    }
    let text = std::fs::read_to_string(&dot).unwrap();
    std::fs::remove_file(&dot).unwrap();
    assert_eq!(text.matches("subgraph cluster_").count(), 2, "{text}");
}

#[test]
fn a_bad_graph_is_reported_with_file_line_and_column() {
    let path = std::env::temp_dir().join(format!("fusion-cli-{}-bad.toml", std::process::id()));
    std::fs::write(
        &path,
        "[graph]\nname = \"g\"\n[dims]\nM = \"dyn\"\n[inputs]\nx = \"f16[M, 8]\"\n[outputs]\ny = \"silux(x)\"\n",
    )
    .unwrap();
    let output = fusion().arg("plan").arg(&path).output().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("-bad.toml:8:6: error: unknown op `silux`"),
        "{stderr}"
    );
}

/// Writes `text` to a scratch file and runs `fusion plan` on it: exit code,
/// stdout, stderr.
fn plan_text(name: &str, text: &str) -> (Option<i32>, String, String) {
    let path = std::env::temp_dir().join(format!("fusion-cli-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let output = fusion().arg("plan").arg(&path).output().unwrap();
    std::fs::remove_file(&path).unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (output.status.code(), text(output.stdout), text(output.stderr))
}

/// The planner is dtype-agnostic: an FP8 graph plans like any other, with
/// its scales in the operands' types, and the plan says that a build
/// refuses it.
#[test]
fn an_fp8_graph_plans_and_says_no_kernel_is_generated_for_it() {
    let text = "[graph]\nname = \"fp8\"\n[dims]\nM = \"dyn\"\nK = 64\nN = 32\n\
                [inputs]\nx = \"f8e4m3[M, K] scale x_scale\"\n\
                [weights]\nx_scale = \"f32[1]\"\nw = \"f8e4m3[N, K] scale w_scale\"\nw_scale = \"f32[N]\"\nb = \"bf16[N]\"\n\
                [outputs]\ny = \"silu(x @ w^T + b)\"\n";
    let (code, stdout, stderr) = plan_text("fp8", text);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("#0  gemm_bias_silu  (named pattern)"), "{stdout}");
    assert!(stdout.contains("x  f8e4m3[M, 64] scale x_scale"), "{stdout}");
    assert!(stdout.contains("out   y  bf16[M, 32]"), "{stdout}");
    assert!(
        stdout.contains(
            "note: graph `fp8`: FP8 kernels are not generated yet, and `x` and `w` are f8e4m3; \
             the front ends, the IR's checks and the CPU reference take FP8 graphs, but no GPU mainloop \
             computes them: a build refuses this graph unless it sets FUSION_FP8=experimental (sm90 FP8 \
             GEMMs, checked on a GPU, not yet timed); the plan above is how it is split"
        ),
        "{stdout}"
    );
}

const HEADER: &str = "[graph]\nname = \"g\"\n[dims]\nM = \"dyn\"\nD = 64\n[inputs]\nx = \"f16[M, D]\"\n";

#[test]
fn deep_and_long_graphs_plan_or_fail_with_a_located_error_never_a_crash() {
    let nest = |open: &str, close: &str, depth: usize| {
        format!(
            "{HEADER}[outputs]\ny = \"{}x{}\"\n",
            open.repeat(depth),
            close.repeat(depth)
        )
    };
    // At the `(` one past the limit of 64.
    for (name, text, column) in [
        ("parens", nest("(", ")", 5_000), 6 + 64),
        ("calls", nest("relu(", ")", 10_000), 6 + 64 * 5 + 4),
    ] {
        let (code, _, stderr) = plan_text(name, &text);
        assert_eq!(code, Some(1), "{name}: {stderr}");
        let expected = format!(".toml:9:{column}: error: brackets nest more than 64 deep");
        assert!(
            stderr.contains(&expected),
            "{name}: {}",
            &stderr[..stderr.len().min(300)]
        );
    }
    let sum = format!("{HEADER}[outputs]\ny = \"{}\"\n", vec!["x"; 20_000].join(" + "));
    let outputs: String = (0..20_000).map(|i| format!("y{i} = \"relu(x)\"\n")).collect();
    let mut compute: String = (0..9_999)
        .map(|i| format!("c{i} = \"relu(c{})\"\n", i + 1))
        .collect();
    compute.push_str("c9999 = \"relu(x)\"\n");
    // Elementwise ops that follow one another chain four to a kernel.
    for (name, text, first_line) in [
        ("sum", sum, "graph `g`: 19999 ops → 5000 kernels"),
        (
            "outputs",
            format!("{HEADER}[outputs]\n{outputs}"),
            "graph `g`: 20000 ops → 20000 kernels",
        ),
        (
            "compute",
            format!("{HEADER}[compute]\n{compute}[outputs]\ny = \"relu(c0)\"\n"),
            "graph `g`: 10001 ops → 2501 kernels",
        ),
    ] {
        let (code, stdout, stderr) = plan_text(name, &text);
        assert_eq!(code, Some(0), "{name}: {stderr}");
        assert!(
            stdout.starts_with(first_line),
            "{name}: {}",
            &stdout[..stdout.len().min(200)]
        );
    }
}

#[test]
fn a_graph_file_past_the_size_limit_is_refused_without_reading_it_all() {
    let padding = "#".repeat(1024 * 1024);
    let (code, _, stderr) = plan_text("huge", &format!("{HEADER}{padding}\n"));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.starts_with("error: cannot read "), "{stderr}");
    assert!(
        stderr.contains("it is larger than 1024 KiB, the most a graph file may be"),
        "{stderr}"
    );
    // A file that never ends: read up to the limit, not until memory runs out.
    if std::path::Path::new("/dev/zero").exists() {
        let output = fusion().args(["plan", "/dev/zero"]).output().unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains("larger than 1024 KiB"), "{stderr}");
    }
}

#[test]
fn a_bad_bench_dtype_is_refused_before_any_gpu_work() {
    // No GPU is needed to refuse it: the check comes first.
    let output = fusion()
        .args(["bench", "--dtype", "f32", "--kernel", "gemm"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("--dtype f32: expected f16 or bf16"), "{stderr}");
}

#[test]
fn tune_list_prints_each_gemm_kernels_candidates_and_pruning_counts() {
    let graph = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/gemm_bias_gelu.toml");
    let output = fusion()
        .args(["tune", "--list", "--arch", "sm75,sm90"])
        .arg(&graph)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("graph `gemm_bias_gelu` ("), "{stdout}");
    let unchecked = "not yet checked: blocks per SM, compile, shared memory, threads, registers";
    assert_eq!(
        lines[1],
        format!("#0 gemm_bias_gelu f16 [N, K] on sm75: 32 candidates, 0 pruned; {unchecked}")
    );
    assert_eq!(
        lines[2],
        r#"  {"bm":64,"bn":64,"bk":32,"warp_m":32,"warp_n":32,"stages":2,"min_blocks_per_sm":1,"pipelined":false,"staged_store":false}"#
    );
    assert_eq!(
        lines[34],
        format!("#0 gemm_bias_gelu f16 [N, K] on sm90: 168 candidates, 0 pruned; {unchecked}")
    );
    assert_eq!(lines.len(), 1 + 1 + 32 + 1 + 168, "{stdout}");
}

#[test]
fn a_tuning_run_is_for_one_arch_and_is_refused_before_the_gpu() {
    let graph = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/gemm.toml");
    let output = fusion()
        .args(["tune", "--arch", "sm80,sm90"])
        .arg(&graph)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.trim(), "error: --arch: a tuning run tunes for one arch");
    let output = fusion()
        .args(["tune", "--dtype", "f32"])
        .arg(&graph)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.trim(), "error: --dtype f32: expected f16 or bf16");
    let output = fusion()
        .args(["tune", "--dim", "N3000"])
        .arg(&graph)
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("`N3000` is not NAME=SIZE with a positive whole size"),
        "{stderr}"
    );
}

#[test]
fn tune_report_prints_a_caches_entries_against_shipped_and_cublaslt() {
    let dir = std::env::temp_dir().join(format!("fusion-cli-tune-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = dir.join("tuned.json");
    std::fs::write(
        &cache,
        r#"{ "version": 1, "entries": {
             "gemm_bias_gelu.f16.nk.n3000.k1000.sm90.m<=1024": {
               "tile": { "bm": 128, "bn": 128, "bk": 64, "stages": 6 },
               "time_us": 40.0, "default_time_us": 48.0, "cublaslt_time_us": 42.0,
               "gpu": "NVIDIA H200", "driver": "580.159.04", "nvcc": "13.0", "date": "2026-12-02" },
             "nonsense": {} } }"#,
    )
    .unwrap();
    let output = fusion().args(["tune", "--report"]).arg(&cache).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].contains("entry `nonsense`"), "{stdout}");
    let row = lines
        .iter()
        .find(|l| l.starts_with("gemm_bias_gelu.f16.nk.n3000.k1000.sm90.m<=1024"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let numbers: Vec<&str> = row.split_whitespace().skip(1).take(5).collect();
    assert_eq!(numbers, ["40.0", "48.0", "42.0", "1.200", "1.050"], "{row}");
    assert!(row.contains("128x128x64 (6 stages"), "{row}");
    assert!(lines.last().unwrap().starts_with("1 entries"), "{stdout}");
    // A missing cache, or a file that is not one, is an error.
    let missing = fusion()
        .args(["tune", "--report"])
        .arg(dir.join("none.json"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no tuned cache at"));
    std::fs::write(&cache, "{ not json").unwrap();
    let broken = fusion().args(["tune", "--report"]).arg(&cache).output().unwrap();
    assert_eq!(broken.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&broken.stderr).contains("is not a tuned cache"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fusion run`'s files are read and checked against the graph before any
/// GPU or nvcc work, so these fail the same on a machine without either.
#[test]
fn fusion_run_names_an_unreadable_or_mismatched_tensor_file_before_any_gpu_work() {
    let graph = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/gemm_bias.toml");
    let dir = std::env::temp_dir().join(format!("fusion-cli-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |inputs: &std::path::Path| {
        let output = fusion()
            .arg("run")
            .arg(&graph)
            .arg("--inputs")
            .arg(inputs)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let absent = dir.join("absent.safetensors");
    let stderr = run(&absent);
    assert!(
        stderr.starts_with("error: ") && stderr.contains("absent.safetensors: cannot read it"),
        "{stderr}"
    );

    let not_safetensors = dir.join("x.safetensors");
    std::fs::write(&not_safetensors, b"not a safetensors file").unwrap();
    let stderr = run(&not_safetensors);
    assert!(stderr.contains("not a safetensors file"), "{stderr}");
    // A file that never ends is refused once its header is read, not read
    // until memory runs out.
    let stderr = run(std::path::Path::new("/dev/zero"));
    assert!(
        stderr.starts_with("error: /dev/zero: not a safetensors file"),
        "{stderr}"
    );

    // gemm_bias takes x [M, K]: a vector is refused with both shapes named.
    let bytes =
        fusion::weights::serialize(&[("x".into(), fusion::core::ir::DType::F16, vec![16], vec![0; 32])])
            .unwrap();
    let vector_x = dir.join("vector.safetensors");
    std::fs::write(&vector_x, bytes).unwrap();
    let stderr = run(&vector_x);
    assert!(
        stderr.contains("`x` in ") && stderr.contains("has shape [16] but the graph declares [M, K]"),
        "{stderr}"
    );

    // --dtype re-types the graph: an f16 file is refused for a bf16 run,
    // and an element type kernels do not take is refused as an argument.
    let run_as = |dtype: &str| {
        let output = fusion()
            .arg("run")
            .arg(&graph)
            .args(["--dtype", dtype, "--inputs"])
            .arg(&vector_x)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(1));
        String::from_utf8(output.stderr).unwrap()
    };
    let stderr = run_as("bf16");
    assert!(
        stderr.contains("holds F16 elements, but the graph runs in bf16"),
        "{stderr}"
    );
    let stderr = run_as("f32");
    assert!(stderr.contains("--dtype f32: expected f16 or bf16"), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
