//! Route filters (WCF's filter types, docs/router.md "Filters"): one test per filter type
//! against a real router, with real members. Each route's cluster has one member that answers
//! its name; a request the filter does not take falls to the default route (member `other`).
//! The body filters also check that the body reaches the member unchanged (`/echo`), that a
//! malformed body or one larger than `max_peek_bytes` does not match and crashes nothing, and
//! that the router's own HTTP/1 path hands such requests to hyper's path.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};

use super::support::{self, TestRouter, cluster_table, listener_table, route_table};

/// A router whose listener `web` has route `special` (with `special_match`, and `extra` keys)
/// to cluster `special` (member `special`), and the default route to cluster `other`.
async fn setup(special_match: &str, extra: &str) -> (TestRouter, Vec<rondo::member::Member>) {
    let special = support::spawn_member("special", 0).await;
    let other = support::spawn_member("other", 0).await;
    let config = listener_table("web", "error_detail = \"full\"")
        + &route_table("special", "web", "special", &format!("match = {special_match}\n{extra}"))
        + &route_table("default", "web", "other", "")
        + &cluster_table("special", &support::member_list(std::slice::from_ref(&special)))
        + &cluster_table("other", &support::member_list(std::slice::from_ref(&other)));
    (support::router(&config).await, vec![special, other])
}

/// A reply: status, headers, body.
pub(crate) struct Sent {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Sent {
    /// The member that answered (`x-member`).
    pub(crate) fn member(&self) -> &str {
        self.headers.get("x-member").and_then(|v| v.to_str().ok()).unwrap_or("")
    }
}

/// Sends `method url` with `headers` and `body` (10 s guard).
pub(crate) async fn send(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Sent {
    let client = support::client_of::<Full<Bytes>>(false);
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::copy_from_slice(body))).expect("request");
    let fut = async {
        let resp = client.request(req).await.expect("request succeeds");
        let (status, headers) = (resp.status(), resp.headers().clone());
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        Sent { status, headers, body }
    };
    tokio::time::timeout(Duration::from_secs(10), fut).await.expect("reply within 10 s")
}

async fn who(r: &TestRouter, method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let s = send(method, &r.url("web", path), headers, b"").await;
    assert_eq!(s.status, StatusCode::OK, "{}", String::from_utf8_lossy(&s.body));
    s.member().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_present_and_absent() {
    let m = "{ headers_present = [\"X-Debug\"], headers_absent = [\"x-canary\"] }";
    let (r, _m) = setup(m, "").await;
    assert_eq!(who(&r, "GET", "/", &[("x-debug", "")]).await, "special", "any value, even empty");
    assert_eq!(who(&r, "GET", "/", &[("x-debug", "1"), ("x-canary", "1")]).await, "other");
    assert_eq!(who(&r, "GET", "/", &[]).await, "other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_value_and_path_by_regular_expression() {
    let m = "{ path_regex = \"^/orders/[0-9]+$\", headers_regex = { \"x-tenant\" = \"^t-[a-z]{2}$\" } }";
    let (r, _m) = setup(m, "").await;
    assert_eq!(who(&r, "GET", "/orders/42", &[("x-tenant", "t-eu")]).await, "special");
    assert_eq!(who(&r, "GET", "/orders/42/items", &[("x-tenant", "t-eu")]).await, "other");
    assert_eq!(who(&r, "GET", "/orders/42", &[("x-tenant", "t-europe")]).await, "other");
    assert_eq!(who(&r, "GET", "/orders/42", &[]).await, "other", "an absent header");
    // The normalized path is matched: `%34%32` is `42`.
    assert_eq!(who(&r, "GET", "/orders/%34%32", &[("x-tenant", "t-eu")]).await, "special");
}

#[test]
fn a_bad_regular_expression_is_a_config_error_at_its_line() {
    let text = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n[[route]]\nlistener = \"web\"\ncluster = \"c\"\nmatch = { path_regex = \"^/(orders\" }\n\n[cluster.c]\nmembers = [{ name = \"m\", address = \"127.0.0.1:9\" }]\n";
    let err = rondo_config::parse_str(text, std::path::Path::new("bad.toml"), 1)
        .expect_err("an unclosed group is refused")
        .to_string();
    assert!(err.contains("bad.toml:8:"), "{err}");
    assert!(err.contains("route[0].match.path_regex"), "{err}");
    assert!(err.contains("is not a regular expression"), "{err}");
    let text = text.replace("path_regex = \"^/(orders\"", "headers_regex = { a = \"[z-a]\" }");
    let err = rondo_config::parse_str(&text, std::path::Path::new("bad.toml"), 1)
        .expect_err("a bad class is refused")
        .to_string();
    assert!(err.contains("bad.toml:8:") && err.contains("match.headers_regex.a"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_parameters() {
    let (r, _m) = setup("{ query = { region = \"eu west\", debug = \"\" } }", "").await;
    assert_eq!(who(&r, "GET", "/x?region=eu+west&debug", &[]).await, "special");
    assert_eq!(who(&r, "GET", "/x?debug=&a=1&region=eu%20west", &[]).await, "special");
    assert_eq!(who(&r, "GET", "/x?region=eu+west", &[]).await, "other");
    assert_eq!(who(&r, "GET", "/x?region=eu&debug", &[]).await, "other");
    assert_eq!(who(&r, "GET", "/x", &[]).await, "other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_before_file_order() {
    let a = support::spawn_member("a", 0).await;
    let b = support::spawn_member("b", 0).await;
    let c = support::spawn_member("c", 0).await;
    // `first` comes first in the file but `urgent` has the higher priority; `late` has the
    // same priority as `first` and comes after it.
    let config = listener_table("web", "")
        + &route_table("first", "web", "a", "match = { path_prefix = \"/\" }")
        + &route_table(
            "urgent",
            "web",
            "b",
            "priority = 10\nmatch = { headers_present = [\"x-urgent\"] }",
        )
        + &route_table("late", "web", "c", "match = { path_prefix = \"/late\" }")
        + &cluster_table("a", &support::member_list(std::slice::from_ref(&a)))
        + &cluster_table("b", &support::member_list(std::slice::from_ref(&b)))
        + &cluster_table("c", &support::member_list(std::slice::from_ref(&c)));
    let parsed = rondo_config::parse_str(&config, std::path::Path::new("t.toml"), 1).unwrap();
    // `late` is never used: `first` (route[0]) matches everything it does.
    assert!(
        parsed.warnings.iter().any(|w| w.to_string().contains("route `late` is never used")),
        "{:?}",
        parsed.warnings
    );
    let r = support::router(&config).await;
    assert_eq!(who(&r, "GET", "/late", &[("x-urgent", "1")]).await, "b");
    assert_eq!(who(&r, "GET", "/late", &[]).await, "a");
}

const ORDER_EU: &[u8] =
    br#"{"order": {"region": "eu", "lines": 3}, "note": "keep me byte for byte"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_body_field() {
    let m = "{ body_json = { \"$.order.region\" = \"eu\", \"$.order.lines\" = \"3\" }, max_peek_bytes = 256 }";
    let (r, _m) = setup(m, "").await;
    let url = r.url("web", "/echo");
    let ct = [("content-type", "application/json")];
    let s = send("POST", &url, &ct, ORDER_EU).await;
    assert_eq!((s.status, s.member()), (StatusCode::OK, "special"));
    assert_eq!(&s.body[..], ORDER_EU, "the body reaches the member unchanged");
    let us = br#"{"order": {"region": "us", "lines": 3}}"#;
    assert_eq!(send("POST", &url, &ct, us).await.member(), "other");
    // Malformed JSON: the route does not match, the request goes on unchanged elsewhere.
    let broken = br#"{"order": {"region": "eu", "lines": 3"#;
    let s = send("POST", &url, &ct, broken).await;
    assert_eq!((s.status, s.member()), (StatusCode::OK, "other"));
    assert_eq!(&s.body[..], broken);
    // No body at all.
    assert_eq!(send("POST", &url, &ct, b"").await.member(), "other");
    // Larger than the peek limit: a JSON filter needs the whole document, so it does not match
    // (documented); the whole body still reaches the member it goes to.
    let mut big = br#"{"order": {"region": "eu", "lines": 3}, "pad": ""#.to_vec();
    big.extend(std::iter::repeat_n(b'x', 100_000));
    big.extend_from_slice(b"\"}");
    let s = send("POST", &url, &ct, &big).await;
    assert_eq!((s.status, s.member()), (StatusCode::OK, "other"));
    assert_eq!(s.body.len(), big.len());
    assert!(s.body[..] == big[..], "the large body passed unchanged");
    // The router is still up and well.
    assert_eq!(send("POST", &url, &ct, ORDER_EU).await.member(), "special");
}

pub(crate) const SOAP: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<env:Envelope xmlns:env="http://www.w3.org/2003/05/soap-envelope" xmlns:wsa="http://www.w3.org/2005/08/addressing">
  <env:Header><wsa:Action>urn:orders/Submit</wsa:Action></env:Header>
  <env:Body><Submit xmlns="urn:orders"><Region>eu</Region></Submit></env:Body>
</env:Envelope>"#;

pub(crate) const SOAP_MATCH: &str = "{ body_xml = { path = \"/soap:Envelope/soap:Header/a:Action\", ns = { soap = \"http://www.w3.org/2003/05/soap-envelope\", a = \"http://www.w3.org/2005/08/addressing\" }, equals = \"urn:orders/Submit\" }, max_peek_bytes = 512 }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xml_soap_body_path_with_namespaces() {
    let (r, _m) = setup(SOAP_MATCH, "").await;
    let url = r.url("web", "/echo");
    let ct = [("content-type", "application/soap+xml")];
    // The body's prefixes (`env`, `wsa`) differ from the config's: namespaces decide.
    let s = send("POST", &url, &ct, SOAP.as_bytes()).await;
    assert_eq!((s.status, s.member()), (StatusCode::OK, "special"));
    assert_eq!(&s.body[..], SOAP.as_bytes());
    let cancel = SOAP.replace("urn:orders/Submit", "urn:orders/Cancel");
    assert_eq!(send("POST", &url, &ct, cancel.as_bytes()).await.member(), "other");
    // The same names in another namespace do not match.
    let other_ns = SOAP.replace("2005/08/addressing", "2004/08/addressing");
    assert_eq!(send("POST", &url, &ct, other_ns.as_bytes()).await.member(), "other");
    // Malformed XML: no match, nothing crashes.
    for bad in ["<env:Envelope xmlns:env=\"x\"><env:Header></wrong>", "not xml", "<<<"] {
        let s = send("POST", &url, &ct, bad.as_bytes()).await;
        assert_eq!((s.status, s.member()), (StatusCode::OK, "other"), "{bad}");
        assert_eq!(&s.body[..], bad.as_bytes());
    }
    // A body larger than the peek limit whose header lies within it matches (the element is
    // complete in the bytes read), and the whole body passes unchanged.
    let pad: String = "<Line>x</Line>".repeat(10_000);
    let big = SOAP.replace("<Region>eu</Region>", &format!("<Region>eu</Region>{pad}"));
    let s = send("POST", &url, &ct, big.as_bytes()).await;
    assert_eq!((s.status, s.member()), (StatusCode::OK, "special"));
    assert!(s.body[..] == *big.as_bytes(), "the large body passed unchanged");
    // One whose Action comes after the limit does not.
    let late = format!(
        "<env:Envelope xmlns:env=\"http://www.w3.org/2003/05/soap-envelope\" xmlns:wsa=\"http://www.w3.org/2005/08/addressing\"><env:Header><Pad>{}</Pad><wsa:Action>urn:orders/Submit</wsa:Action></env:Header></env:Envelope>",
        "y".repeat(2_000)
    );
    assert_eq!(send("POST", &url, &ct, late.as_bytes()).await.member(), "other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_own_http1_path_decides_whole_bodies_and_hands_the_rest_to_hyper() {
    let m = "{ body_json = { \"$.order.region\" = \"eu\" } }";
    let (r, _m) = setup(m, "").await;
    let handoffs = |r: &TestRouter| -> Vec<u64> {
        r.live.metrics.listener("web").handoffs.counts().into_iter().map(|(_, n)| n).collect()
    };
    // A body that arrives with its head (one write, Content-Length): decided on the own path.
    let mut conn = support::raw_connect(r.addr("web")).await;
    let head = format!(
        "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        ORDER_EU.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(ORDER_EU);
    let resp = support::raw_request(&mut conn, &request).await;
    assert_eq!((resp.status, resp.header("x-member")), (200, Some("special")));
    assert_eq!(resp.body, ORDER_EU);
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!((resp.status, resp.header("x-member")), (200, Some("other")));
    assert_eq!(handoffs(&r), vec![0; 6], "nothing was handed to hyper");
    // A chunked body (not whole with its head): the connection goes to hyper's path, which
    // reads the body's first bytes before it routes.
    let mut conn = support::raw_connect(r.addr("web")).await;
    let mut chunked =
        b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    chunked.extend_from_slice(format!("{:x}\r\n", ORDER_EU.len()).as_bytes());
    chunked.extend_from_slice(ORDER_EU);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let resp = support::raw_request(&mut conn, &chunked).await;
    assert_eq!((resp.status, resp.header("x-member")), (200, Some("special")));
    assert_eq!(resp.body, ORDER_EU);
    // The connection carries on (on hyper's path now).
    let resp = support::raw_request(&mut conn, "GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert_eq!((resp.status, resp.header("x-member")), (200, Some("other")));
    assert_eq!(handoffs(&r), vec![0, 0, 0, 0, 0, 1], "counted as `route`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_filters_and_multicast_over_http2() {
    let m = "{ body_json = { \"$.order.region\" = \"eu\" } }";
    let audit = super::recorder::Recorder::spawn("audit");
    let extra = "multicast = [ { cluster = \"audit\" } ]";
    let special = support::spawn_member("special", 0).await;
    let other = support::spawn_member("other", 0).await;
    let config = listener_table("web", "")
        + &route_table("special", "web", "special", &format!("match = {m}\n{extra}"))
        + &route_table("default", "web", "other", "")
        + &cluster_table("special", &support::member_list(std::slice::from_ref(&special)))
        + &cluster_table("other", &support::member_list(std::slice::from_ref(&other)))
        + &cluster_table("audit", &format!("members = [{}]", audit.entry()));
    let r = support::router(&config).await;
    let client = support::client_of::<Full<Bytes>>(true);
    for (body, want) in [(ORDER_EU, "special"), (&b"{\"order\": 1}"[..], "other")] {
        let req = Request::post(r.url("web", "/echo"))
            .header("x-request-id", want)
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap();
        let resp = client.request(req).await.expect("h2 request");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.headers().get("x-member").unwrap(), want);
        assert_eq!(&resp.into_body().collect().await.unwrap().to_bytes()[..], body);
    }
    assert_eq!(audit.wait_for(1).await, ["special"]);
    assert_eq!(audit.seen()[0].body, ORDER_EU);
}
