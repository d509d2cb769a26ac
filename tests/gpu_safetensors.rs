//! Weights bound from safetensors files written by the test, under Hugging
//! Face names, run and compared with the CPU reference: a TOML graph of
//! the built-in library (the Llama-3-8B FFN sub-layer) held with its owned
//! weights in a model struct; and the device memory a bound struct holds:
//! each weight once, in the form its kernel reads. GPU only (`#[ignore]`d;
//! see `docs/errors.md` and `weights::tests` for the checks without one).

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
    let _alone = one_at_a_time();
    let s = stream();
    for m in [1, 300] {
        ffn_sublayer_from_hugging_face_names::<f16>(&s, m);
        ffn_sublayer_from_hugging_face_names::<bf16>(&s, m);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_file_of_another_dtype_is_refused_before_any_upload() {
    let _alone = one_at_a_time();
    let s = stream();
    let graph = support::graph("ffn_sublayer", f16::DTYPE);
    let host = reference::random_bindings(&graph, &[("M", 8)], &mut rng()).expect("bindings");
    let names = TensorNames::hugging_face(0);
    let file = TensorFile::from_bytes("bf16.safetensors", write_weights::<bf16>(&graph, &host, &names))
        .expect("the file reads");
    let e = kernels::FfnSublayer::<f16>::from_safetensors(&s, &file, &names).unwrap_err();
    assert!(matches!(e, fusion::Error::TensorDType { .. }), "{e}");
}

/// The tests of this file run one at a time: two of them measure the
/// device memory in use, which another test allocating beside them would
/// change.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static DEVICE_MEMORY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    DEVICE_MEMORY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Device memory in use now, all work on `s` done (a stream-ordered free
/// returns its memory to the driver at the next synchronization).
fn device_bytes_in_use(s: &Arc<CudaStream>) -> usize {
    s.synchronize().expect("synchronize");
    let (free, total) = s.context().mem_get_info().expect("memory info");
    total - free
}

/// The declared bytes of a graph's weights of element type `T`.
fn declared_weight_bytes<T: TestElement>(graph: &fusion::core::ir::Graph, host: &Bindings) -> usize {
    graph
        .weights
        .iter()
        .map(|&t| host[&graph.tensor(t).name].data.len() * size_of::<T>())
        .sum()
}

/// Binding from safetensors keeps each weight once: the Llama-3-8B FFN
/// sub-layer's gate and up live only interleaved, its gamma only folded
/// into them, and the device memory after binding is at most 1.01x the
/// bytes the kernels read (the declared weights' own bytes, with 8 bytes
/// of column terms per output column in place of gamma).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_struct_bound_from_safetensors_holds_each_weight_once() {
    let _alone = one_at_a_time();
    let s = stream();
    let graph = support::graph("ffn_sublayer", f16::DTYPE);
    let m = 64;
    let host = reference::random_bindings(&graph, &[("M", m)], &mut rng()).expect("bindings");
    let names = TensorNames::declared();
    let dir = std::env::temp_dir().join(format!("fusion-gpu-held-once-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("ffn_sublayer.safetensors");
    std::fs::write(&path, write_weights::<f16>(&graph, &host, &names)).expect("write the file");
    let file = TensorFile::open(&path).expect("the file reads");
    let declared = declared_weight_bytes::<f16>(&graph, &host);
    // A first binding loads the fold kernel (and what else a first use
    // allocates) before anything is measured.
    drop(kernels::FfnSublayer::<f16>::from_safetensors(&s, &file, &names).expect("weights bind"));

    let before = device_bytes_in_use(&s);
    let ffn = kernels::FfnSublayer::<f16>::from_safetensors(&s, &file, &names).expect("weights bind");
    let held = device_bytes_in_use(&s).saturating_sub(before);
    let read = ffn.weights().bytes();
    eprintln!(
        "ffn_sublayer bound: {held} bytes held on the device, {read} bytes read by the kernels, {declared} declared"
    );
    assert!(
        (held as f64) <= 1.01 * read as f64,
        "{held} bytes held for {read} bytes the kernels read"
    );
    assert!(
        (read as f64) <= 1.01 * declared as f64,
        "{read} bytes read, {declared} declared"
    );
    // What binding replaced is not kept, and says what became of it.
    for name in ["w_gate", "w_up", "gamma"] {
        let e = ffn.weights().get(name).unwrap_err();
        assert!(
            matches!(&e, fusion::Error::WeightNotKept { tensor, .. } if tensor == name),
            "{e}"
        );
        eprintln!("{e}");
    }
    assert!(ffn.weights().shape("w_gate").is_some());
    // Kept to compare with the copy `new` makes whole, below.
    let mut in_parts = ffn;

    // The same with owned weights given to `new`: the originals are freed
    // once their copies exist.
    let before = device_bytes_in_use(&s);
    let weights =
        kernels::FfnSublayerWeights::<'static, f16>::from_safetensors(&s, &file, &names).expect("upload");
    let uploaded = device_bytes_in_use(&s).saturating_sub(before);
    assert!(
        uploaded >= declared,
        "{uploaded} bytes uploaded for {declared} declared"
    );
    let ffn = kernels::FfnSublayer::new(&s, weights).expect("weights bind");
    let held = device_bytes_in_use(&s).saturating_sub(before);
    let read = ffn.weights().bytes();
    eprintln!("ffn_sublayer bound from owned weights: {held} bytes held, {read} read by the kernels");
    assert!(
        (held as f64) <= 1.01 * read as f64,
        "{held} bytes held for {read} bytes the kernels read"
    );
    assert_eq!(
        ffn.weights().kept().map(|(name, _)| name).collect::<Vec<_>>(),
        ["w_down"]
    );

    // And it computes what the reference does.
    let cols = host["x"].shape[1];
    let x = s.clone_htod(&f16::encode(&host["x"])).expect("upload");
    let mut y = s.clone_htod(&vec![f16::NAN; m * cols]).expect("alloc");
    let mut ffn = ffn;
    ffn.run(
        &s,
        &fusion::Tensor::new(&x, [m, cols]).expect("x"),
        &mut fusion::TensorMut::new(&mut y, [m, cols]).expect("y"),
    )
    .expect("run");
    let rows = testing::rows_to_check(m, &mut rng());
    let got = f16::decode(&[m, cols], &s.clone_dtoh(&y).expect("download"))
        .expect("shape")
        .select_rows(&rows)
        .expect("rows");
    let want: &HostTensor = &reference::evaluate_rows(&graph, &host, &rows).expect("reference")["y"];
    testing::compare(&got, want, f16::DTYPE, &rows)
        .unwrap_or_else(|mismatch| panic!("ffn_sublayer: {mismatch}"));
    // The pair interleaved part by part (from the file) is the pair
    // interleaved whole (by `new`), to the bit, norm folded in and terms.
    let copies = |ffn: &kernels::FfnSublayer<'static, f16>| -> Vec<(Vec<u8>, Vec<f32>)> {
        ffn.weights()
            .prepared()
            .iter()
            .flatten()
            .map(|copy| copy.to_host(&s).expect("download"))
            .collect()
    };
    let (whole, parts) = (copies(&ffn), copies(&in_parts));
    assert_eq!(whole.len(), parts.len());
    for (i, (whole, parts)) in whole.iter().zip(&parts).enumerate() {
        let differ = whole.0.iter().zip(&parts.0).filter(|(a, b)| a != b).count();
        assert_eq!(differ, 0, "copy {i}: {differ} of {} bytes differ", whole.0.len());
        assert!(
            whole
                .1
                .iter()
                .zip(&parts.1)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "copy {i}: the column terms differ"
        );
    }
    let mut y_parts = s.clone_htod(&vec![f16::NAN; m * cols]).expect("alloc");
    in_parts
        .run(
            &s,
            &fusion::Tensor::new(&x, [m, cols]).expect("x"),
            &mut fusion::TensorMut::new(&mut y_parts, [m, cols]).expect("y"),
        )
        .expect("run");
    let got = f16::decode(&[m, cols], &s.clone_dtoh(&y_parts).expect("download"))
        .expect("shape")
        .select_rows(&rows)
        .expect("rows");
    testing::compare(&got, want, f16::DTYPE, &rows)
        .unwrap_or_else(|mismatch| panic!("ffn_sublayer bound in parts: {mismatch}"));
    let _ = std::fs::remove_file(&path);
}

/// Binding borrowed weights keeps no copy it does not need: the struct's
/// own memory is its prepared copies alone, and the caller's weights it no
/// longer reads are not referenced.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_struct_bound_from_borrowed_weights_adds_only_its_copies() {
    let _alone = one_at_a_time();
    let s = stream();
    let graph = support::graph("ffn_sublayer", f16::DTYPE);
    let host = reference::random_bindings(&graph, &[("M", 8)], &mut rng()).expect("bindings");
    let upload = |name: &str| {
        let value = &host[name];
        (
            s.clone_htod(&f16::encode(value)).expect("upload"),
            value.shape.clone(),
        )
    };
    let [gamma, w_gate, w_up, w_down] = ["gamma", "w_gate", "w_up", "w_down"].map(upload);
    fn view(
        (slice, shape): &(fusion::cudarc::driver::CudaSlice<f16>, Vec<usize>),
    ) -> fusion::Tensor<'_, f16> {
        let shape = match shape.as_slice() {
            [n] => fusion::Shape::Vector(*n),
            [r, c] => fusion::Shape::Matrix(*r, *c),
            other => panic!("{other:?}"),
        };
        fusion::Tensor::new(slice, shape).expect("view")
    }
    let bind = || {
        kernels::FfnSublayer::new(
            &s,
            kernels::FfnSublayerWeights {
                gamma: view(&gamma),
                w_gate: view(&w_gate),
                w_up: view(&w_up),
                w_down: view(&w_down),
            },
        )
        .expect("weights bind")
    };
    // A first binding loads the fold kernel before anything is measured.
    drop(bind());
    let before = device_bytes_in_use(&s);
    let ffn = bind();
    let held = device_bytes_in_use(&s).saturating_sub(before);
    let prepared = ffn.weights().prepared_bytes();
    eprintln!("ffn_sublayer bound from borrowed weights: {held} bytes held, {prepared} prepared");
    assert!(
        (held as f64) <= 1.01 * prepared as f64,
        "{held} bytes held for {prepared} prepared"
    );
    assert!(ffn.weights().get("w_up").is_err());
    assert!(ffn.weights().get("w_down").is_ok());
}
