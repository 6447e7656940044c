//! The chain's request phase on a request as both codecs describe it (pure: no socket).

use rondo_core::traffic::{FieldEdits, HeaderEdits, Redirect, Template, TrafficFilter};

use super::*;

struct Fields(Vec<(&'static str, &'static str)>);

impl Headers for Fields {
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.0.iter().filter(move |(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_bytes())
    }

    fn get(&self, name: &str) -> Option<&[u8]> {
        self.0.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_bytes())
    }
}

fn info() -> Info<'static> {
    Info {
        client_ip: b"10.0.0.7",
        method: "GET",
        tls: false,
        host: Some("example.com"),
        authority: "example.com:8080",
        path: "/api/items",
        query: Some("a=1"),
    }
}

fn chain(filters: Vec<TrafficFilter>) -> Chain {
    chain_over(filters, vec![])
}

/// A chain of `filters` on route `r` to cluster `c` of `members` (`(name, address)`).
fn chain_over(filters: Vec<TrafficFilter>, members: Vec<(&str, &str)>) -> Chain {
    let spec = rondo_core::ClusterSpec {
        name: "c".into(),
        members: members
            .into_iter()
            .map(|(name, address)| rondo_core::MemberSpec {
                name: name.into(),
                address: address.into(),
                weight: 1,
                group: None,
                admin: rondo_core::AdminState::Active,
            })
            .collect(),
        policy: rondo_core::Policy::default(),
        upstream_protocol: rondo_core::UpstreamProtocol::Http1,
        sticky: Default::default(),
        upstream_tls: None,
    };
    let view = rondo_core::View {
        id: 1,
        routes: vec![],
        clusters: [("c".to_owned(), Arc::new(spec))].into_iter().collect(),
    };
    let live = Arc::new(rondo_runtime::Live::new(view, None));
    let route = Route {
        name: "r".into(),
        listener: "web".into(),
        matcher: rondo_core::RouteMatch { path_prefix: Some("/api/".into()), ..Default::default() },
        cluster: "c".into(),
        split: vec![],
        backups: vec![],
        idle_timeout: std::time::Duration::from_secs(1),
        request_timeout: std::time::Duration::from_secs(1),
        auth: None,
        login: None,
        priority: 0,
        position: 0,
        multicast: vec![],
        multicast_max_body_bytes: 1,
        session_replay: None,
        filters: vec![],
        compiled: Default::default(),
    };
    let (limits, metrics) = (limit::Limits::default(), rondo_runtime::metrics::Metrics::new());
    let binder = limit::Binder::detached(&limits, &metrics, "r");
    Chain::compile(filters.iter().map(Some), &route, &binder, &live)
}

fn no_auth(_: &Fields) -> Result<Option<crate::auth::Identity>, ProxyError> {
    Ok(None)
}

fn t(s: &str, response: bool) -> Template {
    Template::parse(s, response).unwrap()
}

#[test]
fn header_edits_apply_in_order_with_variables() {
    let edits = HeaderEdits {
        request: FieldEdits {
            remove: vec!["x-debug".into()],
            set: vec![("x-env".into(), t("prod-${client_ip}", false))],
            add: vec![("x-tag".into(), t("a", false))],
        },
        response: FieldEdits {
            set: vec![("x-served-by".into(), t("${member} for ${host}", true))],
            ..Default::default()
        },
    };
    let c = chain(vec![TrafficFilter::Headers(edits)]);
    let applied = c.request(&info(), &Fields(vec![]), no_auth).ok().expect("no answer");
    let request = applied.request_ops();
    assert_eq!(request.drop, ["x-debug", "x-env"]);
    let appended: Vec<_> =
        request.append.iter().map(|(n, v)| (n.as_str(), v.to_str().unwrap())).collect();
    assert_eq!(appended, [("x-env", "prod-10.0.0.7"), ("x-tag", "a")]);
    let resp = applied.response("m2");
    assert_eq!(resp.append[0].1, "m2 for example.com");
    assert_eq!(resp.drop, ["x-served-by"]);
}

#[test]
fn a_prefix_rewrite_replaces_the_matched_prefix_and_a_redirect_keeps_the_query() {
    let rewrite =
        rondo_core::traffic::Rewrite { path_prefix: Some("/v2/".into()), ..Default::default() };
    let c = chain(vec![TrafficFilter::Rewrite(rewrite)]);
    let applied = c.request(&info(), &Fields(vec![]), no_auth).ok().expect("no answer");
    assert_eq!(applied.target(Some("a=1")).as_deref(), Some("/v2/items?a=1"));

    let r = Redirect {
        scheme: Some("https".into()),
        host: None,
        port: None,
        path: None,
        status: 308,
        keep_query: true,
    };
    let c = chain(vec![TrafficFilter::Redirect(r)]);
    let Err(stopped) = c.request(&info(), &Fields(vec![]), no_auth) else { panic!("no redirect") };
    let Stopped::Answered(answer, _) = *stopped else { panic!("refused") };
    assert_eq!(answer.status, 308);
    // The scheme changed, so the plain port goes.
    assert_eq!(answer.headers[0].1, "https://example.com/api/items?a=1");
}

#[test]
fn a_request_id_is_kept_or_made_and_echoed() {
    let spec = rondo_core::traffic::RequestId { header: "x-request-id".into(), trace: true };
    let c = chain(vec![TrafficFilter::RequestId(spec)]);
    let sent = Fields(vec![("X-Request-Id", "abc-123")]);
    let applied = c.request(&info(), &sent, no_auth).ok().expect("no answer");
    assert_eq!(applied.request_id(), Some("abc-123"));
    assert_eq!(applied.response("").append[0].1, "abc-123");
    assert!(applied.next_span().is_some());
    let bad = Fields(vec![("X-Request-Id", "has space")]);
    let made = c.request(&info(), &bad, no_auth).ok().expect("no answer");
    assert_eq!(made.request_id().map(str::len), Some(36));
}

#[test]
fn a_host_names_its_port_and_an_ipv6_literal_does_not_by_its_colons() {
    assert_eq!(port_of("example.com:8080"), Some(8080));
    assert_eq!(port_of("example.com"), None);
    assert_eq!(port_of("[::1]:8443"), Some(8443));
    assert_eq!(port_of("[::1]"), None);
    assert_eq!(port_of("example.com:x"), None);
    assert_eq!(port_of("example.com:"), None);
}

/// A name edited by two filters: the later edits look through the earlier ones (only a chain's
/// first edit of a name skips that), and the result is what the edits say in order.
#[test]
fn a_name_edited_by_two_filters_ends_as_the_last_edit_says() {
    let request = |remove: &[&str], set: &[(&str, &str)], add: &[(&str, &str)]| HeaderEdits {
        request: FieldEdits {
            remove: remove.iter().map(|n| n.to_string()).collect(),
            set: set.iter().map(|(n, v)| (n.to_string(), t(v, false))).collect(),
            add: add.iter().map(|(n, v)| (n.to_string(), t(v, false))).collect(),
        },
        response: FieldEdits::default(),
    };
    let id = rondo_core::traffic::RequestId { header: "x-request-id".into(), trace: true };
    let c = chain(vec![
        TrafficFilter::RequestId(id),
        TrafficFilter::Headers(request(&["x-request-id"], &[("x-a", "1")], &[("x-b", "2")])),
        TrafficFilter::Headers(request(&[], &[("x-b", "3")], &[("x-a", "4")])),
    ]);
    let applied = c.request(&info(), &Fields(vec![]), no_auth).ok().expect("no answer");
    let request = applied.request_ops();
    assert_eq!(request.drop, ["x-request-id", "traceparent", "x-a", "x-b"]);
    let appended: Vec<_> =
        request.append.iter().map(|(n, v)| (n.as_str(), v.to_str().unwrap())).collect();
    assert_eq!(appended.len(), 4, "{appended:?}");
    assert_eq!(appended[0].0, "traceparent");
    assert_eq!(appended[1..], [("x-a", "1"), ("x-b", "3"), ("x-a", "4")]);
}

#[test]
fn redirect_to_member_sends_each_request_to_the_next_pick_with_its_path_and_query() {
    use rondo_core::traffic::RedirectToMember;
    let spec = RedirectToMember { status: 307, keep_query: true };
    let c = chain_over(
        vec![TrafficFilter::RedirectToMember(spec)],
        vec![("m1", "127.0.0.1:9001"), ("m2", "127.0.0.1:9002")],
    );
    let mut seen = Vec::new();
    for _ in 0..4 {
        let Err(stopped) = c.request(&info(), &Fields(vec![]), no_auth) else { panic!("proxied") };
        let Stopped::Answered(answer, _) = *stopped else { panic!("refused") };
        assert_eq!(answer.status, 307);
        seen.push(answer.headers[0].1.to_str().unwrap().to_owned());
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            "http://127.0.0.1:9001/api/items?a=1",
            "http://127.0.0.1:9001/api/items?a=1",
            "http://127.0.0.1:9002/api/items?a=1",
            "http://127.0.0.1:9002/api/items?a=1",
        ]
    );
    // No member: a 503 saying why, never a panic.
    let c = chain_over(vec![TrafficFilter::RedirectToMember(spec)], vec![]);
    let Err(stopped) = c.request(&info(), &Fields(vec![]), no_auth) else { panic!("proxied") };
    let Stopped::Answered(answer, _) = *stopped else { panic!("refused") };
    assert_eq!(answer.status, 503);
    assert!(String::from_utf8_lossy(&answer.body).starts_with("no member to redirect to"));
}
