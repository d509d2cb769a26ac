//! Weights bound from safetensors files written by the test, under Hugging
//! Face names, run and compared with the CPU reference: a TOML graph of
//! the built-in library (the Llama-3-8B FFN sub-layer) held with its owned
//! weights in a model struct. GPU only (`#[ignore]`d; see `docs/errors.md`
//! and `weights::tests` for the checks without one).

mod support;

use fusion::core::reference::{self, Bindings, HostTensor};
use fusion::cudarc::driver::CudaStream;
use fusion::half::{bf16, f16};
use fusion::{Element, TensorFile, TensorNames, kernels, testing};
use std::sync::Arc;
use support::{TestElement, rng, stream};

/// A model that holds its layer's weights and kernels together: what
/// borrowed weights could not do without self-reference.
struct Model<T: TestElement> {
    ffn: kernels::FfnSublayer<'static, T>,
}

/// The weights of `host` as a safetensors file, each stored as `names`
/// maps it.
fn write_weights<T: TestElement>(
    graph: &fusion::core::ir::Graph,
    host: &Bindings,
    names: &TensorNames,
) -> Vec<u8> {
    let tensors: Vec<_> = graph
        .weights
        .iter()
        .map(|&t| {
            let name = &graph.tensor(t).name;
            let value = &host[name];
            let bytes = T::to_le_bytes(&T::encode(value));
            (names.in_file(name), T::DTYPE, value.shape.clone(), bytes)
        })
        .collect();
    fusion::weights::serialize(&tensors).expect("the test's tensors serialize")
}

fn ffn_sublayer_from_hugging_face_names<T: TestElement>(s: &Arc<CudaStream>, m: usize) {
    let graph = support::graph("ffn_sublayer", T::DTYPE);
    let host = reference::random_bindings(&graph, &[("M", m)], &mut rng()).expect("bindings");
    let names = TensorNames::hugging_face(0);
    let bytes = write_weights::<T>(&graph, &host, &names);
    let dir = std::env::temp_dir().join(format!("fusion-gpu-safetensors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("ffn_sublayer_{}.safetensors", T::DTYPE));
    std::fs::write(&path, bytes).expect("write the file");
    let file = TensorFile::open(&path).expect("the file reads");
    assert!(
        file.get("model.layers.0.mlp.gate_proj.weight").is_some(),
        "{:?}",
        file.names().collect::<Vec<_>>()
    );

    let mut model = Model::<T> {
        ffn: kernels::FfnSublayer::from_safetensors(s, &file, &names).expect("weights bind"),
    };
    drop(file);
    let cols = host["x"].shape[1];
    let x = s.clone_htod(&T::encode(&host["x"])).expect("upload");
    let mut y = s.clone_htod(&vec![T::NAN; m * cols]).expect("alloc");
    model
        .ffn
        .run(
            s,
            &fusion::Tensor::new(&x, [m, cols]).expect("x"),
            &mut fusion::TensorMut::new(&mut y, [m, cols]).expect("y"),
        )
        .expect("run");
    let rows = testing::rows_to_check(m, &mut rng());
    let got = T::decode(&[m, cols], &s.clone_dtoh(&y).expect("download"))
        .expect("shape")
        .select_rows(&rows)
        .expect("rows");
    let want: &HostTensor = &reference::evaluate_rows(&graph, &host, &rows).expect("reference")["y"];
    let error = testing::compare(&got, want, T::DTYPE, &rows)
        .unwrap_or_else(|mismatch| panic!("ffn_sublayer {} at M = {m}: {mismatch}", T::DTYPE));
    eprintln!(
        "ffn_sublayer {} M = {m}: relative error {error:.2e} over {} rows",
        T::DTYPE,
        rows.len()
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_toml_graph_binds_hugging_face_weights_from_safetensors_and_matches_the_reference() {
    let s = stream();
    for m in [1, 300] {
        ffn_sublayer_from_hugging_face_names::<f16>(&s, m);
        ffn_sublayer_from_hugging_face_names::<bf16>(&s, m);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_file_of_another_dtype_is_refused_before_any_upload() {
    let s = stream();
    let graph = support::graph("ffn_sublayer", f16::DTYPE);
    let host = reference::random_bindings(&graph, &[("M", 8)], &mut rng()).expect("bindings");
    let names = TensorNames::hugging_face(0);
    let file = TensorFile::from_bytes("bf16.safetensors", write_weights::<bf16>(&graph, &host, &names))
        .expect("the file reads");
    let e = kernels::FfnSublayer::<f16>::from_safetensors(&s, &file, &names).unwrap_err();
    assert!(matches!(e, fusion::Error::TensorDType { .. }), "{e}");
}
