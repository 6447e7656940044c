//! `rewrite`: the path members get (the route's matched prefix replaced, or a regular
//! expression's match replaced with captures) and the `Host` they get. A rewritten path is
//! normalized as a client's is (dot segments, `//`, unreserved escapes), so a rewrite can never
//! hand a member a path the router would have read otherwise; one that is not a valid path
//! (a capture that made spaces) leaves the path as it was.

use http::HeaderValue;
use rondo_core::Route;
use rondo_core::traffic::Rewrite;

use super::{Applied, Info};

/// A compiled `rewrite`.
pub(super) struct RewriteStep {
    /// The prefix replaced (the route's `match.path_prefix`, or `/`) and its replacement.
    prefix: Option<(String, String)>,
    regex: Option<(regex::Regex, String)>,
    host: Option<HeaderValue>,
}

impl RewriteStep {
    pub(super) fn new(spec: &Rewrite, route: &Route) -> RewriteStep {
        let from = route.matcher.path_prefix.clone().unwrap_or_else(|| "/".to_owned());
        RewriteStep {
            prefix: spec.path_prefix.clone().map(|to| (from, to)),
            // Checked when the configuration was loaded.
            regex: spec
                .path_regex
                .as_ref()
                .and_then(|(re, to)| Some((regex::Regex::new(re).ok()?, to.clone()))),
            host: spec.host.as_deref().and_then(|h| HeaderValue::from_str(h).ok()),
        }
    }

    pub(super) fn request(&self, info: &Info<'_>, applied: &mut Applied) {
        let path = applied.path.as_deref().unwrap_or(info.path);
        let rewritten = if let Some((from, to)) = &self.prefix {
            path.strip_prefix(from.as_str()).map(|rest| format!("{to}{rest}"))
        } else if let Some((re, to)) = &self.regex {
            re.is_match(path).then(|| re.replace(path, to.as_str()).into_owned())
        } else {
            None
        };
        if let Some(new) = rewritten.and_then(fit) {
            applied.path = Some(new);
        }
        if let Some(host) = &self.host {
            applied.host = Some(host.clone());
        }
    }
}

/// `path` as members may get it: absolute, visible ASCII without `?` or `#`, normalized.
fn fit(path: String) -> Option<String> {
    let path = if path.starts_with('/') { path } else { format!("/{path}") };
    let ok = path.bytes().all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
    ok.then(|| rondo_core::path::normalize(&path).unwrap_or(path))
}

#[cfg(test)]
mod tests {
    #[test]
    fn rewritten_paths_are_normalized_and_unfit_ones_refused() {
        assert_eq!(super::fit("/v2/../admin".into()).as_deref(), Some("/admin"));
        assert_eq!(super::fit("v2//x".into()).as_deref(), Some("/v2/x"));
        assert_eq!(super::fit("/a b".into()), None);
        assert_eq!(super::fit("/a?b".into()), None);
    }
}
