//! Running a graph: binding inputs and weights by name, inferring the
//! dynamic dims from their shapes, and applying the ops in order.

use super::kernels;
use super::tensor::HostTensor;
use super::{Bindings, Outputs, ReferenceError};
use crate::ir::ops::Formula;
use crate::ir::{DimId, Extent, Graph, Op, OpKind, TensorId, TensorKind, WeightLayout};
use rand::Rng;
use std::borrow::Cow;
use std::collections::HashMap;

/// Evaluates `graph` on `inputs` (every input and weight, by name) and
/// returns every output by name, in declaration order.
///
/// Dynamic dims are read from the inputs' shapes and must agree wherever the
/// same dim appears; static dims must match exactly.
pub fn evaluate(graph: &Graph, inputs: &Bindings) -> Result<Outputs, ReferenceError> {
    bind_dims(graph, inputs)?;
    let values = run(graph, borrow_declared(graph, inputs), false, Intermediates::Exact);
    Ok(collect_outputs(graph, values))
}

/// Like [`evaluate`], but returns every tensor the ops compute, intermediates
/// and outputs, in op order. An unnamed intermediate has the generated name
/// the graph gave it (`%3`). Useful to find which step of a fused kernel
/// goes wrong.
pub fn evaluate_all(graph: &Graph, inputs: &Bindings) -> Result<Outputs, ReferenceError> {
    bind_dims(graph, inputs)?;
    let mut values = run(graph, borrow_declared(graph, inputs), true, Intermediates::Exact);
    Ok(graph
        .ops
        .iter()
        .map(|op| {
            let value = values[op.output.0].take().expect("every op's output is computed");
            (graph.tensor(op.output).name.clone(), value.into_owned())
        })
        .collect())
}

/// Evaluates only the given rows of the graph's row dim: the dynamic dim
/// that is the first axis of every input. `inputs` are the full tensors;
/// each output has `rows.len()` rows, row `i` being row `rows[i]` of what
/// [`evaluate`] would return.
///
/// This is exact, not an estimate, because every op is local to a row: a
/// matmul's row i reads only row i of its left operand, norms work per row,
/// the rest per element, and weights have no row axis. The graph must make
/// that true: every input and computed tensor has the row dim as its first
/// axis and nowhere else, and no weight has it; otherwise this returns
/// [`ReferenceError::NotRowLocal`].
pub fn evaluate_rows(graph: &Graph, inputs: &Bindings, rows: &[usize]) -> Result<Outputs, ReferenceError> {
    evaluate_rows_with(graph, inputs, rows, Intermediates::Exact)
}

/// Which computed values the reference rounds to their dtype before the
/// next op reads them, so that it computes what a kernel computes where
/// the kernel stores a value in the element type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Intermediates {
    /// Every value in f64 from the inputs as given: what [`evaluate`] and
    /// [`evaluate_rows`] compute.
    #[default]
    Exact,
    /// A norm's output rounded to its dtype where a matmul reads it: what a
    /// norm GEMM computes when the norm is not folded into the weight (its
    /// gamma and beta come with each call), since it normalizes A's rows
    /// into the element type the tensor cores read and then runs the GEMM.
    /// That rounding enters every output as a sum over K, of the size of
    /// the output's own rounding; left out of the reference, it is an error
    /// the comparison's bounds would have to allow. A folded norm
    /// (LN(x)·Wᵀ from x·W′ᵀ and per-row statistics) never rounds the
    /// normalized rows: compare it with [`Intermediates::Exact`].
    RoundedNorms,
}

/// [`evaluate_rows`], with the intermediates that `intermediates` names
/// rounded to their dtype.
pub fn evaluate_rows_with(
    graph: &Graph,
    inputs: &Bindings,
    rows: &[usize],
    intermediates: Intermediates,
) -> Result<Outputs, ReferenceError> {
    let row_dim = row_dim(graph)?;
    let sizes = bind_dims(graph, inputs)?;
    let row_count = sizes[row_dim.0].map_or(0, |(size, _)| size);
    if let Some(&row) = rows.iter().find(|&&r| r >= row_count) {
        return Err(ReferenceError::RowOutOfRange {
            row,
            dim: graph.dims[row_dim.0].name.clone(),
            rows: row_count,
        });
    }
    let mut values = borrow_declared(graph, inputs);
    // A scale is one value or one per output channel: it has no rows.
    let scales = graph.scales();
    for &t in graph.inputs.iter().filter(|t| !scales.contains(t)) {
        let full = values[t.0].take().expect("inputs are bound");
        values[t.0] = Some(Cow::Owned(full.select_rows(rows)?));
    }
    let values = run(graph, values, false, intermediates);
    Ok(collect_outputs(graph, values))
}

/// Inputs and weights drawn at random for `graph`, each rounded to its
/// dtype: activations uniformly from [-1, 1]; a weight that is a matmul's
/// right operand uniformly from ±1/√K (K its reduced dim), which keeps the
/// product's values near 1 as K grows; other weights (biases, norm scales)
/// from [-1, 1]. An FP8 tensor's stored values are drawn from the whole
/// E4M3 range, ±448, and each of its scales from [0.5, 1] times the bound
/// over 448 (rounded to f32), so that its values span the same range as
/// they would in a wider dtype. `dynamic` gives each dynamic dim's size by
/// name.
pub fn random_bindings<R: Rng + ?Sized>(
    graph: &Graph,
    dynamic: &[(&str, usize)],
    rng: &mut R,
) -> Result<Bindings, ReferenceError> {
    let mut sizes: Vec<Option<usize>> = vec![None; graph.dims.len()];
    for &(name, size) in dynamic {
        let unknown = || ReferenceError::UnknownDim {
            graph: graph.name.clone(),
            dim: name.to_string(),
        };
        let id = graph.dim_by_name(name).ok_or_else(unknown)?;
        if graph.dims[id.0].size.is_some() {
            return Err(unknown());
        }
        sizes[id.0] = Some(size);
    }
    let mut fan_in: HashMap<TensorId, usize> = HashMap::new();
    for op in &graph.ops {
        if let OpKind::MatMul { b_layout } = op.kind {
            let b = op.inputs[1];
            let k_axis = match b_layout {
                WeightLayout::KN => 0,
                WeightLayout::NK => 1,
            };
            let k = resolve(graph, graph.tensor(b).shape[k_axis], &sizes)?;
            fan_in.insert(b, k);
        }
    }
    let shape_of = |t: TensorId| -> Result<Vec<usize>, ReferenceError> {
        graph
            .tensor(t)
            .shape
            .iter()
            .map(|&e| resolve(graph, e, &sizes))
            .collect()
    };
    let mut bindings = Bindings::new();
    // Scales are drawn with the tensor they scale.
    let scales = graph.scales();
    for &t in graph
        .inputs
        .iter()
        .chain(&graph.weights)
        .filter(|t| !scales.contains(t))
    {
        let desc = graph.tensor(t);
        let bound = match (desc.kind, fan_in.get(&t)) {
            (TensorKind::Weight, Some(&k)) if k > 0 => 1.0 / (k as f64).sqrt(),
            _ => 1.0,
        };
        let value = match desc.scale {
            None => HostTensor::random_uniform(desc.dtype, &shape_of(t)?, -bound, bound, rng)?,
            Some(scale) => {
                let unit = bound / super::fp8::E4M3_MAX;
                let scales = HostTensor::random_uniform(
                    graph.tensor(scale).dtype,
                    &shape_of(scale)?,
                    0.5 * unit,
                    unit,
                    rng,
                )?;
                bindings.insert(graph.tensor(scale).name.clone(), scales);
                let max = super::fp8::E4M3_MAX;
                HostTensor::random_uniform(desc.dtype, &shape_of(t)?, -max, max, rng)?
            }
        };
        bindings.insert(desc.name.clone(), value);
    }
    Ok(bindings)
}

/// The size of one axis, given the dynamic dims' sizes.
fn resolve(graph: &Graph, extent: Extent, sizes: &[Option<usize>]) -> Result<usize, ReferenceError> {
    match extent {
        Extent::Static(n) => Ok(n as usize),
        Extent::Dynamic(d) => sizes[d.0].ok_or_else(|| ReferenceError::MissingDimSize {
            graph: graph.name.clone(),
            dim: graph.dims[d.0].name.clone(),
        }),
    }
}

/// For each dim, its size and the tensor it was first read from.
type DimSizes = Vec<Option<(usize, TensorId)>>;

/// Checks that `inputs` binds exactly the graph's inputs and weights with
/// the declared shapes, and reads the dynamic dims' sizes from them.
fn bind_dims(graph: &Graph, inputs: &Bindings) -> Result<DimSizes, ReferenceError> {
    let declared = || graph.inputs.iter().chain(&graph.weights);
    let mut unexpected: Vec<&String> = inputs
        .keys()
        .filter(|name| !declared().any(|&t| &graph.tensor(t).name == *name))
        .collect();
    // Report the same name on every run, whatever the map's order.
    unexpected.sort();
    if let Some(name) = unexpected.first() {
        return Err(ReferenceError::UnexpectedInput {
            graph: graph.name.clone(),
            name: name.to_string(),
            expected: declared()
                .map(|&t| format!("`{}`", graph.tensor(t).name))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let mut sizes: DimSizes = vec![None; graph.dims.len()];
    for &t in declared() {
        let desc = graph.tensor(t);
        let value = inputs
            .get(&desc.name)
            .ok_or_else(|| ReferenceError::MissingInput {
                graph: graph.name.clone(),
                name: desc.name.clone(),
            })?;
        value.check_len()?;
        let wrong_shape = || ReferenceError::WrongShape {
            graph: graph.name.clone(),
            name: desc.name.clone(),
            expected: graph.shape_string(&desc.shape),
            got: value
                .shape
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        };
        if value.shape.len() != desc.shape.len() {
            return Err(wrong_shape());
        }
        for (&extent, &got) in desc.shape.iter().zip(&value.shape) {
            match extent {
                Extent::Static(n) => {
                    if n != got as u64 {
                        return Err(wrong_shape());
                    }
                }
                Extent::Dynamic(d) => match sizes[d.0] {
                    None => sizes[d.0] = Some((got, t)),
                    Some((size, first)) if size != got => {
                        return Err(ReferenceError::DimsDisagree {
                            dim: graph.dims[d.0].name.clone(),
                            first_tensor: graph.tensor(first).name.clone(),
                            first_size: size,
                            second_tensor: desc.name.clone(),
                            second_size: got,
                        });
                    }
                    Some(_) => {}
                },
            }
        }
    }
    Ok(sizes)
}

/// The dim every row-local evaluation slices, after checking that the graph
/// is row-local in it (see [`evaluate_rows`]).
fn row_dim(graph: &Graph) -> Result<DimId, ReferenceError> {
    let not_row_local = |reason: String| ReferenceError::NotRowLocal {
        graph: graph.name.clone(),
        reason,
    };
    let first_input = graph
        .inputs
        .first()
        .ok_or_else(|| not_row_local("it has no inputs, so no row dim".to_string()))?;
    let first = graph.tensor(*first_input);
    let dim = match first.shape[0] {
        Extent::Dynamic(d) => d,
        Extent::Static(n) => {
            return Err(not_row_local(format!(
                "the first axis of input `{}` is the static size {n}, not a dynamic dim",
                first.name
            )));
        }
    };
    let dim_name = &graph.dims[dim.0].name;
    let row = Extent::Dynamic(dim);
    let scales = graph.scales();
    for (i, desc) in graph.tensors.iter().enumerate() {
        // A scale is one value or one per output channel, read whole by
        // every row.
        if scales.contains(&TensorId(i)) {
            continue;
        }
        let what = match desc.kind {
            TensorKind::Input => "input",
            TensorKind::Weight => "weight",
            TensorKind::Intermediate => "intermediate",
            TensorKind::Output => "output",
        };
        let name = &desc.name;
        let ty = graph.type_string(TensorId(i));
        if desc.kind == TensorKind::Weight {
            if desc.shape.contains(&row) {
                return Err(not_row_local(format!(
                    "weight `{name}` ({ty}) has the row dim `{dim_name}` as an axis"
                )));
            }
        } else if desc.shape[0] != row {
            return Err(not_row_local(format!(
                "the first axis of {what} `{name}` ({ty}) is not the row dim `{dim_name}`"
            )));
        } else if desc.shape[1..].contains(&row) {
            return Err(not_row_local(format!(
                "{what} `{name}` ({ty}) has the row dim `{dim_name}` on a later axis too"
            )));
        }
    }
    Ok(dim)
}

/// A slot per tensor, with the inputs and weights filled in (borrowed: a
/// weight can be hundreds of megabytes).
fn borrow_declared<'a>(graph: &Graph, inputs: &'a Bindings) -> Vec<Option<Cow<'a, HostTensor>>> {
    let mut values = vec![None; graph.tensors.len()];
    for &t in graph.inputs.iter().chain(&graph.weights) {
        values[t.0] = inputs.get(&graph.tensor(t).name).map(Cow::Borrowed);
    }
    values
}

/// Applies the ops in order, rounding the results `intermediates` names.
/// Unless `keep_all`, a tensor that is not an output is dropped after its
/// last use, so a long chain needs memory for a few tensors, not all of
/// them.
fn run<'a>(
    graph: &Graph,
    mut values: Vec<Option<Cow<'a, HostTensor>>>,
    keep_all: bool,
    intermediates: Intermediates,
) -> Vec<Option<Cow<'a, HostTensor>>> {
    let mut last_use = vec![None; graph.tensors.len()];
    for (i, op) in graph.ops.iter().enumerate() {
        for &t in &op.inputs {
            last_use[t.0] = Some(i);
        }
    }
    let rounded = rounded_results(graph, intermediates);
    for (i, op) in graph.ops.iter().enumerate() {
        let operands = operand_values(graph, op, &values);
        let operands: Vec<&HostTensor> = operands.iter().map(|v| &**v).collect();
        let mut result = apply(op.kind, &operands);
        if rounded[op.output.0] {
            result = result.rounded_to(graph.tensor(op.output).dtype);
        }
        values[op.output.0] = Some(Cow::Owned(result));
        if !keep_all {
            for &t in &op.inputs {
                if last_use[t.0] == Some(i) && graph.tensor(t).kind != TensorKind::Output {
                    values[t.0] = None;
                }
            }
        }
    }
    values
}

/// The operands of `op` as it reads them: an FP8 tensor's stored values
/// times its scale (the one value, or each output channel's), others as
/// they are. A matmul of FP8 operands then sums the products of these in
/// f64, as it does any other; a kernel's f32 accumulation of the same
/// products differs from that only by f32 rounding.
fn operand_values<'v>(
    graph: &Graph,
    op: &Op,
    values: &'v [Option<Cow<'_, HostTensor>>],
) -> Vec<Cow<'v, HostTensor>> {
    let value = |t: TensorId| values[t.0].as_deref().expect("ops are in topological order");
    op.inputs
        .iter()
        .enumerate()
        .map(|(position, &t)| match graph.tensor(t).scale {
            None => Cow::Borrowed(value(t)),
            Some(scale) => {
                // Only a matmul reads FP8 tensors; a per-channel scale is
                // its right operand's, one per output column: a row of an
                // [N, K] weight, a column of a [K, N] one.
                let per_row = position == 1
                    && matches!(
                        op.kind,
                        OpKind::MatMul {
                            b_layout: WeightLayout::NK
                        }
                    );
                Cow::Owned(dequantize(value(t), value(scale), per_row))
            }
        })
        .collect()
}

/// `stored` times `scale`: one value for the whole tensor, or one per row
/// (`per_row`) or column.
fn dequantize(stored: &HostTensor, scale: &HostTensor, per_row: bool) -> HostTensor {
    let row_len = stored.row_len().max(1);
    let data = stored
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let channel = match scale.data.len() {
                1 => 0,
                _ if per_row => i / row_len,
                _ => i % row_len,
            };
            super::fp8::dequantize(v, scale.data[channel])
        })
        .collect();
    HostTensor {
        shape: stored.shape.clone(),
        data,
    }
}

/// For each tensor, whether `intermediates` has it rounded to its dtype
/// once computed.
fn rounded_results(graph: &Graph, intermediates: Intermediates) -> Vec<bool> {
    let mut rounded = vec![false; graph.tensors.len()];
    if intermediates == Intermediates::RoundedNorms {
        let is_norm = |t: TensorId| {
            graph.ops.iter().any(|op| {
                op.output == t && matches!(op.kind, OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. })
            })
        };
        for op in &graph.ops {
            let a = op.inputs[0];
            if matches!(op.kind, OpKind::MatMul { .. }) && is_norm(a) {
                rounded[a.0] = true;
            }
        }
    }
    rounded
}

fn collect_outputs(graph: &Graph, mut values: Vec<Option<Cow<'_, HostTensor>>>) -> Outputs {
    graph
        .outputs
        .iter()
        .map(|&t| {
            let value = values[t.0].take().expect("every output is computed");
            (graph.tensor(t).name.clone(), value.into_owned())
        })
        .collect()
}

/// One op on operands whose shapes the graph has already checked: the
/// op table's formula for elementwise ops, a routine of its own otherwise.
fn apply(kind: OpKind, operands: &[&HostTensor]) -> HostTensor {
    let x = operands[0];
    let same_shape = |data: Vec<f64>| HostTensor {
        shape: x.shape.clone(),
        data,
    };
    match kind.def().reference {
        Formula::Unary(f) => return same_shape(kernels::map_unary(&x.data, f)),
        Formula::Binary(f) => return same_shape(kernels::map_binary(&x.data, &operands[1].data, f)),
        Formula::Routine => {}
    }
    match kind {
        OpKind::MatMul { b_layout } => {
            let b = operands[1];
            let (rows, k) = (x.shape[0], x.shape[1]);
            let n = match b_layout {
                WeightLayout::KN => b.shape[1],
                WeightLayout::NK => b.shape[0],
            };
            HostTensor {
                shape: vec![rows, n],
                data: kernels::matmul(&x.data, rows, k, &b.data, n, b_layout),
            }
        }
        OpKind::BiasAdd => same_shape(kernels::bias_add(&x.data, &operands[1].data)),
        OpKind::LayerNorm { eps } => same_shape(kernels::layernorm(
            &x.data,
            &operands[1].data,
            &operands[2].data,
            eps,
        )),
        OpKind::RmsNorm { eps } => same_shape(kernels::rmsnorm(&x.data, &operands[1].data, eps)),
        OpKind::Add | OpKind::Mul | OpKind::Activation(_) => {
            unreachable!("`{}` has a formula in the op table", kind.name())
        }
    }
}
