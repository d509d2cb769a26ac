//! Builds the GPT-2 MLP block with the programmatic API (no TOML), plans its
//! fused kernels and checks one output row against the CPU reference.
//!
//! Run with `cargo run --features testing --example plan_from_code`.

use fusion::core::fuse;
use fusion::core::ir::{DType, GraphBuilder, WeightLayout};
use fusion::core::reference;
use rand::SeedableRng;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut b = GraphBuilder::new("gpt2_mlp");
    let m = b.dynamic_dim("M")?;
    let d = b.static_dim("D", 64)?;
    let f = b.static_dim("F", 256)?;
    let x = b.input("x", DType::F16, &[m, d])?;
    let ln_g = b.weight("ln_g", DType::F16, &[d])?;
    let ln_b = b.weight("ln_b", DType::F16, &[d])?;
    let w_fc = b.weight("w_fc", DType::F16, &[f, d])?;
    let b_fc = b.weight("b_fc", DType::F16, &[f])?;
    let w_proj = b.weight("w_proj", DType::F16, &[d, f])?;
    let b_proj = b.weight("b_proj", DType::F16, &[d])?;

    let normed = b.layernorm(x, ln_g, ln_b, 1e-5)?;
    let h = b.matmul(normed, w_fc, WeightLayout::NK)?;
    let h = b.bias_add(h, b_fc)?;
    let h = b.gelu(h)?;
    let y = b.matmul(h, w_proj, WeightLayout::NK)?;
    let y = b.bias_add(y, b_proj)?;
    let y = b.add(y, x)?;
    b.output("y", y)?;
    let graph = b.build()?;

    let plan = fuse::plan(graph.clone());
    println!("{plan}");

    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let inputs = reference::random_bindings(&graph, &[("M", 4)], &mut rng)?;
    let full = reference::evaluate(&graph, &inputs)?;
    let row = reference::evaluate_rows(&graph, &inputs, &[2])?;
    let err = reference::relative_error(&row["y"], &full["y"].select_rows(&[2])?);
    println!("row 2 evaluated alone matches the full evaluation: relative error {err:e}");
    assert_eq!(err, 0.0);
    Ok(())
}
