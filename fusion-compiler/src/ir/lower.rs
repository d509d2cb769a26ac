//! Lowering: a parsed [`GraphDecl`] becomes a [`Graph`].
//!
//! Names are resolved across the whole declaration (bindings may be written
//! in any order), which is where undefined names and cycles are found; every
//! op goes through [`GraphBuilder`], which checks shapes and dtypes. Errors
//! are collected, not thrown one at a time: one bad binding does not hide the
//! next.

use super::ops::{self, OpForm, StepKind};
use super::*;
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::syntax::ast::{BinOp, Binding, Call, DimExpr, DimSize, Expr, GraphDecl, Ident, TypeExpr};
use std::collections::HashMap;

/// Turns a declaration into a checked graph.
pub fn lower(decl: &GraphDecl) -> Result<Graph, Diagnostics> {
    let mut l = Lowering {
        decl,
        b: GraphBuilder::new(decl.name.name.clone()),
        dims: HashMap::new(),
        tensors: HashMap::new(),
        bindings: HashMap::new(),
        state: vec![State::Pending; decl.bindings.len()],
        errors: Vec::new(),
    };
    l.b.name_span(decl.name.span);
    if let Some(doc) = &decl.doc {
        l.b.doc(doc.clone());
    }
    l.declare_dims();
    l.declare_tensors();
    l.declare_scales();
    l.index_bindings();
    for i in l.dependency_order() {
        if l.state[i] == State::Pending {
            // Failures are already recorded in `errors`.
            let _ = l.lower_binding(i);
        }
    }
    if !l.errors.is_empty() {
        return Err(Diagnostics(l.errors));
    }
    let graph = l.b.build()?;
    check_static_row_lengths(&graph)?;
    Ok(graph)
}

/// Kernels read and write rows 16 bytes (8 halves) at a time, so every call
/// refuses a tensor whose row length is not a multiple of 8. A static row
/// length can be checked now, once, at the first tensor that has it. An FP8
/// tensor's scale is not read in rows (it is one value, or one per output
/// channel), so `f32[1]` is no error.
fn check_static_row_lengths(graph: &Graph) -> Result<(), Diagnostics> {
    let mut reported = Vec::new();
    let mut errors = Vec::new();
    let scales = graph.scales();
    for (i, t) in graph.tensors.iter().enumerate() {
        let Some(&Extent::Static(n)) = t.shape.last() else {
            continue;
        };
        if scales.contains(&TensorId(i)) {
            continue;
        }
        if n % 8 == 0 || reported.contains(&n) {
            continue;
        }
        reported.push(n);
        let named = graph
            .dims
            .iter()
            .find(|d| d.size == Some(n))
            .map(|d| d.name.as_str());
        let what = named.map_or(n.to_string(), |name| format!("{name} = {n}"));
        errors.push(Diagnostic::new(
            t.span,
            format!(
                "`{}` has rows of {what}, not a multiple of 8: fused kernels read rows 16 bytes (8 halves) at a \
                 time, so every call would be refused; pad it to a multiple of 8",
                t.name
            ),
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Diagnostics(errors))
    }
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Pending,
    Done(TensorId),
    Failed,
}

/// An error already recorded.
struct Reported;

/// A step of lowering one expression without recursion: visit a node (push
/// its steps), or apply it to the operands its children left on the value
/// stack.
enum Step<'a> {
    Visit(&'a Expr),
    Apply(&'a Expr),
}

struct Lowering<'a> {
    decl: &'a GraphDecl,
    b: GraphBuilder,
    dims: HashMap<&'a str, Extent>,
    tensors: HashMap<&'a str, TensorId>,
    bindings: HashMap<&'a str, usize>,
    state: Vec<State>,
    errors: Vec<Diagnostic>,
}

impl<'a> Lowering<'a> {
    fn report(&mut self, d: Diagnostic) -> Reported {
        self.errors.push(d);
        Reported
    }

    fn declare_dims(&mut self) {
        for dim in &self.decl.dims {
            self.b.at(dim.name.span);
            let extent = match dim.size {
                DimSize::Static(n) => self.b.static_dim(&dim.name.name, n).map_err(|mut e| {
                    if n == 0 || n > builder::MAX_DIM {
                        e.span = dim.size_span;
                    }
                    e
                }),
                DimSize::Dynamic => self.b.dynamic_dim(&dim.name.name),
            };
            match extent {
                Ok(e) => {
                    self.dims.insert(&dim.name.name, e);
                }
                Err(e) => {
                    self.report(e);
                }
            }
        }
    }

    fn resolve_type(&mut self, ty: &'a TypeExpr) -> Result<(DType, Vec<Extent>), Reported> {
        let dtype = ty
            .dtype
            .name
            .parse::<DType>()
            .map_err(|msg| self.report(Diagnostic::new(ty.dtype.span, msg)))?;
        let mut shape = Vec::new();
        for d in &ty.dims {
            shape.push(match d {
                DimExpr::Named(id) => match self.dims.get(id.name.as_str()) {
                    Some(&e) => e,
                    None => {
                        return Err(self.report(
                            Diagnostic::new(id.span, format!("dim `{}` is not declared", id.name)).with_note(
                                format!("add `{}` to the graph's dims, with a size or as dynamic", id.name),
                            ),
                        ));
                    }
                },
                DimExpr::Literal(0, span) => {
                    return Err(self.report(Diagnostic::new(
                        *span,
                        "a dim of size 0: a dim must be at least 1",
                    )));
                }
                DimExpr::Literal(n, span) if *n > builder::MAX_DIM => {
                    return Err(self.report(Diagnostic::new(
                        *span,
                        format!(
                            "dim {n} is too large: the most is {} (2^31 - 1)",
                            builder::MAX_DIM
                        ),
                    )));
                }
                DimExpr::Literal(n, _) => Extent::Static(*n),
            });
        }
        Ok((dtype, shape))
    }

    fn declare_tensors(&mut self) {
        use crate::syntax::ast::TensorRole;
        for decl in &self.decl.tensors {
            let Ok((dtype, shape)) = self.resolve_type(&decl.ty) else {
                continue;
            };
            self.b.at(decl.name.span);
            let id = match decl.role {
                TensorRole::Input => self.b.input(&decl.name.name, dtype, &shape),
                TensorRole::Weight => self.b.weight(&decl.name.name, dtype, &shape),
            };
            match id {
                Ok(id) => {
                    self.tensors.insert(&decl.name.name, id);
                }
                Err(e) => {
                    self.report(e);
                }
            }
        }
    }

    /// Gives each FP8 tensor the scale its type names (`f8e4m3[F, D] scale
    /// w_scale`), once every input and weight is declared: the scale may be
    /// declared after the tensor it scales.
    fn declare_scales(&mut self) {
        for decl in &self.decl.tensors {
            let Some(scale) = &decl.ty.scale else {
                continue;
            };
            let Some(&t) = self.tensors.get(decl.name.name.as_str()) else {
                continue;
            };
            let Some(&s) = self.tensors.get(scale.name.as_str()) else {
                self.report(Diagnostic::new(
                    scale.span,
                    format!(
                        "the scale `{}` of `{}` is not a declared input or weight",
                        scale.name, decl.name.name
                    ),
                ));
                continue;
            };
            self.b.at(scale.span);
            if let Err(e) = self.b.scale(t, s) {
                self.report(e);
            }
        }
    }

    fn index_bindings(&mut self) {
        // The first place each name is written: dims, then tensors, then
        // bindings in order.
        let mut first: HashMap<&'a str, Span> = HashMap::new();
        for id in self
            .decl
            .dims
            .iter()
            .map(|d| &d.name)
            .chain(self.decl.tensors.iter().map(|t| &t.name))
        {
            first.entry(id.name.as_str()).or_insert(id.span);
        }
        for (i, binding) in self.decl.bindings.iter().enumerate() {
            let name = binding.name.name.as_str();
            if let Some(&first) = first.get(name) {
                self.state[i] = State::Failed;
                self.report(
                    Diagnostic::new(binding.name.span, format!("`{name}` is defined twice"))
                        .with_label(first, "first defined"),
                );
            } else {
                first.insert(name, binding.name.span);
                self.bindings.insert(name, i);
            }
        }
    }

    /// The bindings each binding's expression names, in the order they are
    /// written. A binding that only renames another is an error of its own
    /// (see [`Lowering::lower_binding`]), so it depends on nothing.
    fn references(&self, binding: &'a Binding) -> Vec<(usize, &'a Ident)> {
        let mut found = Vec::new();
        if matches!(binding.expr, Expr::Name(_)) && !binding.is_output {
            return found;
        }
        let mut pending = vec![&binding.expr];
        while let Some(expr) = pending.pop() {
            match expr {
                Expr::Name(id) => {
                    if let Some(&i) = self.bindings.get(id.name.as_str()) {
                        found.push((i, id));
                    }
                }
                Expr::Call(call) => pending.extend(call.args.iter().rev()),
                Expr::Binary(bin) => {
                    pending.push(&bin.rhs);
                    pending.push(&bin.lhs);
                }
                Expr::Transpose { operand, .. } => pending.push(operand),
            }
        }
        found
    }

    /// Every binding once, each after the bindings it names (a depth-first
    /// walk with its own stack: `[compute]` entries may chain as long as the
    /// file allows). A reference that closes a cycle is reported, with the
    /// cycle's path, and fails the binding that makes it.
    fn dependency_order(&mut self) -> Vec<usize> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            OnPath,
            Placed,
        }
        let count = self.decl.bindings.len();
        let references: Vec<Vec<(usize, &'a Ident)>> =
            self.decl.bindings.iter().map(|b| self.references(b)).collect();
        let mut mark = vec![Mark::New; count];
        let mut order = Vec::with_capacity(count);
        // The path being walked: a binding and how many of its references
        // have been followed.
        let mut path: Vec<(usize, usize)> = Vec::new();
        for root in 0..count {
            if mark[root] != Mark::New {
                continue;
            }
            mark[root] = Mark::OnPath;
            path.push((root, 0));
            while let Some(&mut (i, ref mut next)) = path.last_mut() {
                let Some(&(j, id)) = references[i].get(*next) else {
                    mark[i] = Mark::Placed;
                    order.push(i);
                    path.pop();
                    continue;
                };
                *next += 1;
                match mark[j] {
                    Mark::Placed => {}
                    Mark::New => {
                        mark[j] = Mark::OnPath;
                        path.push((j, 0));
                    }
                    Mark::OnPath => {
                        let start = path.iter().position(|&(p, _)| p == j).unwrap_or(0);
                        let mut names: Vec<&str> = path[start..]
                            .iter()
                            .map(|&(p, _)| self.decl.bindings[p].name.name.as_str())
                            .collect();
                        names.push(&id.name);
                        let message = format!("cycle: {}", cycle_path(&names));
                        self.report(Diagnostic::new(id.span, message));
                        self.state[i] = State::Failed;
                    }
                }
            }
        }
        order
    }

    /// Lowers binding `i`, whose references are all lowered (or failed).
    fn lower_binding(&mut self, i: usize) -> Result<TensorId, Reported> {
        let binding: &'a Binding = &self.decl.bindings[i];
        let result = self.lower_named(binding);
        self.state[i] = match result {
            Ok(t) => State::Done(t),
            Err(_) => State::Failed,
        };
        result
    }

    fn lower_named(&mut self, binding: &'a Binding) -> Result<TensorId, Reported> {
        let name = &binding.name;
        if let Expr::Name(source) = &binding.expr
            && !binding.is_output
        {
            return Err(self.report(Diagnostic::new(
                name.span,
                format!(
                    "`{}` only renames `{}`: use `{}` directly",
                    name.name, source.name, source.name
                ),
            )));
        }
        let t = self.lower_expr(&binding.expr)?;
        self.b.at(name.span);
        let named = if binding.is_output {
            self.b.output(&name.name, t)
        } else {
            self.b.name(t, &name.name)
        };
        named.map_err(|e| self.report(e))?;
        Ok(t)
    }

    fn lookup(&mut self, id: &Ident) -> Result<TensorId, Reported> {
        if let Some(&t) = self.tensors.get(id.name.as_str()) {
            return Ok(t);
        }
        if let Some(&i) = self.bindings.get(id.name.as_str()) {
            return match self.state[i] {
                State::Done(t) => Ok(t),
                // Reported where it failed; or, while still pending, the
                // reference closes a cycle, reported by `dependency_order`.
                State::Failed | State::Pending => Err(Reported),
            };
        }
        let what = if self.dims.contains_key(id.name.as_str()) {
            format!("`{}` is a dim, not a tensor", id.name)
        } else {
            format!("`{}` is not defined", id.name)
        };
        Err(self.report(Diagnostic::new(id.span, what)))
    }

    fn rank(&self, t: TensorId) -> usize {
        self.b.tensor(t).shape.len()
    }

    /// Lowers an expression, operands before the op, left to right, with
    /// its own stacks (an operator chain is as deep as it is long). The
    /// first error stops it.
    fn lower_expr(&mut self, expr: &'a Expr) -> Result<TensorId, Reported> {
        let mut steps = vec![Step::Visit(expr)];
        let mut values: Vec<TensorId> = Vec::new();
        while let Some(step) = steps.pop() {
            match step {
                Step::Visit(expr) => match expr {
                    Expr::Name(id) => values.push(self.lookup(id)?),
                    Expr::Transpose { span, .. } => {
                        return Err(self.report(Diagnostic::new(
                            *span,
                            "`^T` is only allowed on the right operand of `@` (or matmul's second argument)",
                        )));
                    }
                    Expr::Binary(bin) => {
                        steps.push(Step::Apply(expr));
                        steps.push(Step::Visit(matmul_operand(bin.op, &bin.rhs)));
                        steps.push(Step::Visit(&bin.lhs));
                    }
                    Expr::Call(call) => {
                        self.check_call(call)?;
                        steps.push(Step::Apply(expr));
                        for (index, arg) in call.args.iter().enumerate().rev() {
                            let second_of_matmul = call.func.name == "matmul" && index == 1;
                            steps.push(Step::Visit(if second_of_matmul {
                                matmul_operand(BinOp::MatMul, arg)
                            } else {
                                arg
                            }));
                        }
                    }
                },
                Step::Apply(expr) => {
                    let arity = match expr {
                        Expr::Call(call) => call.args.len(),
                        _ => 2,
                    };
                    let operands = values.split_off(values.len() - arity);
                    let t = self.apply(expr, &operands)?;
                    values.push(t);
                }
            }
        }
        Ok(values.pop().expect("an expression leaves one value"))
    }

    /// Builds the op of a binary expression or a call whose operands are
    /// lowered.
    fn apply(&mut self, expr: &'a Expr, args: &[TensorId]) -> Result<TensorId, Reported> {
        let r = match expr {
            Expr::Binary(bin) => {
                self.b.at(bin.span);
                let (a, b) = (args[0], args[1]);
                match bin.op {
                    BinOp::MatMul => self.b.matmul(a, b, layout_of(&bin.rhs)),
                    BinOp::Add => match (self.rank(a), self.rank(b)) {
                        (2, 1) => self.b.bias_add(a, b),
                        (1, 2) => self.b.bias_add(b, a),
                        _ => self.b.add(a, b),
                    },
                    BinOp::Mul => self.b.mul(a, b),
                }
            }
            Expr::Call(call) => return self.lower_call(call, args),
            Expr::Name(_) | Expr::Transpose { .. } => unreachable!("only ops are applied"),
        };
        r.map_err(|e| self.report(e))
    }

    /// Checks a call's op name, argument count and keyword arguments,
    /// before its arguments are lowered.
    fn check_call(&mut self, call: &'a Call) -> Result<(), Reported> {
        let name = call.func.name.as_str();
        let Some(op) = ops::op_named(name) else {
            let known: Vec<&str> = ops::OPS.iter().map(|op| op.name).collect();
            return Err(self.report(
                Diagnostic::new(call.func.span, format!("unknown op `{name}`"))
                    .with_note(format!("known ops: {}", known.join(", "))),
            ));
        };
        let arity = op.arity;
        if call.args.len() != arity {
            let plural = if arity == 1 { "" } else { "s" };
            return Err(self.report(Diagnostic::new(
                call.span,
                format!("`{name}` takes {arity} argument{plural}, got {}", call.args.len()),
            )));
        }
        for kw in &call.kwargs {
            if !op.keywords.iter().any(|k| k.name == kw.name.name) {
                let allowed = if op.keywords.is_empty() {
                    "it takes none".to_string()
                } else {
                    let names: Vec<&str> = op.keywords.iter().map(|k| k.name).collect();
                    format!("it takes {}", names.join(", "))
                };
                return Err(self.report(Diagnostic::new(
                    kw.name.span,
                    format!("`{name}` has no argument `{}`: {allowed}", kw.name.name),
                )));
            }
            // The kernels take eps as an f32: outside its normal range it
            // would become infinity, a subnormal or 0, not what was written.
            // (Programmatic graphs may use any positive eps: the CPU
            // reference computes in f64.)
            let f32_normal = f64::from(f32::MIN_POSITIVE)..=f64::from(f32::MAX);
            if kw.name.name == "eps" && kw.value > 0.0 && !f32_normal.contains(&kw.value) {
                return Err(self.report(Diagnostic::new(
                    kw.span,
                    format!(
                        "eps = {:e} is outside f32's normal range ({:e} to {:e}): the kernels compute in f32",
                        kw.value,
                        f32::MIN_POSITIVE,
                        f32::MAX
                    ),
                )));
            }
        }
        Ok(())
    }

    /// The op of a checked call whose arguments are lowered.
    fn lower_call(&mut self, call: &'a Call, args: &[TensorId]) -> Result<TensorId, Reported> {
        let op = ops::op_named(&call.func.name).expect("check_call found the op");
        // Each keyword's value, in the row's order; defaults where left out.
        let mut keywords: Vec<f64> = op.keywords.iter().map(|k| k.default).collect();
        for kw in &call.kwargs {
            if let Some(slot) = op.keywords.iter().position(|k| k.name == kw.name.name) {
                keywords[slot] = kw.value;
            }
        }
        self.b.at(call.span);
        let r = match &op.form {
            OpForm::MatMul => self.b.matmul(args[0], args[1], layout_of(&call.args[1])),
            OpForm::LayerNorm => self.b.layernorm(args[0], args[1], args[2], keywords[0]),
            OpForm::RmsNorm => self.b.rmsnorm(args[0], args[1], keywords[0]),
            OpForm::Step(step) => match step.kind {
                StepKind::Bias => self.b.bias_add(args[0], args[1]),
                StepKind::Residual => self.b.add(args[0], args[1]),
                StepKind::Mul => self.b.mul(args[0], args[1]),
                StepKind::Activation => {
                    let activation = Activation::of(op).expect("an activation step is an activation");
                    self.b.activation(activation, args[0])
                }
            },
        };
        r.map_err(|e| self.report(e))
    }
}

/// `a → b → a`; a cycle through more than 16 bindings shows its first and
/// last 8, with how many are left out between.
fn cycle_path(names: &[&str]) -> String {
    const SHOWN: usize = 8;
    if names.len() <= 2 * SHOWN {
        return names.join(" → ");
    }
    format!(
        "{} → … ({} more) … → {}",
        names[..SHOWN].join(" → "),
        names.len() - 2 * SHOWN,
        names[names.len() - SHOWN..].join(" → ")
    )
}

/// What to lower for a matmul's right operand: the tensor under `^T`, read
/// transposed (see [`layout_of`]). Other operators' operands are as written.
fn matmul_operand(op: BinOp, rhs: &Expr) -> &Expr {
    match (op, rhs) {
        (BinOp::MatMul, Expr::Transpose { operand, .. }) => operand,
        _ => rhs,
    }
}

/// How a matmul reads its right operand: `w^T` transposed, `w` as it is.
fn layout_of(rhs: &Expr) -> WeightLayout {
    match rhs {
        Expr::Transpose { .. } => WeightLayout::NK,
        _ => WeightLayout::KN,
    }
}
