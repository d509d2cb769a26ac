//! Fusion: splits a graph into kernels.
//!
//! [`plan()`] walks the graph in topological order, grows a chain from each
//! matmul (a norm prologue before it, elementwise epilogue steps after it),
//! settles ops that two chains want by priority, and makes the ops left
//! over standalone kernels: a norm alone, elementwise ops in chains of up
//! to [`MAX_EPILOGUE_STEPS`] under the same linear-chain rule. The result
//! is a [`Plan`]: what each kernel computes and reads, in launch order.
//! Choosing tile configs and rendering CUDA come after, from the plan alone.
//!
//! | module | holds |
//! | --- | --- |
//! | [`plan`](mod@plan) | the types: [`Plan`], [`FusedKernel`], [`Composition`], operand [`Role`]s |
//! | [`pattern`] | the nine [`NamedPattern`]s and how any composition is named |
//! | `matcher` | the matching rules and their priorities |
//! | [`split`] | fusions known to lose, which the matcher does not form |
//! | `validate` | [`Plan::validate`], the invariants every plan holds |
//! | `report` | `impl Display for Plan`: the plan as a terminal table |
//! | [`dot`] | the plan as a Graphviz digraph |

pub mod dot;
mod matcher;
pub mod pattern;
pub mod plan;
mod report;
pub mod split;
mod validate;

pub use matcher::{MAX_EPILOGUE_STEPS, plan, plan_with};
pub use pattern::NamedPattern;
pub use plan::{
    Activation, Composition, CrossingTensor, EpilogueStep, FusedKernel, GemmComposition, GemmOperands, Norm,
    NormKind, Operand, Plan, Role,
};
pub use split::{DimBounds, Split, SplitRule};
