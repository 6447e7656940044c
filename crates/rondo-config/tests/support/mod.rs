//! What the configuration's test files share: a text parsed as `conf/rondo.toml`, and the
//! assertion that an error names the right field at the right line and column, in the project's
//! message style (lower case, no trailing period).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use rondo_config::{Config, ConfigError, parse_str};

/// The name every test text is parsed under.
pub const FILE: &str = "conf/rondo.toml";

pub fn parse(text: &str) -> Result<Config, Vec<ConfigError>> {
    parse_str(text, Path::new(FILE), 7).map_err(|e| e.errors)
}

pub fn ok(text: &str) -> Config {
    match parse(text) {
        Ok(c) => c,
        Err(errors) => panic!("unexpected errors:\n{}", render(&errors)),
    }
}

pub fn errors(text: &str) -> Vec<ConfigError> {
    match parse(text) {
        Ok(_) => panic!("expected errors, the config was accepted:\n{text}"),
        Err(e) => e,
    }
}

pub fn render(errors: &[ConfigError]) -> String {
    errors.iter().map(|e| format!("{e}\n")).collect()
}

/// 1-based line and column of the first occurrence of `needle` in `text`, or of the last one
/// when `needle` starts with `$`.
pub fn pos(text: &str, needle: &str) -> (usize, usize) {
    let at = match needle.strip_prefix('$') {
        Some(n) => text.rfind(n),
        None => text.find(needle),
    };
    let at = at.unwrap_or_else(|| panic!("`{needle}` not in the text"));
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// Asserts the config fails with exactly one error, on `field`, at `needle`, whose message
/// contains `message`.
#[track_caller]
pub fn fails_once(text: &str, field: &str, needle: &str, message: &str) {
    let errs = errors(text);
    assert_eq!(errs.len(), 1, "expected one error, got:\n{}", render(&errs));
    assert_error(&errs[0], text, field, needle, message);
}

/// Asserts some error is on `field`, at `needle`, with `message` in its text.
#[track_caller]
pub fn fails_with(text: &str, field: &str, needle: &str, message: &str) {
    let errs = errors(text);
    let Some(e) = errs.iter().find(|e| e.field == field) else {
        panic!("no error on `{field}`, got:\n{}", render(&errs));
    };
    assert_error(e, text, field, needle, message);
}

#[track_caller]
pub fn assert_error(e: &ConfigError, text: &str, field: &str, needle: &str, message: &str) {
    assert_eq!(e.file, PathBuf::from(FILE));
    assert_eq!(e.field, field, "{e}");
    assert_eq!((e.line, e.column), pos(text, needle), "{e}");
    assert!(e.message.contains(message), "message of `{e}` lacks `{message}`");
    assert!(!e.message.ends_with('.'), "trailing period: {e}");
    assert!(!e.message.starts_with(|c: char| c.is_uppercase()), "upper case: {e}");
}
