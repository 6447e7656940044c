//! The key every router of the tier shares (sessions, sign-on): the tier's shared
//! configuration's `[router] tier_key` while it has one, else the file's. A handle (one `Arc`),
//! read without a lock by the request path and set by the start and the registry.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwapOption;

use crate::secret::TierKey;

/// See the module docs.
#[derive(Debug, Clone, Default)]
pub struct TierKeys(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// The key in force.
    current: ArcSwapOption<TierKey>,
    /// Its two layers, and the lock that serialises their changes.
    layers: Mutex<Layers>,
}

/// The layers of the tier key: the configuration file's, and the tier's shared
/// configuration's, which is in force while set.
#[derive(Debug, Default)]
struct Layers {
    file: Option<Arc<TierKey>>,
    shared: Option<Arc<TierKey>>,
}

impl TierKeys {
    /// Sets the configuration file's tier key (at start).
    pub fn set_file(&self, key: TierKey) {
        self.change(|l| l.file = Some(Arc::new(key)));
    }

    /// Sets (or, with `None`, clears) the tier's shared configuration's key, which is in force
    /// instead of the file's while set.
    pub fn set_shared(&self, key: Option<TierKey>) {
        self.change(|l| l.shared = key.map(Arc::new));
    }

    /// The tier's key in force, when the configuration (the file's, or the tier's shared one)
    /// gives one.
    pub fn get(&self) -> Option<Arc<TierKey>> {
        self.0.current.load_full()
    }

    fn change(&self, f: impl FnOnce(&mut Layers)) {
        let mut layers = self.0.layers.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut layers);
        self.0.current.store(layers.shared.clone().or_else(|| layers.file.clone()));
    }
}
