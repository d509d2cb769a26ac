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
    l.index_bindings();
    for i in 0..decl.bindings.len() {
        // Failures are already recorded in `errors`.
        let _ = l.resolve_binding(i, &[]);
    }
    if !l.errors.is_empty() {
        return Err(Diagnostics(l.errors));
    }
    l.b.build()
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Pending,
    Visiting,
    Done(TensorId),
    Failed,
}

/// An error already recorded.
struct Reported;

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

    fn index_bindings(&mut self) {
        for (i, binding) in self.decl.bindings.iter().enumerate() {
            let name = binding.name.name.as_str();
            let earlier = self
                .decl
                .dims
                .iter()
                .map(|d| &d.name)
                .chain(self.decl.tensors.iter().map(|t| &t.name))
                .chain(self.decl.bindings[..i].iter().map(|b| &b.name))
                .find(|id| id.name == name)
                .cloned();
            if let Some(first) = earlier {
                self.state[i] = State::Failed;
                self.report(
                    Diagnostic::new(binding.name.span, format!("`{name}` is defined twice"))
                        .with_label(first.span, "first defined"),
                );
            } else {
                self.bindings.insert(name, i);
            }
        }
    }

    fn resolve_binding(&mut self, i: usize, path: &[usize]) -> Result<TensorId, Reported> {
        match self.state[i] {
            State::Done(t) => return Ok(t),
            State::Failed => return Err(Reported),
            State::Visiting => unreachable!("cycles are caught at the reference"),
            State::Pending => {}
        }
        self.state[i] = State::Visiting;
        let binding: &'a Binding = &self.decl.bindings[i];
        let mut path = path.to_vec();
        path.push(i);
        let result = self.lower_binding(binding, &path);
        self.state[i] = match result {
            Ok(t) => State::Done(t),
            Err(_) => State::Failed,
        };
        result
    }

    fn lower_binding(&mut self, binding: &'a Binding, path: &[usize]) -> Result<TensorId, Reported> {
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
        let t = self.lower_expr(&binding.expr, path)?;
        self.b.at(name.span);
        let named = if binding.is_output {
            self.b.output(&name.name, t)
        } else {
            self.b.name(t, &name.name)
        };
        named.map_err(|e| self.report(e))?;
        Ok(t)
    }

    fn lookup(&mut self, id: &Ident, path: &[usize]) -> Result<TensorId, Reported> {
        if let Some(&t) = self.tensors.get(id.name.as_str()) {
            return Ok(t);
        }
        if let Some(&i) = self.bindings.get(id.name.as_str()) {
            if self.state[i] == State::Visiting {
                let start = path.iter().position(|&p| p == i).unwrap_or(0);
                let mut names: Vec<&str> = path[start..]
                    .iter()
                    .map(|&p| self.decl.bindings[p].name.name.as_str())
                    .collect();
                names.push(&id.name);
                let message = format!("cycle: {}", names.join(" → "));
                return Err(self.report(Diagnostic::new(id.span, message)));
            }
            return self.resolve_binding(i, path);
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

    fn lower_expr(&mut self, expr: &'a Expr, path: &[usize]) -> Result<TensorId, Reported> {
        match expr {
            Expr::Name(id) => self.lookup(id, path),
            Expr::Transpose { span, .. } => Err(self.report(Diagnostic::new(
                *span,
                "`^T` is only allowed on the right operand of `@` (or matmul's second argument)",
            ))),
            Expr::Binary(bin) => match bin.op {
                BinOp::MatMul => self.lower_matmul(&bin.lhs, &bin.rhs, bin.span, path),
                BinOp::Add => {
                    let (a, b) = (self.lower_expr(&bin.lhs, path)?, self.lower_expr(&bin.rhs, path)?);
                    self.b.at(bin.span);
                    let r = match (self.rank(a), self.rank(b)) {
                        (2, 1) => self.b.bias_add(a, b),
                        (1, 2) => self.b.bias_add(b, a),
                        _ => self.b.add(a, b),
                    };
                    r.map_err(|e| self.report(e))
                }
                BinOp::Mul => {
                    let (a, b) = (self.lower_expr(&bin.lhs, path)?, self.lower_expr(&bin.rhs, path)?);
                    self.b.at(bin.span);
                    self.b.mul(a, b).map_err(|e| self.report(e))
                }
            },
            Expr::Call(call) => self.lower_call(call, path),
        }
    }

    fn lower_matmul(
        &mut self,
        lhs: &'a Expr,
        rhs: &'a Expr,
        span: Span,
        path: &[usize],
    ) -> Result<TensorId, Reported> {
        let a = self.lower_expr(lhs, path)?;
        let (b, layout) = match rhs {
            Expr::Transpose { operand, .. } => (self.lower_expr(operand, path)?, WeightLayout::NK),
            other => (self.lower_expr(other, path)?, WeightLayout::KN),
        };
        self.b.at(span);
        self.b.matmul(a, b, layout).map_err(|e| self.report(e))
    }

    fn lower_call(&mut self, call: &'a Call, path: &[usize]) -> Result<TensorId, Reported> {
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
        // Each keyword's value, in the row's order; defaults where left out.
        let mut keywords: Vec<f64> = op.keywords.iter().map(|k| k.default).collect();
        for kw in &call.kwargs {
            let Some(slot) = op.keywords.iter().position(|k| k.name == kw.name.name) else {
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
            };
            keywords[slot] = kw.value;
        }
        if let OpForm::MatMul = op.form {
            return self.lower_matmul(&call.args[0], &call.args[1], call.span, path);
        }
        let mut args = Vec::with_capacity(arity);
        for a in &call.args {
            args.push(self.lower_expr(a, path)?);
        }
        self.b.at(call.span);
        let r = match &op.form {
            OpForm::MatMul => unreachable!("lowered above, where `^T` is allowed"),
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
