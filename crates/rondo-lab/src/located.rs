//! A scenario file's errors, located at their line, column and field path ([`ScenarioError`],
//! made through [`Ctx`]), and the unit conversion every part of a scenario uses.

use std::fmt;

/// One problem in a scenario file: `FILE:LINE:COLUMN: field `FIELD`: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ScenarioError {
    /// The scenario file.
    pub file: String,
    /// 1-based line; 0 when no position applies (an unreadable file).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Field path such as `member[2].service.mean_ms`; empty when none can be named.
    pub field: String,
    /// What is wrong: lower case, no trailing period.
    pub message: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: ", self.file)?;
        } else {
            write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, "field `{}`: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

/// A scenario file being read: its name and text, to locate errors in.
pub(crate) struct Ctx<'a> {
    pub(crate) file: &'a str,
    pub(crate) text: &'a str,
}

impl Ctx<'_> {
    pub(crate) fn err(
        &self,
        offset: usize,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> ScenarioError {
        let (line, column) = line_column(self.text, offset);
        ScenarioError {
            file: self.file.to_owned(),
            line,
            column,
            field: field.into(),
            message: message.into(),
        }
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[start..].chars().count() + 1)
}

/// Milliseconds as nanoseconds (the simulator's unit).
pub(crate) fn ms(v: f64) -> f64 {
    v * 1e6
}
