//! The filter table: priority order, head conditions (presence, absence, query parameters),
//! routes that need the body first (`Lookup::NeedsBody`), and `all-matches`' other routes.

use std::sync::Arc;
use std::time::Duration;

use rondo_core::{
    BodyPeek, Filter, FilterRef, Lookup, RequestFacts, Route, RouteMatch, View, query_has,
};

/// A body filter that matches bodies starting with its text.
#[derive(Debug)]
struct Starts(String);

impl Filter for Starts {
    fn describe(&self) -> &str {
        &self.0
    }
    fn matches_head(&self, _: &RequestFacts<'_>) -> bool {
        true
    }
    fn reads_body(&self) -> bool {
        true
    }
    fn matches_body(&self, body: &BodyPeek<'_>) -> bool {
        body.bytes.starts_with(self.0.as_bytes())
    }
}

fn route(name: &str, position: usize, matcher: RouteMatch) -> Route {
    Route {
        name: name.into(),
        listener: "web".into(),
        matcher,
        cluster: name.into(),
        split: vec![],
        backups: vec![],
        idle_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(1),
        auth: None,
        login: None,
        priority: 0,
        position,
        multicast: vec![],
        multicast_max_body_bytes: Route::DEFAULT_MULTICAST_MAX_BODY,
        session_replay: None,
        filters: vec![],
        compiled: Default::default(),
    }
}

fn body_route(name: &str, position: usize, starts: &str, peek: u64) -> Route {
    let matcher = RouteMatch {
        filters: vec![FilterRef(Arc::new(Starts(starts.into())))],
        max_peek_bytes: peek,
        ..RouteMatch::default()
    };
    route(name, position, matcher)
}

fn found<'v>(l: Lookup<'v>) -> Option<&'v str> {
    match l {
        Lookup::Found(r) => Some(r.name.as_str()),
        Lookup::NoRoute => None,
        Lookup::NeedsBody(n) => panic!("needs {n} body bytes"),
    }
}

fn facts<'a>(
    query: Option<&'a str>,
    header: &'a dyn Fn(&str) -> Option<&'a str>,
    present: &'a dyn Fn(&str) -> bool,
    body: Option<BodyPeek<'a>>,
) -> RequestFacts<'a> {
    RequestFacts { host: None, path: "/", query, method: "POST", header, present, body }
}

#[test]
fn body_routes_ask_for_the_most_bytes_any_of_them_reads() {
    let view = View {
        id: 1,
        routes: vec![
            body_route("a", 0, "alpha", 100),
            body_route("b", 1, "beta", 500),
            route("rest", 2, RouteMatch::default()),
        ],
        clusters: Default::default(),
    };
    let (none, absent) = (|_: &str| None, |_: &str| false);
    let head = facts(None, &none, &absent, None);
    assert!(matches!(view.lookup("web", &head, false), Lookup::NeedsBody(500)));
    let with = |b: &'static [u8], complete| {
        view.lookup(
            "web",
            &facts(None, &none, &absent, Some(BodyPeek { bytes: b, complete })),
            false,
        )
    };
    assert_eq!(found(with(b"beta...", true)), Some("b"));
    assert_eq!(found(with(b"alpha", true)), Some("a"));
    assert_eq!(found(with(b"gamma", true)), Some("rest"));
    // A route that matches without the body before any body route decides alone.
    let view = View {
        id: 1,
        routes: vec![route("rest", 0, RouteMatch::default()), body_route("a", 1, "alpha", 100)],
        clusters: Default::default(),
    };
    assert_eq!(found(view.lookup("web", &head, false)), Some("rest"));
    // Under all-matches every matching route must be decided.
    assert!(matches!(view.lookup("web", &head, true), Lookup::NeedsBody(100)));
    let body = facts(None, &none, &absent, Some(BodyPeek { bytes: b"alpha", complete: true }));
    let first = match view.lookup("web", &body, true) {
        Lookup::Found(r) => r,
        other => panic!("{other:?}"),
    };
    let also: Vec<&str> =
        view.also_matching("web", first, &body).iter().map(|r| r.name.as_str()).collect();
    assert_eq!((first.name.as_str(), also), ("rest", vec!["a"]));
}

#[test]
fn a_body_filter_sees_at_most_its_route_s_peek() {
    let r = body_route("a", 0, "0123456789", 5);
    let peek = BodyPeek { bytes: b"0123456789", complete: true };
    assert!(!r.matcher.body_matches(&peek), "only 5 bytes are seen");
    let r = body_route("a", 0, "01234", 5);
    assert!(r.matcher.body_matches(&peek));
}

#[test]
fn presence_absence_and_query_parameters() {
    let m = RouteMatch {
        headers_present: vec!["x-a".into()],
        headers_absent: vec!["x-b".into()],
        query: vec![("q".into(), "a b".into())],
        ..RouteMatch::default()
    };
    let none = |_: &str| None;
    let only_a = |n: &str| n == "x-a";
    let both = |n: &str| n == "x-a" || n == "x-b";
    assert!(m.matches(&facts(Some("q=a+b"), &none, &only_a, None)));
    assert!(m.matches(&facts(Some("x=1&q=a%20b"), &none, &only_a, None)));
    assert!(!m.matches(&facts(Some("q=a+b"), &none, &both, None)));
    assert!(!m.matches(&facts(Some("q=ab"), &none, &only_a, None)));
    assert!(!m.matches(&facts(None, &none, &only_a, None)));
    assert!(query_has(Some("flag&x=1"), "flag", ""));
    assert!(query_has(Some("%71=%7"), "q", "%7"), "a broken escape is itself");
    assert!(!query_has(Some("q=1"), "q", "12"));
}
