//! The defaults set at runtime (admin API `PUT /api/v1/defaults`) and what the file layer's view
//! was compiled from, so that a change of defaults recompiles that source with them and swaps
//! the result in as one view: every cluster that did not set the field changes at once.
//!
//! The override outlives reloads: the reloader merges it over the file's `[defaults]` each time,
//! until `DELETE /api/v1/defaults` removes it. It is not written anywhere, so a restart forgets
//! it (the file is the lasting record).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rondo_config::{Config, ConfigErrors, DefaultsOverride};

/// What the file layer's view was last compiled from.
#[derive(Debug, Clone, Default)]
enum Source {
    /// Nothing yet (a process without a config file, as in tests).
    #[default]
    None,
    /// The config file (start and reloads).
    File(PathBuf),
    /// A configuration posted to the admin API.
    Text(String),
}

/// The runtime defaults and the source they are applied to.
#[derive(Debug, Default)]
pub struct Defaults {
    over: Mutex<Option<DefaultsOverride>>,
    source: Mutex<Source>,
}

impl Defaults {
    /// The defaults set at runtime, if any.
    pub fn over(&self) -> Option<DefaultsOverride> {
        self.over.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The file layer now comes from the config file at `path`.
    pub fn from_file(&self, path: &Path) {
        *self.source.lock().unwrap_or_else(|e| e.into_inner()) = Source::File(path.to_path_buf());
    }

    /// The file layer now comes from a configuration posted as `text`.
    pub fn from_text(&self, text: &str) {
        *self.source.lock().unwrap_or_else(|e| e.into_inner()) = Source::Text(text.to_owned());
    }

    /// Compiles the file layer's source again with `over` as the runtime defaults, as view
    /// `view_id`; `commit` applies the result, and only when it returns true does `over`
    /// become the runtime defaults. Calls are serialised. Errors: the source's, or that there
    /// is no source.
    pub fn change<T>(
        &self,
        over: Option<DefaultsOverride>,
        view_id: u64,
        commit: impl FnOnce(Config) -> Result<T, T>,
    ) -> Result<Result<T, T>, ConfigErrors> {
        let mut current = self.over.lock().unwrap_or_else(|e| e.into_inner());
        let source = self.source.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let config = match &source {
            Source::File(path) => rondo_config::load_file_over(
                path,
                view_id,
                rondo_config::Features::ALL,
                over.as_ref(),
            )?,
            Source::Text(text) => {
                rondo_config::parse_str_over(text, Path::new("admin-api"), view_id, over.as_ref())?
            }
            Source::None => {
                return Err(ConfigErrors::whole_file(
                    Path::new("admin-api"),
                    "this process has no configuration to apply defaults to".to_owned(),
                ));
            }
        };
        let outcome = commit(config);
        if outcome.is_ok() {
            *current = over;
        }
        Ok(outcome)
    }
}
