//! Identity across a tier: three `rondo serve` sharing one real etcd (started by the test on
//! free loopback ports) and one tier key. A sticky session cookie one router issued keeps its
//! member on the other two; a cookie not signed under the tier key is not honoured; the same
//! refused tokens are refused by every router.

#![cfg(feature = "etcd")]

mod common;
#[path = "../../rondo-naming/tests/support/mod.rs"]
mod etcd_support;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{Proc, TempDir, start_member};
use etcd_support::Etcd;

/// Status, headers (lower-case names) and body of one GET on a fresh connection.
fn get(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the router");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok());
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status.unwrap_or(0), headers, body.to_owned())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

/// `rondo-member=VALUE` of a `Set-Cookie`.
fn cookie_value(set_cookie: &str) -> String {
    let first = set_cookie.split(';').next().unwrap();
    first.strip_prefix("rondo-member=").expect("the session cookie").to_owned()
}

fn config(etcd: &str, keys: &Path, members: &[SocketAddr]) -> String {
    let list: Vec<String> = members
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{{ name = \"m{}\", address = \"{a}\" }}", i + 1))
        .collect();
    format!(
        "[router]\ntier_key = \"the tier's shared key, 32 bytes.\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"admin-secret\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"secure\"\nlistener = \"web\"\ncluster = \"s\"\n\
         match = {{ path_prefix = \"/secure\" }}\n\
         auth = {{ issuer = \"iss\", audience = \"aud\", keys = \"{}\" }}\n\n\
         [[route]]\nname = \"login\"\nlistener = \"web\"\ncluster = \"s\"\n\
         match = {{ path_prefix = \"/login/\" }}\nlogin = {{}}\n\n\
         [[route]]\nname = \"main\"\nlistener = \"web\"\ncluster = \"s\"\n\n\
         [cluster.s]\nalgorithm = \"round-robin\"\ngranularity = \"session\"\n\
         members = [{}]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nregistry = \"etcd\"\n\
         etcd_endpoints = [\"{etcd}\"]\netcd_prefix = \"/identity\"\n",
        keys.display(),
        list.join(", ")
    )
}

#[test]
fn a_session_keeps_its_member_on_every_router_of_the_tier() {
    let etcd = Etcd::start();
    let dir = TempDir::new("identity-tier");
    let keys = dir.0.join("keys");
    let out = std::process::Command::new(common::BIN)
        .args(["auth", "dev-key", keys.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let members: Vec<(Proc, SocketAddr)> =
        (1..=3).map(|i| start_member(&format!("m{i}"), "127.0.0.1:0")).collect();
    let addrs: Vec<SocketAddr> = members.iter().map(|(_, a)| *a).collect();
    let text = config(&etcd.endpoint(), &keys.join("jwks.json"), &addrs);
    let mut routers = Vec::new();
    for i in 0..3 {
        let file = dir.0.join(format!("rondo-{i}.toml"));
        std::fs::write(&file, &text).unwrap();
        let mut p = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
        let web = p.addr_after("rondo: listener web on");
        let admin = p.addr_after("rondo: admin API on");
        let naming = p.addr_after("rondo: naming API (registry etcd) on");
        routers.push((p, web, admin, naming));
    }
    let webs: Vec<SocketAddr> = routers.iter().map(|r| r.1).collect();
    let admins: Vec<SocketAddr> = routers.iter().map(|r| r.2).collect();
    let namings: Vec<SocketAddr> = routers.iter().map(|r| r.3).collect();

    // Router 1 places the session and signs its cookie.
    let (status, headers, body) = get(webs[0], "/", &[]);
    assert_eq!(status, 200);
    let member = body.trim().to_owned();
    let set = header(&headers, "set-cookie").expect("a session cookie");
    assert!(set.contains("Max-Age="), "{set}");
    let value = cookie_value(set);
    assert_eq!(value.split('.').count(), 3, "a signed cookie: {value}");
    let cookie = format!("rondo-member={value}");

    // Routers 2 and 3 (round robin over three members) keep it on its member, every time.
    for (i, web) in webs.iter().enumerate() {
        for _ in 0..6 {
            let (status, headers, body) = get(*web, "/", &[("Cookie", &cookie)]);
            assert_eq!(status, 200);
            assert_eq!(body.trim(), member, "router {} moved the session", i + 1);
            assert!(header(&headers, "set-cookie").is_none(), "a kept session needs no new cookie");
        }
    }

    // A cookie not signed under the tier key (the plain member hash, or the signed one with
    // its expiry moved) is not honoured: the router places the session anew and signs that.
    let plain = value.split('.').next().unwrap().to_owned();
    let parts: Vec<&str> = value.split('.').collect();
    let later: u64 = parts[1].parse::<u64>().unwrap() + 100_000;
    let moved = format!("{}.{later}.{}", parts[0], parts[2]);
    for bad in [plain, moved] {
        let (status, headers, _) = get(webs[1], "/", &[("Cookie", &format!("rondo-member={bad}"))]);
        assert_eq!(status, 200);
        let set = header(&headers, "set-cookie").unwrap_or_else(|| panic!("{bad} was honoured"));
        assert_ne!(cookie_value(set), bad);
        assert_eq!(cookie_value(set).split('.').count(), 3);
    }

    // The same token is refused by every router: the same JWKS, the same answer.
    for web in &webs {
        let (status, headers, _) = get(*web, "/secure", &[("Authorization", "Bearer a.b.c")]);
        assert_eq!(status, 401);
        assert!(header(&headers, "www-authenticate").is_some_and(|w| w.contains("invalid_token")));
    }

    // Sign-on at router 1 holds at routers 2 and 3 (the same tier key).
    let (status, headers, _) = get(webs[0], "/login/alice", &[]);
    assert_eq!(status, 200);
    let set = header(&headers, "set-cookie").expect("a session cookie").to_owned();
    let session = set.split(';').next().unwrap().to_owned();
    for web in &webs {
        let (status, _, _) = get(*web, "/secure/x", &[("Cookie", &session)]);
        assert_eq!(status, 200, "the session was refused by {web}");
    }

    // Revoked through router 1's admin API: refused by all three within a second.
    let body = r#"{"subject": "alice"}"#;
    let (status, _, text) = post(admins[0], "/api/v1/revocations", body);
    assert_eq!(status, 201, "{text}");
    let start = Instant::now();
    let mut pending: Vec<SocketAddr> = webs.clone();
    while !pending.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "after a second the revoked session still passes at {pending:?}"
        );
        pending.retain(|web| get(*web, "/secure/x", &[("Cookie", &session)]).0 != 401);
        std::thread::sleep(Duration::from_millis(20));
    }
    // And stays refused (a router that saw it once does not forget it).
    for web in &webs {
        assert_eq!(get(*web, "/secure/x", &[("Cookie", &session)]).0, 401);
    }

    // The tier's key from its shared configuration in etcd: put through router 1's naming API,
    // it replaces every router's file key. Bob's session, signed under the file's key, is then
    // refused everywhere, and a session signed by router 2 under the shared key holds at 1 and 3.
    let login = |web: SocketAddr, who: &str| {
        let (status, headers, _) = get(web, &format!("/login/{who}"), &[]);
        assert_eq!(status, 200);
        let set = header(&headers, "set-cookie").expect("a session cookie").to_owned();
        set.split(';').next().unwrap().to_owned()
    };
    let bob = login(webs[0], "bob");
    assert_eq!(get(webs[2], "/secure/x", &[("Cookie", &bob)]).0, 200);
    let file_config = config(&etcd.endpoint(), &keys.join("jwks.json"), &addrs);
    let shared =
        file_config.replace("the tier's shared key, 32 bytes.", "the key the tier keeps in etcd");
    assert_ne!(shared, file_config);
    let (status, _, answer) = put(namings[0], "/v1/config", &shared);
    assert_eq!(status, 200, "{answer}");
    let start = Instant::now();
    let mut pending = webs.clone();
    while !pending.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the shared key is not in force at {pending:?}"
        );
        pending.retain(|web| {
            let (status, headers, _) = get(*web, "/secure/x", &[("Cookie", &bob)]);
            !(status == 401
                && header(&headers, "www-authenticate")
                    .is_some_and(|w| w.contains("bad_signature")))
        });
        std::thread::sleep(Duration::from_millis(20));
    }
    let carol = login(webs[1], "carol");
    for web in [webs[0], webs[2]] {
        let (status, _, body) = get(web, "/secure/x", &[("Cookie", &carol)]);
        assert_eq!(status, 200, "the shared key's session was refused by {web}: {body}");
    }

    // With etcd gone, a revocation holds on the router that made it, and its admin API says
    // the tier does not have it (503), instead of a 201 the other routers would belie.
    let mut etcd = etcd;
    etcd.kill();
    let (status, _, text) = post(admins[1], "/api/v1/revocations", r#"{"subject": "carol"}"#);
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("revoked on this router only"), "{text}");
    assert_eq!(get(webs[1], "/secure/x", &[("Cookie", &carol)]).0, 401);
    assert_eq!(get(webs[0], "/secure/x", &[("Cookie", &carol)]).0, 200);
    drop(routers);
    drop(members);
}

/// PUT a body to a router's naming API (no token: it listens on loopback).
fn put(addr: SocketAddr, path: &str, body: &str) -> (u16, Vec<(String, String)>, String) {
    send(addr, "PUT", path, body, None)
}

/// POST a JSON body to a router's admin API (token `admin-secret`).
fn post(addr: SocketAddr, path: &str, body: &str) -> (u16, Vec<(String, String)>, String) {
    send(addr, "POST", path, body, Some("admin-secret"))
}

fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, Vec<(String, String)>, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the API");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, Vec::new(), text)
}
