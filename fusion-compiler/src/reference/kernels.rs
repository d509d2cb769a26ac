//! The ops of the IR that need a routine of their own, in f64 over row-major
//! slices: the matmul, the bias add's broadcast and the norms, with the
//! formulas of [`OpKind`](crate::ir::OpKind)'s documentation; and the maps
//! that apply the op table's elementwise formulas. Where a formula is
//! rewritten to avoid cancellation, the comment gives the identity.

use crate::ir::WeightLayout;
use rayon::prelude::*;

/// Rows of the output one matmul task computes: the tile's slice of B is
/// read once and used for all of them.
const ROW_BLOCK: usize = 8;

/// Output columns one matmul task computes. A task's B panel (K × 64 f64) is
/// 2 MiB at K = 4096, which stays in L2 while the row block reuses it.
const COLUMN_TILE: usize = 64;

/// The micro-kernel's register block: 4 rows × 8 columns of sums, updated
/// from 4 values of A and 8 of B per step of k. Keeping the sums in
/// registers instead of memory is what makes the loop compute-bound.
const MICRO_ROWS: usize = 4;
const MICRO_COLS: usize = 8;

/// Elementwise ops hand rayon at least this many values per task, so small
/// tensors are not split into tasks that cost more than they compute.
const ELEMENTWISE_GRAIN: usize = 1 << 12;

/// `a [rows, k]` times `b` (`[k, n]` for KN, `[n, k]` for NK) → `[rows, n]`.
///
/// Tasks are (block of [`ROW_BLOCK`] rows) × (tile of [`COLUMN_TILE`]
/// columns), so both a full product and a handful of sampled rows keep every
/// core busy. Each output element is one running sum over k in increasing
/// order, whatever the blocking, so a row's result does not depend on which
/// other rows are computed with it.
pub(super) fn matmul(
    a: &[f64],
    rows: usize,
    k: usize,
    b: &[f64],
    n: usize,
    layout: WeightLayout,
) -> Vec<f64> {
    debug_assert_eq!(a.len(), rows * k);
    debug_assert_eq!(b.len(), k * n);
    let mut out = vec![0.0; rows * n];
    if out.is_empty() {
        return out;
    }
    let tiles = n.div_ceil(COLUMN_TILE);
    out.par_chunks_mut(ROW_BLOCK * n)
        .enumerate()
        .for_each(|(block, out_block)| {
            let block_rows = out_block.len() / n;
            let a_block = &a[block * ROW_BLOCK * k..][..block_rows * k];
            let computed: Vec<Vec<f64>> = (0..tiles)
                .into_par_iter()
                .map(|tile| {
                    let cols = tile * COLUMN_TILE..((tile + 1) * COLUMN_TILE).min(n);
                    let width = cols.len();
                    match layout {
                        WeightLayout::KN => {
                            let panel = Panel {
                                values: &b[cols.start..],
                                stride: n,
                            };
                            tile_product(a_block, block_rows, k, panel, width)
                        }
                        WeightLayout::NK => {
                            // Transpose the tile's rows of B into a [k, width]
                            // panel once, so both layouts share one kernel.
                            let mut packed = vec![0.0; k * width];
                            for (j, col) in cols.enumerate() {
                                for (kk, &v) in b[col * k..][..k].iter().enumerate() {
                                    packed[kk * width + j] = v;
                                }
                            }
                            let panel = Panel {
                                values: &packed,
                                stride: width,
                            };
                            tile_product(a_block, block_rows, k, panel, width)
                        }
                    }
                })
                .collect();
            for (tile, values) in computed.iter().enumerate() {
                let start = tile * COLUMN_TILE;
                let width = values.len() / block_rows;
                for r in 0..block_rows {
                    out_block[r * n + start..][..width].copy_from_slice(&values[r * width..][..width]);
                }
            }
        });
    out
}

/// A `[k, width]` block of the right operand: element (kk, j) is
/// `values[kk * stride + j]`.
#[derive(Clone, Copy)]
struct Panel<'a> {
    values: &'a [f64],
    stride: usize,
}

/// `a [rows, k] @ panel [k, width]` → `[rows, width]`, in register blocks of
/// [`MICRO_ROWS`] × [`MICRO_COLS`] with a plain loop for the edges.
fn tile_product(a: &[f64], rows: usize, k: usize, panel: Panel<'_>, width: usize) -> Vec<f64> {
    let mut out = vec![0.0; rows * width];
    for r0 in (0..rows).step_by(MICRO_ROWS) {
        for c0 in (0..width).step_by(MICRO_COLS) {
            if r0 + MICRO_ROWS <= rows && c0 + MICRO_COLS <= width {
                let sums = micro_block(&a[r0 * k..][..MICRO_ROWS * k], k, panel, c0);
                for (r, row) in sums.iter().enumerate() {
                    out[(r0 + r) * width + c0..][..MICRO_COLS].copy_from_slice(row);
                }
            } else {
                for r in r0..(r0 + MICRO_ROWS).min(rows) {
                    for c in c0..(c0 + MICRO_COLS).min(width) {
                        out[r * width + c] = (0..k)
                            .map(|kk| a[r * k + kk] * panel.values[kk * panel.stride + c])
                            .fold(0.0, |sum, p| sum + p);
                    }
                }
            }
        }
    }
    out
}

/// The sums of one full register block: rows `a [MICRO_ROWS, k]` times
/// columns `c0..c0 + MICRO_COLS` of the panel.
fn micro_block(a: &[f64], k: usize, panel: Panel<'_>, c0: usize) -> [[f64; MICRO_COLS]; MICRO_ROWS] {
    let a_rows: [&[f64]; MICRO_ROWS] = std::array::from_fn(|r| &a[r * k..][..k]);
    let mut sums = [[0.0; MICRO_COLS]; MICRO_ROWS];
    for kk in 0..k {
        let b: &[f64; MICRO_COLS] = panel.values[kk * panel.stride + c0..][..MICRO_COLS]
            .try_into()
            .expect("the slice has MICRO_COLS values");
        for (row_sums, a_row) in sums.iter_mut().zip(&a_rows) {
            let scale = a_row[kk];
            for (sum, &bv) in row_sums.iter_mut().zip(b) {
                *sum += scale * bv;
            }
        }
    }
    sums
}

/// `f` applied to every value.
pub(super) fn map_unary(x: &[f64], f: impl Fn(f64) -> f64 + Sync) -> Vec<f64> {
    x.par_iter()
        .with_min_len(ELEMENTWISE_GRAIN)
        .map(|&v| f(v))
        .collect()
}

/// `f` applied to every pair of values at the same index.
pub(super) fn map_binary(a: &[f64], b: &[f64], f: impl Fn(f64, f64) -> f64 + Sync) -> Vec<f64> {
    debug_assert_eq!(a.len(), b.len());
    a.par_iter()
        .zip(b)
        .with_min_len(ELEMENTWISE_GRAIN)
        .map(|(&p, &q)| f(p, q))
        .collect()
}

/// `x [.., n] + bias [n]` on every row.
pub(super) fn bias_add(x: &[f64], bias: &[f64]) -> Vec<f64> {
    let mut out = x.to_vec();
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(bias.len()).for_each(|row| {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
        }
    });
    out
}

/// Per row of `x [.., n]`: (x − mean)/√(var + eps)·gamma + beta, with the
/// biased variance (divided by n, as PyTorch's LayerNorm).
pub(super) fn layernorm(x: &[f64], gamma: &[f64], beta: &[f64], eps: f64) -> Vec<f64> {
    let mut out = x.to_vec();
    if out.is_empty() {
        return out;
    }
    let n = gamma.len();
    out.par_chunks_mut(n).for_each(|row| {
        let mean = row.iter().sum::<f64>() / n as f64;
        // Two passes: the variance of the centred values does not suffer the
        // cancellation of mean(x²) − mean².
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let inv_std = 1.0 / (var + eps).sqrt();
        for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * inv_std * g + b;
        }
    });
    out
}

/// Per row of `x [.., n]`: x/√(mean(x²) + eps)·gamma.
pub(super) fn rmsnorm(x: &[f64], gamma: &[f64], eps: f64) -> Vec<f64> {
    let mut out = x.to_vec();
    if out.is_empty() {
        return out;
    }
    let n = gamma.len();
    out.par_chunks_mut(n).for_each(|row| {
        let mean_square = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let inv_rms = 1.0 / (mean_square + eps).sqrt();
        for (v, g) in row.iter_mut().zip(gamma) {
            *v = *v * inv_rms * g;
        }
    });
    out
}

/// The error function, to within an ulp or so (the C library's algorithm,
/// from the `libm` crate).
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain triple loop, the definition the blocked kernel must match.
    fn naive(a: &[f64], rows: usize, k: usize, b: &[f64], n: usize, layout: WeightLayout) -> Vec<f64> {
        let mut out = vec![0.0; rows * n];
        for i in 0..rows {
            for j in 0..n {
                out[i * n + j] = (0..k)
                    .map(|kk| {
                        let bv = match layout {
                            WeightLayout::KN => b[kk * n + j],
                            WeightLayout::NK => b[j * k + kk],
                        };
                        a[i * k + kk] * bv
                    })
                    .sum();
            }
        }
        out
    }

    #[test]
    fn blocked_matmul_matches_the_triple_loop() {
        // Shapes that leave partial row blocks and column tiles, and k not a
        // multiple of the dot product's four lanes.
        for &(rows, k, n) in &[(1, 1, 1), (3, 5, 7), (9, 13, 130), (17, 4, 257), (8, 3, 128)] {
            // Small integers: every product and sum is exact, so the blocked
            // and naive orders must agree bit for bit.
            let a: Vec<f64> = (0..rows * k).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
            let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 13) as f64 - 6.0).collect();
            for layout in [WeightLayout::KN, WeightLayout::NK] {
                assert_eq!(
                    matmul(&a, rows, k, &b, n, layout),
                    naive(&a, rows, k, &b, n, layout),
                    "{rows}x{k}x{n} {layout:?}"
                );
            }
        }
    }

    #[test]
    fn empty_matmul_is_empty_or_zero() {
        assert!(matmul(&[], 0, 3, &[0.0; 6], 2, WeightLayout::KN).is_empty());
        assert_eq!(matmul(&[], 2, 0, &[], 3, WeightLayout::NK), vec![0.0; 6]);
    }
}
