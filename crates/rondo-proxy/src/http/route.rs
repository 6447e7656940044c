//! The route stage, shared by both codecs: the request's target as routes match it, the loop
//! guard, and the first route of the listener whose match holds (with, under `all-matches`, the
//! others that match).

use rondo_config::Routing;
use rondo_core::{BodyPeek, Lookup, RequestFacts, Route};
use rondo_runtime::Snapshot;

use super::{DEFAULT_IDLE, Failure, HttpCtx};

use crate::error::{Kind, ProxyError};
use crate::head::Headers;
use crate::headers::via_id;

/// Whether a request routed so must take hyper's path: the other matching routes of
/// `all-matches` get copies, or a step of the route's chain holds, rewrites or copies bodies
/// (`compress`, `soap`, `mirror`, `multicast`) or keeps requests whole (`session_replay`), as
/// only hyper's path has them (`Chain::needs_hyper`).
pub(crate) fn needs_hyper(ctx: &HttpCtx, routed: &Routed<'_>) -> bool {
    !routed.also.is_empty()
        || crate::chain::Chain::of(ctx, routed.route).is_some_and(crate::chain::Chain::needs_hyper)
}

/// What the route stage found: the route, and (routing `all-matches`) the other routes that
/// match, whose clusters get copies.
pub(crate) struct Routed<'s> {
    pub(crate) route: &'s Route,
    pub(crate) also: Vec<&'s Route>,
}

/// The route stage's answer: a route, or the body bytes a body filter needs to decide.
pub(crate) enum Decided<'s> {
    Route(Routed<'s>),
    NeedsBody(u64),
}

/// The 508 of a request that already passed through this router.
pub(crate) fn looped() -> Failure {
    let detail = format!(
        "request loop: it already passed through this router ({}) on its way here",
        via_id()
    );
    (ProxyError::new(Kind::Loop, detail), DEFAULT_IDLE)
}

/// What of a request's target routes match on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) host: Option<&'a str>,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
}

/// The first route of this listener whose match holds for the request (either path's), in the
/// filter table's order (priority, then file order), and under `routing = "all-matches"` the
/// other routes that match; or the body bytes a body filter needs first.
pub(crate) fn find_route<'s>(
    ctx: &HttpCtx,
    snapshot: &'s Snapshot,
    headers: &impl Headers,
    target: Target<'_>,
    body: Option<BodyPeek<'_>>,
) -> Result<Decided<'s>, Failure> {
    let lookup = |n: &str| headers.get_str(n);
    let present = |n: &str| headers.get(n).is_some();
    let Target { host, method, path, query } = target;
    let facts =
        RequestFacts { host, path, query, method, header: &lookup, present: &present, body };
    let listener = ctx.listener.name.as_str();
    let all = ctx.listener.routing == Routing::AllMatches;
    match snapshot.view.lookup(listener, &facts, all) {
        Lookup::Found(route) => {
            let also =
                if all { snapshot.view.also_matching(listener, route, &facts) } else { Vec::new() };
            Ok(Decided::Route(Routed { route, also }))
        }
        Lookup::NeedsBody(n) => Ok(Decided::NeedsBody(n)),
        Lookup::NoRoute => {
            let detail = format!(
                "no route on listener {} matches {method} {}{path}",
                ctx.listener.name,
                host.unwrap_or(""),
            );
            Err((ProxyError::new(Kind::NoRoute, detail), DEFAULT_IDLE))
        }
    }
}

/// `host[:port]` without the port, minding IPv6 literals.
#[inline]
pub(crate) fn without_port(full: &str) -> &str {
    // The last `:` with no `]` after it, looked for from the end by hand: `rfind` went through
    // the generic searcher, a call per request (the port is a few bytes from the end).
    for (i, b) in full.bytes().enumerate().rev() {
        match b {
            b':' => return &full[..i],
            b']' => return full,
            _ => {}
        }
    }
    full
}

#[cfg(test)]
mod tests {
    use super::without_port;

    #[test]
    fn a_host_loses_its_port_and_an_ipv6_literal_keeps_its_colons() {
        assert_eq!(without_port("example.com:8080"), "example.com");
        assert_eq!(without_port("example.com"), "example.com");
        assert_eq!(without_port("[::1]:8080"), "[::1]");
        assert_eq!(without_port("[::1]"), "[::1]");
        assert_eq!(without_port("127.0.0.1:80"), "127.0.0.1");
    }
}
