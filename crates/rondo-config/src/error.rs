//! Configuration errors: one [`ConfigError`] per problem, each naming the file, the 1-based line
//! and column of the offending text, the field path and what is wrong; [`ConfigErrors`] carries
//! every problem found in one file. Also the byte-offset → line/column conversion they rely on.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a configuration file.
///
/// Displayed as `FILE:LINE:COLUMN: field `FIELD`: MESSAGE`. When no field can be named (a TOML
/// syntax error, an unreadable file) the `field` is empty and the `field ...: ` part is left out;
/// when no position can be named (an unreadable file) the line is 0 and the display is
/// `FILE: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The configuration file.
    pub file: PathBuf,
    /// 1-based line of the offending text; 0 when there is none (the file could not be read).
    pub line: usize,
    /// 1-based column, in characters, of the offending text (0 with line 0).
    pub column: usize,
    /// Field path such as `cluster.components.members[1].weight` or `route[0].cluster`; array
    /// indices are 0-based, in file order. Empty when no field can be named.
    pub field: String,
    /// What is wrong: lower case, no trailing period.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file.display().to_string();
        let file = escape_controls(&file);
        if self.line == 0 {
            write!(f, "{file}: ")?;
        } else {
            write!(f, "{file}:{}:{}: ", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, "field `{}`: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// The display of this problem as a warning: `FILE:LINE:COLUMN: warning: field `FIELD`:
    /// MESSAGE`.
    pub fn as_warning(&self) -> String {
        let text = self.to_string();
        let prefix = if self.line == 0 {
            format!("{}: ", self.file.display())
        } else {
            format!("{}:{}:{}: ", self.file.display(), self.line, self.column)
        };
        match text.strip_prefix(&prefix) {
            Some(rest) => format!("{prefix}warning: {rest}"),
            None => format!("warning: {text}"),
        }
    }
}

/// Every problem found in one configuration file, in file order where it could be established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    /// The problems; never empty when returned as an error.
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    /// The problems.
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.errors.iter()
    }

    /// How many problems there are.
    pub fn len(&self) -> usize {
        self.errors.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// A single problem not tied to any position (line 0: shown as `FILE: MESSAGE`).
    pub fn whole_file(file: &Path, message: String) -> Self {
        ConfigErrors {
            errors: vec![ConfigError {
                file: file.to_path_buf(),
                line: 0,
                column: 0,
                field: String::new(),
                message: escape_controls(&message).into_owned(),
            }],
        }
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.errors.into_iter()
    }
}

/// `s` with every control character (escape, newline, tab, DEL, C1 controls) written as its Rust
/// escape (`\u{1b}`, `\n`): error messages echo values from the file, and a value must not be
/// able to move the cursor, recolour a terminal or forge a second line in a log.
pub(crate) fn escape_controls(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// 1-based line and column (in characters) of byte `offset` in `text`. Offsets past the end or
/// inside a multi-byte character are clamped to the nearest preceding character boundary.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_column_is_one_based() {
        let text = "ab\ncdé\nf";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 1), (1, 2));
        assert_eq!(line_column(text, 3), (2, 1));
        assert_eq!(line_column(text, 5), (2, 3));
        // Inside `é` (bytes 5..7) clamps back to its start.
        assert_eq!(line_column(text, 6), (2, 3));
        assert_eq!(line_column(text, 8), (3, 1));
        assert_eq!(line_column(text, 100), (3, 2));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(escape_controls("plain `x` é"), "plain `x` é");
        assert_eq!(
            escape_controls("a\u{1b}[31mb\nc\td\u{7f}\u{85}"),
            "a\\u{1b}[31mb\\nc\\td\\u{7f}\\u{85}"
        );
    }

    #[test]
    fn display_with_and_without_field() {
        let mut e = ConfigError {
            file: PathBuf::from("rondo.toml"),
            line: 3,
            column: 7,
            field: "route[0].cluster".into(),
            message: "unknown cluster `x`".into(),
        };
        assert_eq!(e.to_string(), "rondo.toml:3:7: field `route[0].cluster`: unknown cluster `x`");
        assert_eq!(
            e.as_warning(),
            "rondo.toml:3:7: warning: field `route[0].cluster`: unknown cluster `x`"
        );
        e.field.clear();
        assert_eq!(e.to_string(), "rondo.toml:3:7: unknown cluster `x`");
        e.line = 0;
        assert_eq!(e.to_string(), "rondo.toml: unknown cluster `x`");
    }
}
