//! The token grammar: `fusion_graph!` bodies, type strings and expressions.
//!
//! ```text
//! graph      := doc-comment* visibility? "graph" NAME "{" statement* "}"
//! statement  := "dims" "{" (NAME ":" ("dyn" | INT)),* "}"
//!             | ("input" | "weight") (NAME ":" type),+ ";"
//!             | ("let" | "output") NAME "=" expr ";"
//! type       := DTYPE "[" (NAME | INT),+ "]" ("scale" NAME)?
//! expr       := term ("+" term)*
//! term       := postfix (("*" | "@") postfix)*
//! postfix    := primary ("^" "T")*
//! primary    := NAME | NAME "(" args ")" | "(" expr ")"
//! args       := expr,* (NAME "=" NUMBER),*
//! ```
//!
//! Precedence follows Python's: `@` binds like `*`, tighter than `+`.
//!
//! Operator chains (`a + b + c …`, `w^T`) are read in loops, however long;
//! parentheses and calls recurse, and tokens nest at most [`MAX_NESTING`]
//! deep (checked before syn sees them), so no input can overflow the stack
//! here or in the passes that walk the tree.
//!
//! Every parsing function takes a [`SpanMap`], which turns a token's span into
//! the [`Span`] stored in the AST. The macro stores the token's own span; the
//! TOML reader tokenizes a string from the file and moves each span to where
//! that string sits in the file, so both front ends share this code without
//! rewriting the tree afterwards.

use super::ast::{
    BinOp, Binary, Binding, Call, DimDecl, DimExpr, DimSize, Expr, GraphDecl, Ident, KwArg, TensorDecl,
    TensorRole, TypeExpr,
};
use crate::diagnostic::{Diagnostic, Diagnostics, Span};
use proc_macro2::{Delimiter, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Token, braced, bracketed, parenthesized};

mod kw {
    syn::custom_keyword!(graph);
    syn::custom_keyword!(dims);
    syn::custom_keyword!(input);
    syn::custom_keyword!(weight);
    syn::custom_keyword!(output);
    syn::custom_keyword!(scale);
    syn::custom_keyword!(T);
}

/// Turns a token's span into the span stored in the AST.
///
/// A span with an empty byte range stands for the end of the input (syn
/// reports "nothing left" at the call site), which the TOML reader maps to the
/// end of the string.
pub(crate) type SpanMap<'a> = &'a dyn Fn(proc_macro2::Span) -> Span;

/// How deep brackets may nest in the tokens of a graph, an expression or a
/// type (a graph's body is one level, each parenthesis or call one more).
/// Real graphs nest a handful deep; the limit bounds the recursion in syn's
/// token buffer, in this grammar and in every pass over the tree.
pub const MAX_NESTING: usize = 64;

/// The span of the first group nested deeper than [`MAX_NESTING`], found
/// without recursion (the tokens have not been checked yet).
fn check_nesting(tokens: &TokenStream) -> Result<(), proc_macro2::Span> {
    let mut levels = vec![tokens.clone().into_iter()];
    while let Some(level) = levels.last_mut() {
        match level.next() {
            None => {
                levels.pop();
            }
            Some(TokenTree::Group(group)) => {
                if levels.len() > MAX_NESTING {
                    return Err(group.span());
                }
                levels.push(group.stream().into_iter());
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Parses the body of a `fusion_graph!` invocation.
///
/// Spans in the result are [`Span::Tokens`]: the compiler's inside the macro,
/// proc-macro2's (with line and column) when the tokens came from
/// `TokenStream::from_str`.
pub fn parse_tokens(tokens: TokenStream) -> Result<GraphDecl, Diagnostics> {
    run(tokens, &Span::Tokens, |g, input| g.graph(input))
}

/// Parses a whole tensor type, `f16[M, D]`.
pub(crate) fn parse_type(tokens: TokenStream, map: SpanMap) -> Result<TypeExpr, Diagnostics> {
    run(tokens, map, |g, input| {
        let ty = g.type_expr(input)?;
        if !input.is_empty() {
            return Err(error_at(
                input,
                format!(
                    "unexpected {} after the type: a type is written `f16[M, D]`",
                    found(input)
                ),
            ));
        }
        Ok(ty)
    })
}

/// Parses a whole expression, `silu(x @ w^T) + b`.
pub(crate) fn parse_expr(tokens: TokenStream, map: SpanMap) -> Result<Expr, Diagnostics> {
    run(tokens, map, |g, input| {
        let expr = g.expr(input, None)?;
        if !input.is_empty() {
            return Err(g.after_expr_error(input, "the end of the expression"));
        }
        Ok(expr)
    })
}

fn run<T>(
    tokens: TokenStream,
    map: SpanMap,
    parse: impl FnOnce(&Grammar, ParseStream) -> syn::Result<T>,
) -> Result<T, Diagnostics> {
    check_nesting(&tokens).map_err(|span| {
        Diagnostics(vec![Diagnostic::new(
            map(span),
            format!(
                "brackets nest more than {MAX_NESTING} deep here: name an inner part \
                 (`let` in `fusion_graph!`, `[compute]` in TOML) and use its name"
            ),
        )])
    })?;
    let grammar = Grammar { map };
    let parser = |input: ParseStream| parse(&grammar, input);
    parser.parse2(tokens).map_err(|error| {
        Diagnostics(
            error
                .into_iter()
                .map(|e| Diagnostic::new(map(e.span()), e.to_string()))
                .collect(),
        )
    })
}

/// An error at the next token, or at the end of the input.
fn error_at(input: ParseStream, message: impl std::fmt::Display) -> syn::Error {
    syn::Error::new(input.span(), message)
}

/// After one dim of a comma-separated list: false at the list's end, true
/// after the `,` that separates it from the next; any other token is an
/// error.
fn dim_list_continues(body: ParseStream) -> syn::Result<bool> {
    if body.is_empty() {
        return Ok(false);
    }
    if !body.peek(Token![,]) {
        return Err(error_at(
            body,
            format!("expected `,` between dims, found {}", found(body)),
        ));
    }
    body.parse::<Token![,]>()?;
    Ok(true)
}

/// The next token, quoted, for messages: "`-`", "the end of the input".
fn found(input: ParseStream) -> String {
    match input.cursor().token_tree() {
        None => "the end of the input".to_string(),
        Some((TokenTree::Group(group), _)) => match group.delimiter() {
            Delimiter::Parenthesis => "`(`".to_string(),
            Delimiter::Bracket => "`[`".to_string(),
            Delimiter::Brace => "`{`".to_string(),
            Delimiter::None => format!("`{}`", group.stream()),
        },
        Some((token, _)) => format!("`{token}`"),
    }
}

/// Characters that can only be a mistaken operator where an expression is
/// expected (as opposed to a separator written too early, like `,`).
fn is_foreign_operator(c: char) -> bool {
    !matches!(c, ',' | ';' | '=' | ':')
}

struct Grammar<'a> {
    map: SpanMap<'a>,
}

impl Grammar<'_> {
    fn span(&self, span: proc_macro2::Span) -> Span {
        (self.map)(span)
    }

    fn ident(&self, ident: &syn::Ident) -> Ident {
        Ident::new(ident.unraw().to_string(), self.span(ident.span()))
    }

    /// A graph, dim or tensor name. Rust keywords are refused here with a
    /// message that says so (syn's own would only say "expected identifier").
    fn name(&self, input: ParseStream, what: &str) -> syn::Result<Ident> {
        if input.peek(syn::Ident) {
            let ident: syn::Ident = input.parse()?;
            return Ok(self.ident(&ident));
        }
        if input.peek(syn::Ident::peek_any) {
            let keyword = input.call(syn::Ident::parse_any)?;
            return Err(syn::Error::new(
                keyword.span(),
                format!("`{keyword}` is a Rust keyword and cannot be {what}"),
            ));
        }
        Err(error_at(
            input,
            format!("expected {what}, found {}", found(input)),
        ))
    }

    fn graph(&self, input: ParseStream) -> syn::Result<GraphDecl> {
        let attrs = input.call(syn::Attribute::parse_outer)?;
        let doc = doc_comment(&attrs)?;
        input.parse::<syn::Visibility>()?;
        if !input.peek(kw::graph) {
            return Err(error_at(
                input,
                format!("expected `graph <name> {{ ... }}`, found {}", found(input)),
            ));
        }
        input.parse::<kw::graph>()?;
        let name = self.name(input, "the graph's name")?;
        if !input.peek(syn::token::Brace) {
            return Err(error_at(
                input,
                format!("expected `{{` after the graph's name, found {}", found(input)),
            ));
        }
        let body;
        braced!(body in input);
        let mut decl = GraphDecl {
            name,
            doc,
            dims: Vec::new(),
            tensors: Vec::new(),
            bindings: Vec::new(),
        };
        while !body.is_empty() {
            self.statement(&body, &mut decl)?;
        }
        if !input.is_empty() {
            return Err(error_at(
                input,
                format!(
                    "unexpected {} after the graph's body: one `fusion_graph!` declares one graph",
                    found(input)
                ),
            ));
        }
        Ok(decl)
    }

    fn statement(&self, input: ParseStream, decl: &mut GraphDecl) -> syn::Result<()> {
        if input.peek(kw::dims) {
            input.parse::<kw::dims>()?;
            self.dims(input, &mut decl.dims)
        } else if input.peek(kw::input) {
            input.parse::<kw::input>()?;
            self.tensors(input, TensorRole::Input, &mut decl.tensors)
        } else if input.peek(kw::weight) {
            input.parse::<kw::weight>()?;
            self.tensors(input, TensorRole::Weight, &mut decl.tensors)
        } else if input.peek(Token![let]) {
            input.parse::<Token![let]>()?;
            decl.bindings.push(self.binding(input, false)?);
            Ok(())
        } else if input.peek(kw::output) {
            input.parse::<kw::output>()?;
            decl.bindings.push(self.binding(input, true)?);
            Ok(())
        } else {
            Err(error_at(
                input,
                format!(
                    "expected `dims {{ .. }}`, `input ..;`, `weight ..;`, `let name = ..;` or \
                     `output name = ..;`, found {}",
                    found(input)
                ),
            ))
        }
    }

    /// `{ M: dyn, D: 4096 }`, after the `dims` keyword.
    fn dims(&self, input: ParseStream, dims: &mut Vec<DimDecl>) -> syn::Result<()> {
        if !input.peek(syn::token::Brace) {
            return Err(error_at(
                input,
                format!(
                    "expected `{{` after `dims`: `dims {{ M: dyn, D: 4096 }}`, found {}",
                    found(input)
                ),
            ));
        }
        let body;
        braced!(body in input);
        while !body.is_empty() {
            let name = self.name(&body, "a dim name")?;
            if !body.peek(Token![:]) {
                return Err(error_at(
                    &body,
                    format!(
                        "expected `:` and a size after `{}`, found {}",
                        name.name,
                        found(&body)
                    ),
                ));
            }
            body.parse::<Token![:]>()?;
            let (size, size_span) = if body.peek(Token![dyn]) {
                let token: Token![dyn] = body.parse()?;
                (DimSize::Dynamic, self.span(token.span))
            } else if body.peek(syn::LitInt) {
                let literal: syn::LitInt = body.parse()?;
                (DimSize::Static(int_literal(&literal)?), self.span(literal.span()))
            } else {
                return Err(error_at(
                    &body,
                    format!(
                        "a dim's size is a positive integer or `dyn`; found {} after `{}:`",
                        found(&body),
                        name.name
                    ),
                ));
            };
            dims.push(DimDecl {
                name,
                size,
                size_span,
            });
            if !dim_list_continues(&body)? {
                break;
            }
        }
        // A `;` after the block is harmless; accept it.
        if input.peek(Token![;]) {
            input.parse::<Token![;]>()?;
        }
        Ok(())
    }

    /// `x: f16[M, D], y: f16[M, D];`, after `input` or `weight`.
    fn tensors(
        &self,
        input: ParseStream,
        role: TensorRole,
        tensors: &mut Vec<TensorDecl>,
    ) -> syn::Result<()> {
        loop {
            let name = self.name(input, "a tensor name")?;
            if !input.peek(Token![:]) {
                return Err(error_at(
                    input,
                    format!(
                        "expected `:` and a type after `{}` (`{}: f16[M, D]`), found {}",
                        name.name,
                        name.name,
                        found(input)
                    ),
                ));
            }
            input.parse::<Token![:]>()?;
            let ty = self.type_expr(input)?;
            tensors.push(TensorDecl { role, name, ty });
            if input.peek(Token![;]) {
                input.parse::<Token![;]>()?;
                return Ok(());
            }
            if !input.peek(Token![,]) {
                return Err(error_at(
                    input,
                    format!(
                        "expected `,` or `;` after a tensor's type, found {}",
                        found(input)
                    ),
                ));
            }
            input.parse::<Token![,]>()?;
        }
    }

    /// `f16[M, D]`.
    fn type_expr(&self, input: ParseStream) -> syn::Result<TypeExpr> {
        if !input.peek(syn::Ident::peek_any) {
            return Err(error_at(
                input,
                format!("expected a tensor type like `f16[M, D]`, found {}", found(input)),
            ));
        }
        let dtype = input.call(syn::Ident::parse_any)?;
        let dtype = self.ident(&dtype);
        if !input.peek(syn::token::Bracket) {
            return Err(error_at(
                input,
                format!(
                    "expected `[` and the dims after the dtype (`{}[M, D]`), found {}",
                    dtype.name,
                    found(input)
                ),
            ));
        }
        let body;
        let brackets = bracketed!(body in input);
        let span = dtype.span.join(self.span(brackets.span.close()));
        let mut dims = Vec::new();
        while !body.is_empty() {
            if body.peek(syn::Ident) {
                let ident: syn::Ident = body.parse()?;
                dims.push(DimExpr::Named(self.ident(&ident)));
            } else if body.peek(syn::LitInt) {
                let literal: syn::LitInt = body.parse()?;
                dims.push(DimExpr::Literal(
                    int_literal(&literal)?,
                    self.span(literal.span()),
                ));
            } else {
                return Err(error_at(
                    &body,
                    format!(
                        "expected a dim (a declared name or an integer), found {}",
                        found(&body)
                    ),
                ));
            }
            if !dim_list_continues(&body)? {
                break;
            }
        }
        if dims.is_empty() {
            return Err(syn::Error::new(
                brackets.span.join(),
                "a tensor needs at least one dim: `f16[M, D]`",
            ));
        }
        let mut span = span;
        let scale = if input.peek(kw::scale) {
            let keyword: kw::scale = input.parse()?;
            if !input.peek(syn::Ident) {
                return Err(syn::Error::new(
                    if input.is_empty() {
                        keyword.span
                    } else {
                        input.span()
                    },
                    format!(
                        "expected the name of the scale tensor after `scale` (`f8e4m3[F, D] scale w_scale`), found {}",
                        found(input)
                    ),
                ));
            }
            let name = self.name(input, "the scale tensor's name")?;
            span = span.join(name.span);
            Some(name)
        } else {
            None
        };
        Ok(TypeExpr {
            dtype,
            dims,
            scale,
            span,
        })
    }

    /// `name = expr;`, after `let` or `output`.
    fn binding(&self, input: ParseStream, is_output: bool) -> syn::Result<Binding> {
        let name = self.name(input, "a tensor name")?;
        if !input.peek(Token![=]) {
            return Err(error_at(
                input,
                format!("expected `=` after `{}`, found {}", name.name, found(input)),
            ));
        }
        input.parse::<Token![=]>()?;
        let expr = self.expr(input, Some("`=`"))?;
        if !input.peek(Token![;]) {
            return Err(self.after_expr_error(input, "`;`"));
        }
        input.parse::<Token![;]>()?;
        Ok(Binding {
            name,
            expr,
            is_output,
        })
    }

    /// `term (+ term)*`. `after` names what came before, for the message when
    /// the expression is missing.
    fn expr(&self, input: ParseStream, after: Option<&str>) -> syn::Result<Expr> {
        let mut lhs = self.term(input, after)?;
        while input.peek(Token![+]) {
            input.parse::<Token![+]>()?;
            let rhs = self.term(input, Some("`+`"))?;
            lhs = binary(BinOp::Add, lhs, rhs);
        }
        Ok(lhs)
    }

    fn term(&self, input: ParseStream, after: Option<&str>) -> syn::Result<Expr> {
        let mut lhs = self.postfix(input, after)?;
        loop {
            let (op, written) = if input.peek(Token![*]) {
                input.parse::<Token![*]>()?;
                (BinOp::Mul, "`*`")
            } else if input.peek(Token![@]) {
                input.parse::<Token![@]>()?;
                (BinOp::MatMul, "`@`")
            } else {
                return Ok(lhs);
            };
            let rhs = self.postfix(input, Some(written))?;
            lhs = binary(op, lhs, rhs);
        }
    }

    fn postfix(&self, input: ParseStream, after: Option<&str>) -> syn::Result<Expr> {
        let mut expr = self.primary(input, after)?;
        while input.peek(Token![^]) {
            let caret: Token![^] = input.parse()?;
            if !input.peek(kw::T) {
                let at = if input.is_empty() {
                    caret.span
                } else {
                    input.span()
                };
                return Err(syn::Error::new(
                    at,
                    format!(
                        "expected `T` after `^` (`w^T` reads w transposed), found {}",
                        found(input)
                    ),
                ));
            }
            let t: kw::T = input.parse()?;
            let span = expr.span().join(self.span(t.span));
            expr = Expr::Transpose {
                operand: Box::new(expr),
                span,
            };
        }
        Ok(expr)
    }

    fn primary(&self, input: ParseStream, after: Option<&str>) -> syn::Result<Expr> {
        if input.peek(syn::Ident) {
            let ident: syn::Ident = input.parse()?;
            let name = self.ident(&ident);
            if input.peek(syn::token::Paren) {
                return self.call(input, name).map(Expr::Call);
            }
            return Ok(Expr::Name(name));
        }
        if input.peek(syn::token::Paren) {
            let body;
            parenthesized!(body in input);
            let expr = self.expr(&body, Some("`(`"))?;
            if !body.is_empty() {
                return Err(self.after_expr_error(&body, "`)`"));
            }
            return Ok(expr);
        }
        let expected = match after {
            Some(after) => format!("expected an expression after {after}"),
            None => "expected an expression".to_string(),
        };
        let message = match input.cursor().token_tree() {
            None => expected,
            Some((TokenTree::Punct(p), _)) if is_foreign_operator(p.as_char()) => {
                format!("unexpected `{}`: expressions use + * @ and calls", p.as_char())
            }
            Some((TokenTree::Literal(lit), _)) => format!(
                "unexpected `{lit}`: expressions combine tensors with + * @ and calls; \
                 numbers only appear as keyword arguments (`eps = 1e-5`)"
            ),
            Some((TokenTree::Ident(ident), _)) => {
                format!("`{ident}` is a Rust keyword, not a tensor or op name")
            }
            Some(_) => format!("{expected}, found {}", found(input)),
        };
        Err(error_at(input, message))
    }

    /// `(args)`, after the op's name.
    fn call(&self, input: ParseStream, func: Ident) -> syn::Result<Call> {
        let body;
        let parens = parenthesized!(body in input);
        let span = func.span.join(self.span(parens.span.close()));
        let mut args = Vec::new();
        let mut kwargs: Vec<KwArg> = Vec::new();
        while !body.is_empty() {
            if body.peek(syn::Ident) && body.peek2(Token![=]) && !body.peek2(Token![==]) {
                let (kwarg, name_span) = self.kwarg(&body)?;
                if kwargs.iter().any(|k| k.name.name == kwarg.name.name) {
                    return Err(syn::Error::new(
                        name_span,
                        format!(
                            "`{}` is given twice in the call to `{}`",
                            kwarg.name.name, func.name
                        ),
                    ));
                }
                kwargs.push(kwarg);
            } else {
                if !kwargs.is_empty() {
                    return Err(error_at(
                        &body,
                        "positional arguments come before keyword arguments (`layernorm(x, g, b, eps = 1e-5)`)",
                    ));
                }
                let after = if args.is_empty() { "`(`" } else { "`,`" };
                args.push(self.expr(&body, Some(after))?);
            }
            if body.is_empty() {
                break;
            }
            if !body.peek(Token![,]) {
                return Err(self.after_expr_error(&body, "`,` or `)`"));
            }
            body.parse::<Token![,]>()?;
        }
        Ok(Call {
            func,
            args,
            kwargs,
            span,
        })
    }

    /// `eps = 1e-5`, and the name's token span (for a later error about it).
    fn kwarg(&self, input: ParseStream) -> syn::Result<(KwArg, proc_macro2::Span)> {
        let ident: syn::Ident = input.parse()?;
        let name = self.ident(&ident);
        input.parse::<Token![=]>()?;
        let (value, value_span) = if input.peek(syn::LitFloat) {
            let literal: syn::LitFloat = input.parse()?;
            no_suffix(literal.suffix(), literal.base10_digits(), literal.span())?;
            (literal.base10_parse::<f64>()?, literal.span())
        } else if input.peek(syn::LitInt) {
            let literal: syn::LitInt = input.parse()?;
            no_suffix(literal.suffix(), literal.base10_digits(), literal.span())?;
            (literal.base10_parse::<f64>()?, literal.span())
        } else {
            return Err(error_at(
                input,
                format!(
                    "`{}` takes a number like `1e-5`; found {}",
                    name.name,
                    found(input)
                ),
            ));
        };
        let span = name.span.join(self.span(value_span));
        Ok((KwArg { name, value, span }, ident.span()))
    }

    /// The error when an expression is followed by something that neither
    /// continues it nor ends it.
    fn after_expr_error(&self, input: ParseStream, expected: &str) -> syn::Error {
        let message = match input.cursor().token_tree() {
            None => format!("expected {expected} after the expression"),
            Some((TokenTree::Punct(p), _)) if is_foreign_operator(p.as_char()) => {
                format!("unexpected `{}`: expressions use + * @ and calls", p.as_char())
            }
            Some(_) => format!(
                "expected an operator (+ * @) or {expected}, found {}",
                found(input)
            ),
        };
        error_at(input, message)
    }
}

fn binary(op: BinOp, lhs: Expr, rhs: Expr) -> Expr {
    let span = lhs.span().join(rhs.span());
    Expr::Binary(Binary {
        op,
        lhs: Box::new(lhs),
        rhs: Box::new(rhs),
        span,
    })
}

/// A size literal: a plain decimal integer, no suffix.
fn int_literal(literal: &syn::LitInt) -> syn::Result<u64> {
    // syn reads `-1` as one negative literal.
    if literal.base10_digits().starts_with('-') {
        return Err(syn::Error::new(
            literal.span(),
            format!("`{literal}` is negative: a size is a positive integer"),
        ));
    }
    if !literal.suffix().is_empty() {
        return Err(syn::Error::new(
            literal.span(),
            format!(
                "write the size without a type suffix: `{}`",
                literal.base10_digits()
            ),
        ));
    }
    literal
        .base10_parse::<u64>()
        .map_err(|_| syn::Error::new(literal.span(), format!("`{literal}` is too large for a dim size")))
}

/// `///` lines become the graph's doc; any other attribute is an error.
fn doc_comment(attrs: &[syn::Attribute]) -> syn::Result<Option<String>> {
    let mut lines = Vec::new();
    for attr in attrs {
        let syn::Meta::NameValue(meta) = &attr.meta else {
            return Err(syn::Error::new_spanned(
                attr,
                "only doc comments (`///`) may precede `graph`",
            ));
        };
        let text = match &meta.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) if meta.path.is_ident("doc") => text.value(),
            _ => {
                return Err(syn::Error::new_spanned(
                    attr,
                    "only doc comments (`///`) may precede `graph`",
                ));
            }
        };
        // `/// text` arrives as `" text"`: drop the space the comment style adds.
        for line in text.split('\n') {
            lines.push(line.strip_prefix(' ').unwrap_or(line).trim_end().to_string());
        }
    }
    let doc = lines.join("\n").trim().to_string();
    Ok((!doc.is_empty()).then_some(doc))
}

/// Keyword arguments are plain numbers: `1e-5`, not `1e-5f32`.
fn no_suffix(suffix: &str, digits: &str, span: proc_macro2::Span) -> syn::Result<()> {
    if suffix.is_empty() {
        return Ok(());
    }
    Err(syn::Error::new(
        span,
        format!("write the number without a type suffix: `{digits}`"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn expr(text: &str) -> Result<Expr, Diagnostics> {
        parse_expr(TokenStream::from_str(text).unwrap(), &Span::Tokens)
    }

    /// The expression with explicit parentheses, to check its structure.
    fn shape(e: &Expr) -> String {
        match e {
            Expr::Name(i) => i.name.clone(),
            Expr::Transpose { operand, .. } => format!("{}^T", shape(operand)),
            Expr::Binary(b) => {
                let op = match b.op {
                    BinOp::Add => "+",
                    BinOp::Mul => "*",
                    BinOp::MatMul => "@",
                };
                format!("({} {op} {})", shape(&b.lhs), shape(&b.rhs))
            }
            Expr::Call(c) => {
                let mut args: Vec<String> = c.args.iter().map(shape).collect();
                args.extend(c.kwargs.iter().map(|k| format!("{}={}", k.name.name, k.value)));
                format!("{}({})", c.func.name, args.join(", "))
            }
        }
    }

    fn message(text: &str) -> String {
        expr(text).unwrap_err().to_string()
    }

    /// Start and end columns (0-based, proc-macro2's) of a token span.
    fn columns(span: Span) -> (usize, usize) {
        match span {
            Span::Tokens(s) => (s.start().column, s.end().column),
            other => panic!("not a token span: {other:?}"),
        }
    }

    #[test]
    fn precedence_is_pythons() {
        let cases = [
            ("a + b * c", "(a + (b * c))"),
            ("a * b + c", "((a * b) + c)"),
            ("a @ b * c", "((a @ b) * c)"),
            ("a * b @ c", "((a * b) @ c)"),
            ("a + b + c", "((a + b) + c)"),
            ("x @ w^T + b", "((x @ w^T) + b)"),
            ("(x @ w)^T", "(x @ w)^T"),
            ("a * (b + c)", "(a * (b + c))"),
            ("silu(x @ w^T) * u", "(silu((x @ w^T)) * u)"),
            (
                "layernorm(x, g, b, eps = 1e-5)",
                "layernorm(x, g, b, eps=0.00001)",
            ),
            ("rmsnorm(x, g, eps = 1)", "rmsnorm(x, g, eps=1)"),
            ("f()", "f()"),
            ("f(x,)", "f(x)"),
        ];
        for (text, expected) in cases {
            assert_eq!(shape(&expr(text).unwrap()), expected, "{text}");
        }
    }

    #[test]
    fn spans_cover_what_was_written() {
        let e = expr("silu(x @ w^T) + b").unwrap();
        assert_eq!(columns(e.span()), (0, 17));
        let Expr::Binary(add) = &e else { panic!() };
        assert_eq!(columns(add.lhs.span()), (0, 13), "a call runs to its `)`");
        let Expr::Call(call) = &*add.lhs else { panic!() };
        assert_eq!(columns(call.func.span), (0, 4));
        assert_eq!(columns(call.args[0].span()), (5, 12));
        let Expr::Binary(matmul) = &call.args[0] else {
            panic!()
        };
        assert_eq!(columns(matmul.rhs.span()), (9, 12), "`w^T` spans w to T");
        let e = expr("layernorm(x, g, b, eps = 1e-5)").unwrap();
        let Expr::Call(call) = &e else { panic!() };
        assert_eq!(columns(call.kwargs[0].span), (19, 29));
    }

    #[test]
    fn expression_errors_say_what_is_wrong() {
        let cases = [
            ("", "expected an expression"),
            ("x +", "expected an expression after `+`"),
            ("x @", "expected an expression after `@`"),
            ("x * * y", "unexpected `*`: expressions use + * @ and calls"),
            ("x - y", "unexpected `-`: expressions use + * @ and calls"),
            ("-x", "unexpected `-`: expressions use + * @ and calls"),
            ("x / y", "unexpected `/`: expressions use + * @ and calls"),
            (
                "x^",
                "expected `T` after `^` (`w^T` reads w transposed), found the end of the input",
            ),
            ("x^t", "expected `T` after `^`"),
            (
                "x y",
                "expected an operator (+ * @) or the end of the expression, found `y`",
            ),
            ("f(x y)", "expected an operator (+ * @) or `,` or `)`, found `y`"),
            ("(x y)", "expected an operator (+ * @) or `)`, found `y`"),
            ("f(,)", "expected an expression after `(`, found `,`"),
            ("2 * x", "unexpected `2`"),
            (
                "f(eps = 1, x)",
                "positional arguments come before keyword arguments",
            ),
            (
                "f(x, eps = 1, eps = 2)",
                "`eps` is given twice in the call to `f`",
            ),
            ("f(x, eps = y)", "`eps` takes a number like `1e-5`; found `y`"),
            ("f(x, eps = 1f32)", "without a type suffix"),
            ("fn(x)", "`fn` is a Rust keyword"),
            ("[x]", "expected an expression, found `[`"),
        ];
        for (text, expected) in cases {
            let got = message(text);
            assert!(
                got.contains(expected),
                "{text}: expected `{expected}`, got `{got}`"
            );
        }
    }

    #[test]
    fn type_errors_say_what_is_wrong() {
        let ty = |text: &str| parse_type(TokenStream::from_str(text).unwrap(), &Span::Tokens);
        let t = ty("f16[M, 4096]").unwrap();
        assert_eq!(t.dtype.name, "f16");
        assert!(matches!(&t.dims[..], [DimExpr::Named(m), DimExpr::Literal(4096, _)] if m.name == "M"));
        assert_eq!(columns(t.span), (0, 12));
        assert_eq!(t.scale, None);
        let t = ty("f8e4m3[N, K] scale w_scale").unwrap();
        assert_eq!(t.dtype.name, "f8e4m3");
        assert_eq!(t.scale.as_ref().map(|s| s.name.as_str()), Some("w_scale"));
        assert_eq!(columns(t.span), (0, 26), "the type runs to the scale's name");
        let cases = [
            (
                "f16",
                "expected `[` and the dims after the dtype (`f16[M, D]`), found the end of the input",
            ),
            ("f16[]", "a tensor needs at least one dim"),
            (
                "f16[M,,K]",
                "expected a dim (a declared name or an integer), found `,`",
            ),
            ("f16[-4]", "`-4` is negative"),
            ("f16[4u32]", "without a type suffix"),
            ("f16[99999999999999999999]", "too large for a dim size"),
            ("[M]", "expected a tensor type like `f16[M, D]`"),
            (
                "f8e4m3[N, K] scale",
                "expected the name of the scale tensor after `scale` (`f8e4m3[F, D] scale w_scale`), found the end of the input",
            ),
            (
                "f8e4m3[N, K] scale 2",
                "expected the name of the scale tensor after `scale`",
            ),
            ("f8e4m3[N, K] scale s t", "unexpected `t` after the type"),
            ("f8e4m3[N, K] scales s", "unexpected `scales` after the type"),
        ];
        for (text, expected) in cases {
            let got = ty(text).unwrap_err().to_string();
            assert!(
                got.contains(expected),
                "{text}: expected `{expected}`, got `{got}`"
            );
        }
    }

    #[test]
    fn doc_comments_become_the_doc() {
        let decl = parse_tokens(
            TokenStream::from_str("/// First line.\n///\n///   indented\n/// last\ngraph g { }").unwrap(),
        )
        .unwrap();
        assert_eq!(decl.doc.as_deref(), Some("First line.\n\n  indented\nlast"));
        let decl = parse_tokens(TokenStream::from_str("graph g {}").unwrap()).unwrap();
        assert_eq!(decl.doc, None);
        let err = parse_tokens(TokenStream::from_str("#[inline] graph g {}").unwrap()).unwrap_err();
        assert!(err.to_string().contains("only doc comments"), "{err}");
        let err = parse_tokens(TokenStream::from_str("graph g {} graph h {}").unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("one `fusion_graph!` declares one graph"),
            "{err}"
        );
        let err = parse_tokens(TokenStream::new()).unwrap_err();
        assert!(
            err.to_string().contains("expected `graph <name> { ... }`"),
            "{err}"
        );
    }
}
