//! `fusion run` on a GPU: TOML graphs written by the test, run on
//! safetensors files it writes, with the kernels built by nvcc at run time.
//! Each output file is read back and compared with the CPU reference here,
//! beside the run's own `--check`. GPU and nvcc only (`#[ignore]`d; the
//! checks of the files without a GPU are `fusion_cli::run`'s unit tests).

#[path = "../../tests/support/mod.rs"]
mod support;

use fusion::core::ir::Graph;
use fusion::core::reference::{self, Bindings};
use fusion::half::f16;
use fusion::{Element, TensorFile, TensorNames, testing};
use fusion_cli::run::{Settings, run};
use std::path::{Path, PathBuf};
use support::{TestElement, rng};

/// An FFN sub-layer at small sizes: a norm folded into a gated pair, the
/// down projection with the residual (two GEMM kernels; `fusion tune`'s
/// GPU test tunes it too).
const SUBLAYER: &str = include_str!("graphs/small_sublayer.toml");

/// Two outputs of kernels without a GEMM: a standalone LayerNorm and an
/// elementwise chain.
const NORM_AND_CHAIN: &str = r#"
[graph]
name = "norm_and_chain"
[dims]
M = "dyn"
D = 72
[inputs]
x = "f16[M, D]"
u = "f16[M, D]"
[weights]
g = "f16[D]"
b = "f16[D]"
[outputs]
n = "layernorm(x, g, b)"
y = "silu(x) * u"
"#;

/// Two outputs of two row counts: `y` has M rows and `z` T rows, so one
/// can be empty while the other is not.
const TWO_ROW_COUNTS: &str = r#"
[graph]
name = "two_row_counts"
[dims]
M = "dyn"
T = "dyn"
D = 16
N = 8
[inputs]
x = "f16[M, D]"
u = "f16[T, D]"
[weights]
w = "f16[N, D]"
[outputs]
y = "x @ w^T"
z = "relu(u)"
"#;

fn folder(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusion-gpu-run-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `tensors` of `host` as a safetensors file at `path`, each under `names`.
fn write(
    path: &Path,
    graph: &Graph,
    host: &Bindings,
    tensors: &[fusion::core::ir::TensorId],
    names: &TensorNames,
) {
    let stored: Vec<_> = tensors
        .iter()
        .map(|&t| {
            let name = &graph.tensor(t).name;
            let value = &host[name];
            let bytes = <f16 as Element>::to_le_bytes(&<f16 as TestElement>::encode(value));
            (
                names.in_file(name),
                <f16 as Element>::DTYPE,
                value.shape.clone(),
                bytes,
            )
        })
        .collect();
    std::fs::write(path, fusion::weights::serialize(&stored).expect("serializes")).expect("write");
}

/// The graph `toml` written to a fresh folder `name`, random tensors for
/// `dims` written beside it (the weights under `names`), and the settings of
/// a `fusion run` of it into `y.safetensors` there, without `--check` or
/// `--time`.
fn prepare(
    name: &str,
    toml: &str,
    dims: &[(&str, usize)],
    names: TensorNames,
) -> (PathBuf, Graph, Bindings, Settings) {
    let dir = folder(name);
    let graph_path = dir.join("graph.toml");
    std::fs::write(&graph_path, toml).expect("write the graph");
    let graph = fusion::core::load_toml_graph(&graph_path).expect("the graph loads");
    let host = reference::random_bindings(&graph, dims, &mut rng()).expect("bindings");
    let (inputs, weights, out) = (
        dir.join("x.safetensors"),
        dir.join("w.safetensors"),
        dir.join("y.safetensors"),
    );
    write(&inputs, &graph, &host, &graph.inputs, &TensorNames::declared());
    write(&weights, &graph, &host, &graph.weights, &names);
    let settings = Settings {
        graph: graph_path,
        dtype: None,
        inputs,
        weights: Some(weights),
        weight_names: names,
        out: Some(out),
        check: false,
        time: None,
        // One per graph: the tests run at once. A graph's second run
        // (another M) finds its libraries built.
        work: std::env::temp_dir().join(format!("fusion-gpu-run-work-{}", graph.name)),
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    (dir, graph, host, settings)
}

/// Runs the graph `toml` with `--check --time 5` at `m` rows on random
/// tensors, its weights under `names`, and compares each output file's
/// tensor with the reference on sampled rows.
fn run_and_compare(toml: &str, m: usize, names: TensorNames) {
    let (dir, graph, host, mut settings) = prepare(&format!("{}-{m}", toml.len()), toml, &[("M", m)], names);
    let out = settings.out.clone().expect("an output file");
    settings.check = true;
    settings.time = Some(5);
    let mut said = Vec::new();
    let result = run(&settings, &mut said);
    let said = String::from_utf8_lossy(&said);
    eprintln!("{said}");
    result.unwrap_or_else(|e| panic!("{} at M = {m}: {e}", graph.name));
    assert!(said.contains("match the CPU reference"), "{said}");
    assert!(said.contains("µs per call"), "{said}");

    let file = TensorFile::open(&out).expect("the output file reads");
    let rows = testing::rows_to_check(m, &mut rng());
    let want = reference::evaluate_rows(&graph, &host, &rows).expect("reference");
    for &t in &graph.outputs {
        let name = &graph.tensor(t).name;
        let view = file
            .get(name)
            .unwrap_or_else(|| panic!("no `{name}` in the output file"));
        assert_eq!(view.element_type(), Some(<f16 as Element>::DTYPE));
        let cols = host["x"].shape[1];
        assert_eq!(view.shape, [m, cols]);
        let got = <f16 as TestElement>::decode(view.shape, &<f16 as Element>::from_le_bytes(view.bytes))
            .and_then(|t| t.select_rows(&rows))
            .expect("rows");
        let error = testing::compare(&got, &want[name.as_str()], <f16 as Element>::DTYPE, &rows)
            .unwrap_or_else(|mismatch| panic!("{} `{name}` at M = {m}: {mismatch}", graph.name));
        eprintln!(
            "{} `{name}` at M = {m}: relative L2 error {error:.2e}",
            graph.name
        );
    }
    std::fs::remove_dir_all(&dir).expect("remove the temp dir");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_sublayer_runs_from_hugging_face_names_and_matches_the_reference() {
    for m in [1, 300] {
        run_and_compare(SUBLAYER, m, TensorNames::hugging_face(3));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_norm_and_an_elementwise_chain_run_and_match_the_reference() {
    run_and_compare(NORM_AND_CHAIN, 77, TensorNames::declared());
}

/// M = 0 empties `y`, whose GEMM is not launched; `z` (T = 5 rows) is
/// still computed: the call was once skipped whole, leaving `z` as the
/// run's NaN poison.
#[test]
#[ignore = "needs a CUDA GPU"]
fn an_empty_output_leaves_the_others_computed() {
    let t = 5;
    let (dir, _, host, settings) = prepare(
        "two-row-counts",
        TWO_ROW_COUNTS,
        &[("M", 0), ("T", t)],
        TensorNames::declared(),
    );
    let out = settings.out.clone().expect("an output file");
    let mut said = Vec::new();
    let result = run(&settings, &mut said);
    eprintln!("{}", String::from_utf8_lossy(&said));
    result.unwrap_or_else(|e| panic!("{e}"));

    let file = TensorFile::open(&out).expect("the output file reads");
    assert_eq!(file.get("y").expect("y").shape, [0, 8]);
    let z = file.get("z").expect("z");
    assert_eq!(z.shape, [t, 16]);
    // ReLU is exact in f16.
    let want: Vec<f32> = <f16 as TestElement>::encode(&host["u"])
        .iter()
        .map(|v| v.to_f32().max(0.0))
        .collect();
    let got: Vec<f32> = <f16 as Element>::from_le_bytes(z.bytes)
        .iter()
        .map(|v| v.to_f32())
        .collect();
    assert_eq!(got, want, "z = relu(u)");
    std::fs::remove_dir_all(&dir).expect("remove the temp dir");
}

/// The struct a build generates and `fusion run` of the same TOML file run
/// their plans through one executor (`fusion::plan`): bound from the same
/// files, they write the same bits.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fusion_run_and_the_generated_struct_write_the_same_bits() {
    use fusion::kernels::LayernormGemmSiluGluResidual as Block;
    use fusion::{Shape, Tensor, TensorMut};
    let toml = std::fs::read_to_string(testing::graphs_dir().join("layernorm_gemm_silu_glu_residual.toml"))
        .expect("the shipped graph");
    let (m, k, n) = (300, 256, 512);
    let (dir, _, _, settings) = prepare(
        "same-bits",
        &toml,
        &[("M", m), ("K", k), ("N", n)],
        TensorNames::declared(),
    );
    let mut said = Vec::new();
    let result = run(&settings, &mut said);
    eprintln!("{}", String::from_utf8_lossy(&said));
    result.unwrap_or_else(|e| panic!("{e}"));
    let ran =
        TensorFile::open(settings.out.as_ref().expect("an output file")).expect("the output file reads");

    let ctx = testing::open_gpu(0).expect("a GPU");
    let stream = ctx.new_stream().expect("a stream");
    let weights = TensorFile::open(settings.weights.as_ref().expect("a weights file")).expect("weights");
    let mut block =
        Block::<f16>::from_safetensors(&stream, &weights, &TensorNames::declared()).expect("binds");
    let inputs = TensorFile::open(&settings.inputs).expect("inputs");
    let upload = |name: &str| {
        let view = inputs.get(name).expect("an input");
        let values = <f16 as Element>::from_le_bytes(view.bytes);
        let shape = Shape::Matrix(view.shape[0], view.shape[1]);
        (stream.clone_htod(&values).expect("copies"), shape)
    };
    let ((x, x_shape), (r, r_shape)) = (upload("x"), upload("r"));
    let mut h = stream.alloc_zeros::<f16>(m * n).expect("allocates");
    block
        .run(
            &stream,
            &Tensor::new(&x, x_shape).expect("x"),
            &Tensor::new(&r, r_shape).expect("r"),
            &mut TensorMut::new(&mut h, Shape::Matrix(m, n)).expect("h"),
        )
        .expect("runs");
    let got = stream.clone_dtoh(&h).expect("reads back");
    let want = ran.get("h").expect("`h` in the run's output file");
    assert_eq!(want.shape, [m, n]);
    assert!(
        <f16 as Element>::to_le_bytes(&got) == want.bytes,
        "the struct's `h` differs from fusion run's"
    );
    std::fs::remove_dir_all(&dir).expect("remove the temp dir");
}
