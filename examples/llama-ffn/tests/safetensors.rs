//! A `fusion_graph!` graph bound from a safetensors file under Hugging Face
//! names, held with its owned weights in a model struct, run on fresh
//! random inputs and compared with the CPU reference. Needs a GPU.

use fusion::core::reference::{self, HostTensor};
use fusion::half::f16;
use fusion::{TensorFile, TensorMut, TensorNames, testing};
use llama_ffn::model::SwigluFfn;
use rand::SeedableRng;

/// One decoder layer's feed-forward block, weights and kernels together.
struct Layer {
    ffn: SwigluFfn<'static>,
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_macro_graph_binds_hugging_face_weights_from_safetensors_and_matches_the_reference() {
    let stream = testing::open_gpu(0)
        .and_then(|ctx| ctx.new_stream().map_err(|e| e.to_string()))
        .unwrap_or_else(|e| panic!("{e}"));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let graph = SwigluFfn::graph();
    let m = 300;
    let host = reference::random_bindings(&graph, &[("M", m)], &mut rng).expect("bindings");

    // The checkpoint a PyTorch model would save, layer 5 of it.
    let names = TensorNames::hugging_face(5);
    let tensors: Vec<_> = graph
        .weights
        .iter()
        .map(|&t| {
            let name = &graph.tensor(t).name;
            let bytes = <f16 as fusion::Element>::to_le_bytes(&host[name].to_f16());
            (
                names.in_file(name),
                fusion::ir::DType::F16,
                host[name].shape.clone(),
                bytes,
            )
        })
        .collect();
    let bytes = fusion::weights::serialize(&tensors).expect("serialize");
    let file = TensorFile::from_bytes("layer5.safetensors", bytes).expect("the file reads");
    assert!(file.get("model.layers.5.mlp.down_proj.weight").is_some());
    let mut layer = Layer {
        ffn: SwigluFfn::from_safetensors(&stream, &file, &names).expect("weights bind"),
    };
    drop(file);

    let cols = host["x"].shape[1];
    let x = stream.clone_htod(&host["x"].to_f16()).expect("upload");
    let mut y = stream.clone_htod(&vec![f16::NAN; m * cols]).expect("alloc");
    layer
        .ffn
        .run(
            &stream,
            &fusion::Tensor::new(&x, [m, cols]).expect("x"),
            &mut TensorMut::new(&mut y, [m, cols]).expect("y"),
        )
        .expect("run");
    let rows = testing::rows_to_check(m, &mut rng);
    let got = HostTensor::from_f16(&[m, cols], &stream.clone_dtoh(&y).expect("download"))
        .and_then(|t| t.select_rows(&rows))
        .expect("rows");
    let want = &reference::evaluate_rows(&graph, &host, &rows).expect("reference")["y"];
    let error = testing::compare(&got, want, fusion::ir::DType::F16, &rows)
        .unwrap_or_else(|mismatch| panic!("SwigluFfn from safetensors: {mismatch}"));
    eprintln!("relative error {error:.2e} over {} rows", rows.len());
}
