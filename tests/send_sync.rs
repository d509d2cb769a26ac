//! The run-time types cross threads exactly where that is safe (see the
//! `# Threads` sections of `fusion::tensor` and of the generated graph
//! structs). Compile-time checks: this file does not build if one of them
//! loses `Send` or `Sync`. No GPU needed.

use fusion::half::{bf16, f16};
use fusion::launch::Workspace;
use fusion::{Arch, Error, Shape, Tensor, TensorMut, kernels};

fn assert_send<T: Send>() {}
fn assert_sync<T: Sync>() {}

fn send_and_sync<T: Send + Sync>() {
    assert_send::<T>();
    assert_sync::<T>();
}

#[test]
fn views_are_send_and_sync() {
    send_and_sync::<Tensor<'static, f16>>();
    send_and_sync::<Tensor<'static, bf16>>();
    send_and_sync::<TensorMut<'static, f16>>();
    send_and_sync::<TensorMut<'static, bf16>>();
    send_and_sync::<Shape>();
    send_and_sync::<fusion::TensorFile>();
    send_and_sync::<fusion::TensorNames>();
}

#[test]
fn graph_structs_and_their_workspace_are_send_and_sync() {
    // Sharing one across threads gives `&self`, and `run` needs `&mut self`:
    // two threads cannot run one struct at once.
    send_and_sync::<kernels::SwigluFfn<'static, f16>>();
    send_and_sync::<kernels::LlamaFfn<'static, bf16>>();
    send_and_sync::<kernels::Gpt2Mlp<'static, f16>>();
    send_and_sync::<kernels::GemmBiasGelu<'static, f16>>();
    send_and_sync::<kernels::LayernormGemm<'static, f16>>();
    send_and_sync::<Workspace>();
    // One workspace shared by structs run from several threads.
    send_and_sync::<fusion::SharedWorkspace>();
    send_and_sync::<fusion::BoundWeights<'static, f16>>();
}

#[test]
fn errors_and_arch_are_send_and_sync() {
    // So that an error can be returned from a worker thread (`JoinHandle`)
    // or boxed as `dyn Error + Send + Sync`.
    send_and_sync::<Error>();
    send_and_sync::<Arch>();
    let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(Error::Aliasing {
        output: "y".into(),
        input: "x".into(),
    });
    assert!(boxed.to_string().contains("overlaps input `x`"));
}
