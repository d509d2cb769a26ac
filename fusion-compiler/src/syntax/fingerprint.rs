//! The content hash that keeps `fusion_graph!` and the build script in step.
//!
//! The build script reads a graph's tokens from the source file with `syn`
//! and the macro receives them from the compiler; both hash them with
//! [`graph_fingerprint`], and the generated file carries the build script's
//! value for the macro to check. The two sides see different spans and may
//! print literals differently, so the hash covers only what the tokens say:
//! identifiers, punctuation with its spacing, delimiters, and literals by
//! value (a doc comment is the same string whichever side tokenized it).
//! Whitespace and ordinary comments do not count: reformatting a graph does
//! not make its generated file stale.

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

/// A stable 64-bit hash of a graph's tokens (FNV-1a over their normal form).
pub fn graph_fingerprint(tokens: &TokenStream) -> u64 {
    let mut text = String::new();
    normal_form(tokens, &mut text);
    fnv1a(text.as_bytes())
}

/// Identifiers and literals are followed by a
/// space, joint punctuation is not, so `a+ b` and `a +b` read the same.
///
/// Groups are walked with a stack, not by recursion: the fingerprint is
/// taken before the grammar refuses tokens nested too deep.
fn normal_form(tokens: &TokenStream, out: &mut String) {
    // Each open group: its remaining tokens and its closing delimiter.
    let mut open_groups = vec![(tokens.clone().into_iter(), "")];
    while let Some((tokens, close)) = open_groups.last_mut() {
        let Some(token) = tokens.next() else {
            out.push_str(close);
            if open_groups.len() > 1 {
                out.push(' ');
            }
            open_groups.pop();
            continue;
        };
        match token {
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                out.push(' ');
                open_groups.push((group.stream().into_iter(), close));
            }
            TokenTree::Ident(ident) => {
                out.push_str(&ident.to_string());
                out.push(' ');
            }
            TokenTree::Punct(punct) => {
                out.push(punct.as_char());
                if punct.spacing() == Spacing::Alone {
                    out.push(' ');
                }
            }
            TokenTree::Literal(literal) => {
                // `"a\u{41}"` and `"aA"` are one string; the compiler and
                // proc-macro2 escape doc comments each their own way.
                match syn::Lit::new(literal.clone()) {
                    syn::Lit::Str(s) => out.push_str(&format!("{:?}", s.value())),
                    _ => out.push_str(&literal.to_string()),
                }
                out.push(' ');
            }
        }
    }
}

/// 64-bit FNV-1a: tiny, and the same on every platform and compiler version.
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn fingerprint(text: &str) -> u64 {
        graph_fingerprint(&TokenStream::from_str(text).unwrap())
    }

    #[test]
    fn whitespace_and_comments_do_not_count() {
        let a = fingerprint("graph g { dims { M: dyn } output y = x @ w^T; }");
        let b = fingerprint("graph g {\n  // the rows\n  dims { M : dyn }\n  output y = x@w ^ T;\n}");
        assert_eq!(a, b);
    }

    #[test]
    fn groups_are_written_the_same_however_deep() {
        let mut text = String::new();
        normal_form(&TokenStream::from_str("f(a, [b]) {}").unwrap(), &mut text);
        assert_eq!(text, "f ( a , [ b ] ) { } ");
        let deep = format!("{}x{}", "(".repeat(20_000), ")".repeat(20_000));
        assert_ne!(fingerprint(&deep), fingerprint("(x)"));
    }

    #[test]
    fn a_changed_dim_changes_the_hash() {
        let a = fingerprint("graph g { dims { D: 4096 } }");
        let b = fingerprint("graph g { dims { D: 2048 } }");
        assert_ne!(a, b);
    }

    #[test]
    fn doc_comments_count_by_their_text() {
        let doc = fingerprint("/// One block.\ngraph g {}");
        let attr = fingerprint("#[doc = \" One block.\"] graph g {}");
        assert_eq!(doc, attr);
        assert_ne!(doc, fingerprint("/// Two blocks.\ngraph g {}"));
    }

    #[test]
    fn joint_punctuation_is_not_two_tokens() {
        assert_ne!(fingerprint("a -> b"), fingerprint("a - > b"));
    }
}
