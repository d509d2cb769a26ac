//! Source locations and error messages shared by every stage of the compiler.
//!
//! Both front ends attach a [`Span`] to what they parse; later stages (IR
//! validation, fusion) report problems as [`Diagnostic`]s that keep that span,
//! so an error in a graph points at the user's file, line and column whether
//! the graph came from TOML or from a `fusion_graph!` invocation.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where something was written.
///
/// Spans are locations, not content: two declarations that say the same thing
/// compare equal wherever they were written (so the TOML and macro front ends
/// can be checked against each other).
#[derive(Clone, Copy, Debug, Default)]
pub enum Span {
    /// A byte range in a [`SourceFile`] (the TOML front end).
    Source {
        /// The first byte.
        lo: usize,
        /// One past the last byte.
        hi: usize,
    },
    /// A token's span: the compiler's inside `fusion_graph!`, or proc-macro2's
    /// own (with line and column) when a build script parses Rust source.
    Tokens(proc_macro2::Span),
    /// Built programmatically: there is no source to point at.
    #[default]
    None,
}

impl PartialEq for Span {
    fn eq(&self, _: &Span) -> bool {
        true
    }
}

impl Span {
    /// Byte range in a source file, for the TOML front end.
    pub fn source(lo: usize, hi: usize) -> Span {
        Span::Source { lo, hi }
    }

    /// The smallest span covering both, where both are in the same kind of source.
    pub fn join(self, other: Span) -> Span {
        match (self, other) {
            (Span::Source { lo: a, hi: b }, Span::Source { lo: c, hi: d }) => Span::Source {
                lo: a.min(c),
                hi: b.max(d),
            },
            (Span::Tokens(a), Span::Tokens(b)) => Span::Tokens(a.join(b).unwrap_or(a)),
            (Span::None, s) | (s, Span::None) => s,
            (s, _) => s,
        }
    }
}

/// One problem, with where it was found.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostic {
    /// What is wrong, as one sentence.
    pub message: String,
    /// Where it is wrong.
    pub span: Span,
    /// Extra sentences: what to do about it.
    pub notes: Vec<String>,
    /// Other places that matter (where a name was first defined).
    pub labels: Vec<(Span, String)>,
}

impl Diagnostic {
    /// A problem at `span`, without notes or labels.
    pub fn new(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            span,
            notes: Vec::new(),
            labels: Vec::new(),
        }
    }

    /// Adds another place that matters, with what it is.
    pub fn with_label(mut self, span: Span, label: impl Into<String>) -> Diagnostic {
        self.labels.push((span, label.into()));
        self
    }

    /// Adds a sentence saying what to do about it.
    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        for note in &self.notes {
            write!(f, "\n  note: {note}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostic {}

/// How many diagnostics [`Diagnostics::render`] shows.
pub const MAX_RENDERED: usize = 50;

/// Every problem a stage found, in the order found. Never empty.
#[derive(Clone, Debug, PartialEq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// The diagnostics, in the order found.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }

    /// Renders the diagnostics against the file they came from: the first
    /// [`MAX_RENDERED`], then a line counting the rest. (Locating one is a
    /// pass over the file, and a generated file can hold an error per line.)
    pub fn render(&self, source: &SourceFile) -> String {
        let mut lines: Vec<String> = self
            .0
            .iter()
            .take(MAX_RENDERED)
            .map(|d| source.render(d))
            .collect();
        if self.0.len() > MAX_RENDERED {
            let more = self.0.len() - MAX_RENDERED;
            lines.push(format!(
                "{}: error: {more} more error{} not shown",
                source.path.display(),
                if more == 1 { "" } else { "s" }
            ));
        }
        lines.join("\n")
    }
}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Diagnostics {
        Diagnostics(vec![d])
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "error: {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

/// A 1-based line and column (columns count characters, not bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineCol {
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1, in characters.
    pub column: usize,
}

/// The largest graph file [`SourceFile::read`] accepts: hundreds of times a
/// real graph (a few hundred bytes to a few KiB), small enough that the
/// front end's passes over it take well under a second.
pub const MAX_SOURCE_BYTES: u64 = 1024 * 1024;

/// A graph's source text and the path it was read from.
#[derive(Clone, Debug)]
pub struct SourceFile {
    /// Where it was read from, as diagnostics print it.
    pub path: PathBuf,
    /// The whole text.
    pub text: String,
}

impl SourceFile {
    /// A source text and the path its diagnostics name.
    pub fn new(path: impl Into<PathBuf>, text: impl Into<String>) -> SourceFile {
        SourceFile {
            path: path.into(),
            text: text.into(),
        }
    }

    /// Reads a file of at most [`MAX_SOURCE_BYTES`]; the error names the
    /// path. It stops reading past the limit, so a file that never ends
    /// (`/dev/zero`) is refused rather than read until memory runs out.
    pub fn read(path: &Path) -> Result<SourceFile, Diagnostic> {
        use std::io::Read;
        let cannot_read =
            |e: std::io::Error| Diagnostic::new(Span::None, format!("cannot read {}: {e}", path.display()));
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_SOURCE_BYTES + 1).read_to_end(&mut bytes))
            .map_err(cannot_read)?;
        if bytes.len() as u64 > MAX_SOURCE_BYTES {
            return Err(Diagnostic::new(
                Span::None,
                format!(
                    "cannot read {}: it is larger than {} KiB, the most a graph file may be",
                    path.display(),
                    MAX_SOURCE_BYTES / 1024
                ),
            ));
        }
        let text = String::from_utf8(bytes).map_err(|_| {
            cannot_read(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "stream did not contain valid UTF-8",
            ))
        })?;
        Ok(SourceFile::new(path, text))
    }

    /// Line and column of a byte offset (clamped to the text).
    pub fn line_col(&self, offset: usize) -> LineCol {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        LineCol {
            line,
            column: before[line_start..].chars().count() + 1,
        }
    }

    /// Where a span starts and ends, if it has a location.
    pub fn locate(&self, span: Span) -> Option<(LineCol, LineCol)> {
        match span {
            Span::Source { lo, hi } => Some((self.line_col(lo), self.line_col(hi))),
            Span::Tokens(s) => {
                let (a, b) = (s.start(), s.end());
                if a.line == 0 {
                    return None;
                }
                Some((
                    LineCol {
                        line: a.line,
                        column: a.column + 1,
                    },
                    LineCol {
                        line: b.line,
                        column: b.column + 1,
                    },
                ))
            }
            Span::None => None,
        }
    }

    /// `path:line:col: error: message`, then the line with the span underlined.
    pub fn render(&self, d: &Diagnostic) -> String {
        let path = self.path.display();
        let mut out = match self.locate(d.span) {
            None => format!("{path}: error: {}", d.message),
            Some((start, end)) => {
                let mut out = format!("{path}:{}:{}: error: {}", start.line, start.column, d.message);
                if let Some(text) = self.text.lines().nth(start.line - 1) {
                    let width = if end.line == start.line && end.column > start.column {
                        end.column - start.column
                    } else {
                        1
                    };
                    let (shown, column, width) = excerpt(text, start.column, width);
                    let gutter = start.line.to_string().len();
                    out.push_str(&format!(
                        "\n{:gutter$} |\n{} | {}\n{:gutter$} | {}{}",
                        "",
                        start.line,
                        shown,
                        "",
                        " ".repeat(column - 1),
                        "^".repeat(width),
                    ));
                }
                out
            }
        };
        for (span, label) in &d.labels {
            match self.locate(*span) {
                Some((at, _)) => out.push_str(&format!(
                    "\n  = note: {label} at {path}:{}:{}",
                    at.line, at.column
                )),
                None => out.push_str(&format!("\n  = note: {label}")),
            }
        }
        for note in &d.notes {
            out.push_str(&format!("\n  = note: {note}"));
        }
        out
    }
}

/// Characters of a source line shown under an error: a generated file can
/// put a 200 KB expression on one line.
const MAX_SHOWN_CHARS: usize = 120;

/// The part of `line` to show for an underline at `column` (1-based, in
/// characters) `width` wide: the whole line when it is short, else a window
/// around the column with `…` where it was cut. Returns the text and the
/// underline's column and width within it.
fn excerpt(line: &str, column: usize, width: usize) -> (String, usize, usize) {
    let chars = line.chars().count();
    if chars <= MAX_SHOWN_CHARS {
        return (line.to_string(), column, width);
    }
    let first = column
        .saturating_sub(1 + MAX_SHOWN_CHARS / 4)
        .min(chars - MAX_SHOWN_CHARS);
    let mut shown: String = line.chars().skip(first).take(MAX_SHOWN_CHARS).collect();
    let mut column = column - first;
    if first > 0 {
        shown.insert(0, '…');
        column += 1;
    }
    if first + MAX_SHOWN_CHARS < chars {
        shown.push('…');
    }
    let width = width
        .min(MAX_SHOWN_CHARS + 1 - (column - 1).min(MAX_SHOWN_CHARS))
        .max(1);
    (shown, column, width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one_and_in_characters() {
        let f = SourceFile::new("g.toml", "a = 1\nbé = \"x\"\n");
        assert_eq!(f.line_col(0), LineCol { line: 1, column: 1 });
        assert_eq!(f.line_col(6), LineCol { line: 2, column: 1 });
        // 'é' is two bytes but one column.
        assert_eq!(f.line_col(9), LineCol { line: 2, column: 3 });
    }

    #[test]
    fn render_names_file_line_column_and_underlines() {
        let f = SourceFile::new("g.toml", "[dims]\nM = 0\n");
        let d = Diagnostic::new(Span::source(11, 12), "dim `M` must be at least 1");
        let text = f.render(&d);
        assert!(
            text.starts_with("g.toml:2:5: error: dim `M` must be at least 1"),
            "{text}"
        );
        assert!(text.contains("2 | M = 0"), "{text}");
        assert!(text.contains("    ^"), "{text}");
    }

    #[test]
    fn a_long_line_is_shown_around_the_error() {
        let line = format!("y = \"{}q{}\"", "x + ".repeat(1000), " + x".repeat(1000));
        let f = SourceFile::new("g.toml", format!("[outputs]\n{line}\n"));
        let at = f.text.find('q').unwrap();
        let text = f.render(&Diagnostic::new(Span::source(at, at + 1), "`q` is not defined"));
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("g.toml:2:4006: error: `q` is not defined"),
            "{text}"
        );
        let (shown, marks) = (lines[2], lines[3]);
        assert!(
            shown.starts_with("2 | …+ x") && shown.ends_with(" x …"),
            "{shown}"
        );
        assert_eq!(shown.chars().count(), "2 | ".len() + MAX_SHOWN_CHARS + 2);
        // The caret is under the `q` (the marks line is all one-byte chars).
        let caret = marks.find('^').unwrap();
        assert_eq!(shown.chars().nth(caret), Some('q'), "{text}");
        // A short line is shown whole, as before.
        let (whole, column, width) = excerpt("y = x", 5, 1);
        assert_eq!((whole.as_str(), column, width), ("y = x", 5, 1));
    }
}
