//! `include = ["conf.d/*.toml"]`: a configuration in several files. The files a top-level
//! `include` names (paths relative to the main file's directory; `*`, `?` and `[...]` through
//! the glob crate, matches in name order) are read after the main file, as if appended to it.
//! An included file holds tables only (`[cluster.api]`, `[[route]]`): a bare key at its top
//! would land in whatever table the text before it left open. Included files include nothing.
//!
//! The texts are checked as one, and every error is reported at its own file, line and column
//! ([`Sources::locate`]). Relative paths inside any of them are relative to the main file's
//! directory, as they always are.

use std::path::{Path, PathBuf};

use crate::error::{ConfigError, ConfigErrors, line_column};

/// The text the configuration is read from: the main file, then each included file.
#[derive(Debug)]
pub(crate) struct Sources {
    /// All of them, a newline between each two.
    pub(crate) text: String,
    /// Where each file's text starts in [`Sources::text`], and the file.
    starts: Vec<(usize, PathBuf)>,
}

impl Sources {
    /// One file's text.
    pub(crate) fn single(text: &str, file: &Path) -> Sources {
        Sources { text: text.to_owned(), starts: vec![(0, file.to_path_buf())] }
    }

    /// The file, line and column of byte `offset` of [`Sources::text`].
    pub(crate) fn locate(&self, offset: usize) -> (&Path, usize, usize) {
        let i = self.starts.iter().rposition(|(start, _)| *start <= offset).unwrap_or(0);
        let (start, file) = &self.starts[i];
        let end = self.starts.get(i + 1).map_or(self.text.len(), |(s, _)| *s);
        let (line, column) = line_column(&self.text[*start..end], offset - start);
        (file, line, column)
    }

    /// The files read, the main one first.
    pub(crate) fn files(&self) -> impl Iterator<Item = &Path> {
        self.starts.iter().map(|(_, f)| f.as_path())
    }
}

/// An error at `offset` of `text`, the text of `file`.
fn error_in(file: &Path, text: &str, offset: usize, field: &str, message: String) -> ConfigError {
    let (line, column) = line_column(text, offset);
    let file = file.to_path_buf();
    ConfigError { file, line, column, field: field.to_owned(), message }
}

/// One `include` pattern: its index and offset in the main file, and the files it matches now
/// (in name order), or why it is not a pattern.
struct Pattern {
    index: usize,
    at: usize,
    matched: Result<Vec<PathBuf>, String>,
}

/// The `include` patterns of the main file's `text` (`main` its path). A text that does not
/// parse, or whose `include` is not an array of strings, has none here: the usual reading
/// reports it.
fn patterns(text: &str, main: &Path) -> Vec<Pattern> {
    // The watcher asks four times a second: a file without the word is not parsed for it.
    if !text.contains("include") {
        return Vec::new();
    }
    let Ok(doc) = toml_edit::Document::parse(text) else { return Vec::new() };
    let Some(toml_edit::Item::Value(toml_edit::Value::Array(list))) = doc.get("include") else {
        return Vec::new();
    };
    let dir = main.parent().unwrap_or(Path::new(""));
    list.iter()
        .enumerate()
        .filter_map(|(index, v)| {
            let p = v.as_str()?;
            let full = dir.join(p);
            let matched = glob::glob(&full.to_string_lossy())
                .map(|paths| {
                    let mut found: Vec<PathBuf> = paths.filter_map(Result::ok).collect();
                    found.sort();
                    found
                })
                .map_err(|e| format!("bad pattern `{p}`: {e}"))
                .and_then(|found| {
                    let wildcard = p.contains(['*', '?', '[']);
                    if found.is_empty() && !wildcard {
                        Err(format!("no such file: {}", full.display()))
                    } else {
                        Ok(found)
                    }
                });
            Some(Pattern { index, at: v.span().map_or(0, |s| s.start), matched })
        })
        .collect()
}

/// The main file's `text` (read from `main`) and the files its `include` names.
pub(crate) fn gather(text: &str, main: &Path) -> Result<Sources, Vec<ConfigError>> {
    let mut sources = Sources::single(text, main);
    let mut errors = Vec::new();
    for p in patterns(text, main) {
        let field = format!("include[{}]", p.index);
        let files = match p.matched {
            Ok(files) => files,
            Err(why) => {
                errors.push(error_in(main, text, p.at, &field, why));
                continue;
            }
        };
        for file in files {
            match read_included(&file) {
                Ok(t) => {
                    // A newline between files: the one before may end without one.
                    sources.text.push('\n');
                    sources.starts.push((sources.text.len(), file));
                    sources.text.push_str(&t);
                }
                Err(mut e) => errors.append(&mut e),
            }
        }
    }
    if errors.is_empty() { Ok(sources) } else { Err(errors) }
}

/// The largest included file read (a configuration is kilobytes; a pattern that reaches a log or
/// a device must not hold the reader).
const MAX_INCLUDED_BYTES: u64 = 16 << 20;

/// An included file's text, once it is known to hold tables only.
fn read_included(file: &Path) -> Result<String, Vec<ConfigError>> {
    let whole = |message: String| ConfigErrors::whole_file(file, message).errors;
    match std::fs::metadata(file) {
        Ok(m) if !m.is_file() => return Err(whole("not a regular file".to_owned())),
        Ok(m) if m.len() > MAX_INCLUDED_BYTES => {
            return Err(whole(format!("over {MAX_INCLUDED_BYTES} bytes: not a configuration")));
        }
        _ => {}
    }
    let text = crate::read_text(file).map_err(|e| e.errors)?;
    let doc = match toml_edit::Document::parse(text.as_str()) {
        Ok(doc) => doc,
        Err(e) => {
            let at = e.span().map_or(0, |s| s.start);
            let message = e.message().trim_end_matches('.').to_owned();
            return Err(vec![error_in(file, &text, at, "", message)]);
        }
    };
    let bare: Vec<ConfigError> = doc
        .as_table()
        .iter()
        .filter(|(_, item)| item.is_value())
        .map(|(key, _)| {
            let at = doc.as_table().key(key).and_then(|k| k.span()).map_or(0, |s| s.start);
            let message = format!(
                "an included file holds tables only (`[cluster.NAME]`, `[[route]]`...): \
                 `{key}` belongs in the main file"
            );
            error_in(file, &text, at, key, message)
        })
        .collect();
    if bare.is_empty() { Ok(text) } else { Err(bare) }
}

/// The files the configuration at `path` is read from (the main file and what its `include`
/// names now, readable or not), for a watcher.
pub fn config_files(path: &Path) -> Vec<PathBuf> {
    let mut files = vec![path.to_path_buf()];
    if let Ok(text) = crate::read_text(path) {
        for p in patterns(&text, path) {
            files.extend(p.matched.unwrap_or_default());
        }
    }
    files
}
