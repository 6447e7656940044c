//! Redirect lookups and the `redirect_to_member` filter (SGD's load-balancing page), with
//! `curl -i` and `curl -L` against a real `rondo serve` and two `rondo member`s: each answer is
//! a 307 to the next member round-robin picks, with the caller's path and query.

use super::support::{curl, header, serve};
use crate::common::{TempDir, start_member};

#[test]
fn lookups_and_the_route_filter_redirect_to_the_picked_member() {
    let dir = TempDir::new("naming-redirect");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let s = serve(
        &dir,
        &format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\
             filters = [{{ redirect_to_member = {{}} }}]\n\n\
             [cluster.c]\nmembers = [{{ name = \"m1\", address = \"{a1}\" }}, \
             {{ name = \"m2\", address = \"{a2}\" }}]\n\n\
             [naming]\nlisten = \"127.0.0.1:0\"\n"
        ),
    );
    let naming = s.naming;
    let web = s.listener.expect("listener");

    // The naming service: a 307 per lookup, round-robin, the path after the name and the
    // query (less the lookup's own parameters) kept.
    let mut seen = Vec::new();
    for _ in 0..4 {
        let url = format!("http://{naming}/v1/lookup/c/app/page?redirect=1&x=1&key=k");
        let (status, head, _) = curl(&url, &[]);
        assert_eq!(status, 307, "{head}");
        let member = header(&head, "rondo-member").expect("rondo-member").to_owned();
        let addr = if member == "m1" { a1 } else { a2 };
        assert_eq!(header(&head, "location"), Some(format!("http://{addr}/app/page?x=1").as_str()));
        assert!(header(&head, "rondo-view-id").is_some(), "{head}");
        seen.push(member);
    }
    assert_eq!(seen, ["m1", "m2", "m1", "m2"]);
    // Without a path: the member's root.
    let (status, head, _) = curl(&format!("http://{naming}/v1/lookup/c?redirect=1"), &[]);
    assert_eq!(status, 307);
    assert!(
        header(&head, "location").is_some_and(|l| l.ends_with(&format!(":{}/", a1.port()))
            || l.ends_with(&format!(":{}/", a2.port()))),
        "{head}"
    );
    // `curl -L` reaches the member, which answers with its name.
    let (status, _, body) = curl(&format!("http://{naming}/v1/lookup/c?redirect=1"), &["-L"]);
    assert_eq!(status, 307, "the first status line is the redirect's");
    assert!(body.contains("m1") || body.contains("m2"), "{body}");
    // Mistakes: clear 400s.
    let (status, _, body) = curl(&format!("http://{naming}/v1/lookup/c?redirect=yes"), &[]);
    assert_eq!(status, 400);
    assert!(body.contains("`yes` is not 1, true, 0 or false"), "{body}");
    let (status, _, body) = curl(&format!("http://{naming}/v1/lookup/c/app"), &[]);
    assert_eq!(status, 400);
    assert!(body.contains("add `redirect=1`"), "{body}");
    let (status, _, _) = curl(&format!("http://{naming}/v1/lookup/nope?redirect=1"), &[]);
    assert_eq!(status, 404);

    // The route filter: the router answers 307 to the picked member instead of proxying, on
    // HTTP/1.1 and HTTP/2 alike.
    let mut seen = Vec::new();
    for http2 in [false, false, true, true] {
        let extra: &[&str] = if http2 { &["--http2-prior-knowledge"] } else { &[] };
        let (status, head, body) = curl(&format!("http://{web}/shop/cart?item=7"), extra);
        assert_eq!(status, 307, "{head}");
        assert!(body.is_empty(), "not proxied: {body}");
        let location = header(&head, "location").expect("location").to_owned();
        assert!(
            location == format!("http://{a1}/shop/cart?item=7")
                || location == format!("http://{a2}/shop/cart?item=7"),
            "{location}"
        );
        seen.push(location);
    }
    assert_ne!(seen[0], seen[1], "round robin: {seen:?}");
    assert_ne!(seen[2], seen[3], "round robin: {seen:?}");
    let (_, _, body) = curl(&format!("http://{web}/"), &["-L"]);
    assert!(body.contains("m1") || body.contains("m2"), "{body}");
}
