//! What a real `rondo serve` reports about requests (issue 38, items 6 and 7): the
//! client-facing duration histogram with every try and backoff in it, on both codecs; the
//! series of 10,000 members that came and went back where they started after
//! `[metrics] departed_grace`; access log templates and `fields` with each value checked, over
//! HTTP/1.1, h2c and TLS, a retried request showing each try's time; and a template naming an
//! unknown field refused by `rondo check` with the nearest name.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{BIN, Proc, TempDir, free_port, request, request_with, start_member};

const TOKEN: &str = "observe-token";

/// `rondo serve --config PATH` once its admin API is up.
fn serve(config: &Path) -> Proc {
    let mut p =
        Proc::start(&["serve", "--config", config.to_str().expect("utf-8"), "--workers", "1"]);
    p.line_with("admin API on", Duration::from_secs(15));
    p
}

/// `rondo member` answering every request after `delay_ms`.
fn slow_member(name: &str, delay_ms: u64) -> (Proc, SocketAddr) {
    let delay = delay_ms.to_string();
    let args = ["member", "--name", name, "--listen", "127.0.0.1:0", "--delay-ms", &delay];
    let mut p = Proc::start(&args);
    let line = p.line_with(&format!("rondo member {name} on "), Duration::from_secs(10));
    let addr = line.rsplit(' ').next().and_then(|a| a.parse().ok()).expect("member address");
    (p, addr)
}

fn addr(port: u16) -> SocketAddr {
    format!("127.0.0.1:{port}").parse().expect("addr")
}

/// The metrics text.
fn scrape(admin: SocketAddr) -> String {
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");
    let (status, text) = request_with(admin, "GET", "/metrics", &auth, b"");
    assert_eq!(status, 200, "{text}");
    text
}

/// The value of the sample whose line starts with `series` followed by a space (0 if none).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

/// The series of the text: its lines that are not comments.
fn series_count(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count()
}

/// `curl ARGS` with a 10 s limit: its stdout (it must succeed).
fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl (apt-get install curl)");
    assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_downstream_duration_covers_every_try_and_the_backoff_on_both_codecs() {
    let dir = TempDir::new("observe");
    let (_slow, slow) = slow_member("slow", 3000);
    let (_good, good) = start_member("good", "127.0.0.1:0");
    let (admin, web, h2) = (free_port(), free_port(), free_port());
    let path = dir.0.join("rondo.toml");
    let text = format!(
        r#"
[admin]
listen = "127.0.0.1:{admin}"
token = "{TOKEN}"

[[listener]]
name = "web"
listen = "127.0.0.1:{web}"

[[listener]]
name = "h2"
listen = "127.0.0.1:{h2}"

[[route]]
name = "main"
listener = "web"
match = {{ path_prefix = "/x" }}
cluster = "c"

[[route]]
name = "main2"
listener = "h2"
cluster = "c"

[cluster.c]
algorithm = "round-robin"
outlier = {{ consecutive_failures = 1000 }}
retry = {{ attempts = 2, per_try_timeout_ms = 250, backoff = {{ base_ms = 100 }} }}
members = [{{ name = "slow", address = "{slow}" }}, {{ name = "good", address = "{good}" }}]
"#
    );
    std::fs::write(&path, text).expect("write config");
    let _router = serve(&path);
    let n = 4;
    for _ in 0..n {
        let (status, body) = request(addr(web), "GET", "/x", b"");
        assert_eq!((status, body.as_str()), (200, "good\n"));
        let url = format!("http://127.0.0.1:{h2}/x");
        assert_eq!(curl(&["--http2-prior-knowledge", &url]), "good\n");
    }
    // The router's own answer counts too, under no route.
    let (status, _) = request(addr(web), "GET", "/nowhere", b"");
    assert_eq!(status, 404);
    let text = scrape(addr(admin));
    for (listener, route) in [("web", "main"), ("h2", "main2")] {
        let labels = format!("listener=\"{listener}\",route=\"{route}\",status_class=\"2xx\"");
        let name = "rondo_downstream_request_duration_seconds";
        let count = sample(&text, &format!("{name}_count{{{labels}}}"));
        let fast = sample(&text, &format!("{name}_bucket{{{labels},le=\"0.128\"}}"));
        let retried =
            sample(&text, &format!("rondo_retries_total{{route=\"{route}\",cluster=\"c\"}}"));
        assert_eq!(count, n as f64, "{listener}: every request counted\n{text}");
        assert!(retried >= 1.0, "{listener}: round robin sent a try to the slow member\n{text}");
        // Each retried request waited for the slow member's 250 ms timeout (and a backoff):
        // above the 0.128 s bucket; every other one below it.
        assert_eq!(count - fast, retried, "{listener}\n{text}");
        // The member's own histogram times one try: the good member always answered fast.
        let member = format!("route=\"{route}\",cluster=\"c\",member=\"good\"");
        let tries = sample(&text, &format!("rondo_request_duration_seconds_count{{{member}}}"));
        let quick = sample(
            &text,
            &format!("rondo_request_duration_seconds_bucket{{{member},le=\"0.128\"}}"),
        );
        assert_eq!((tries, quick), (count, count), "{listener}\n{text}");
    }
    let no_route = "rondo_downstream_request_duration_seconds_count{listener=\"web\",route=\"\",status_class=\"4xx\"}";
    assert_eq!(sample(&text, no_route), 1.0, "{text}");
}

/// Sends each of `requests` (whole requests) on one keep-alive connection; each must be
/// answered with `status`.
fn keep_alive(addr: SocketAddr, requests: impl Iterator<Item = String>, status: u16) {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let mut w = s.try_clone().expect("clone");
    let mut r = BufReader::new(s);
    let expected = format!("HTTP/1.1 {status} ");
    for req in requests {
        w.write_all(req.as_bytes()).expect("send");
        let mut line = String::new();
        r.read_line(&mut line).expect("status line");
        assert!(line.starts_with(&expected), "{req}: {line}");
        let mut length = 0;
        loop {
            line.clear();
            r.read_line(&mut line).expect("header");
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().expect("length");
            }
        }
        let mut body = vec![0; length];
        r.read_exact(&mut body).expect("body");
    }
}

/// `n` GETs.
fn gets(n: usize) -> impl Iterator<Item = String> {
    (0..n).map(|_| "GET / HTTP/1.1\r\nHost: t\r\n\r\n".to_owned())
}

/// Runs `f(i)` for `i` in `0..n` on 4 threads, each with its share of `i`s.
fn on_four_threads(n: usize, f: impl Fn(std::ops::Range<usize>) + Send + Sync + Copy + 'static) {
    let threads: Vec<_> =
        (0..4).map(|t| std::thread::spawn(move || f(t * n / 4..(t + 1) * n / 4))).collect();
    for t in threads {
        t.join().expect("a thread of requests");
    }
}

#[test]
fn ten_thousand_members_registered_and_removed_leave_the_series_where_they_started() {
    let dir = TempDir::new("observe");
    let (_m, member) = start_member("m", "127.0.0.1:0");
    let (admin, web, naming) = (free_port(), free_port(), free_port());
    let path = dir.0.join("rondo.toml");
    let config = format!(
        r#"
[metrics]
departed_grace = "1s"

[admin]
listen = "127.0.0.1:{admin}"
token = "{TOKEN}"

[naming]
listen = "127.0.0.1:{naming}"

[[listener]]
name = "web"
listen = "127.0.0.1:{web}"

[[route]]
name = "main"
listener = "web"
cluster = "c"

[cluster.c]
algorithm = "round-robin"
max_requests_per_connection = 1
members = [{{ name = "m", address = "{member}" }}]
"#
    );
    std::fs::write(&path, config).expect("write config");
    let _router = serve(&path);
    keep_alive(addr(web), gets(1), 200);
    let start = series_count(&scrape(addr(admin)));
    let n = 10_000;
    // 10,000 members registered (one process behind them all)...
    let began = Instant::now();
    on_four_threads(n, move |range| {
        let body = format!("{{\"address\": \"{member}\", \"ttl_ms\": 600000}}");
        let put = move |i: usize| {
            format!(
                "PUT /v1/services/c/members/r{i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\
                 Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        };
        keep_alive(addr(naming), range.map(put), 200);
    });
    eprintln!("10,000 registrations in {:?}", began.elapsed());
    // ...each serving (round robin, twice over: every member at least once)...
    on_four_threads(2 * n, move |range| keep_alive(addr(web), gets(range.len()), 200));
    let full = scrape(addr(admin));
    let served = full
        .lines()
        .filter(|l| l.starts_with("rondo_requests_total{") && l.contains("member=\"r"))
        .count();
    assert_eq!(served, n, "every member answered");
    assert!(series_count(&full) > start + n * 20);
    // ...and deregistered: their counts stay for the grace, then go.
    on_four_threads(n, move |range| {
        let delete = |i: usize| {
            format!("DELETE /v1/services/c/members/r{i} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        };
        keep_alive(addr(naming), range.map(delete), 204);
    });
    let waited = Instant::now();
    loop {
        let text = scrape(addr(admin));
        let left = series_count(&text);
        if left == start {
            // The configured member kept its counts.
            let kept =
                "rondo_requests_total{route=\"main\",cluster=\"c\",member=\"m\",class=\"2xx\"}";
            assert!(sample(&text, kept) >= 2.0, "{text}");
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "{left} series 30 s after the members left, {start} before they came"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The lines of `path` once it has `n` (15 s at most).
fn lines_of(path: &Path, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.len() >= n {
            return lines;
        }
        assert!(Instant::now() < deadline, "{n} lines expected in {}:\n{text}", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

const TEMPLATE: &str = "{client_ip}|{host}|{method}|{path}|{query}|{protocol}|{status}|{bytes_in}|{bytes_out}|{user_agent}|{referer}|{request_id}|{traceparent}|{route}|{member}|{member_address}|{tries}|{try_ms}|{first_byte_ms}|{duration_ms}|{tls_version}|{sni}|{connect_ms}";

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

#[test]
fn access_log_templates_and_fields_write_each_value_over_http1_h2c_and_tls() {
    let dir = TempDir::new("observe");
    let (_slow, slow) = slow_member("slow", 3000);
    let (_good, good) = start_member("good", "127.0.0.1:0");
    let (admin, web, tls) = (free_port(), free_port(), free_port());
    let key = rcgen::generate_simple_self_signed(vec!["log.test".to_owned()]).expect("cert");
    std::fs::write(dir.0.join("tls.pem"), key.cert.pem()).expect("cert");
    std::fs::write(dir.0.join("tls.key"), key.signing_key.serialize_pem()).expect("key");
    let path = dir.0.join("rondo.toml");
    let text = format!(
        r#"
[admin]
listen = "127.0.0.1:{admin}"
token = "{TOKEN}"

[[listener]]
name = "web"
listen = "127.0.0.1:{web}"
access_log = {{ path = "web.log", format = "{TEMPLATE}" }}

[[listener]]
name = "tls"
listen = "127.0.0.1:{tls}"
tls = {{ certs = [ {{ cert = "tls.pem", key = "tls.key" }} ] }}
access_log = {{ path = "tls.log", format = "json", fields = ["time", "client", "host", "protocol", "status", "tls_version", "sni", "tries", "try_ms", "first_byte_ms", "request_id", "user_agent"] }}

[[route]]
name = "main"
listener = "web"
cluster = "c"

[[route]]
name = "secure"
listener = "tls"
cluster = "good"

[cluster.c]
algorithm = "round-robin"
outlier = {{ consecutive_failures = 1000 }}
retry = {{ attempts = 2, per_try_timeout_ms = 250 }}
members = [{{ name = "slow", address = "{slow}" }}, {{ name = "good", address = "{good}" }}]

[cluster.good]
members = [{{ name = "good", address = "{good}" }}]
"#
    );
    std::fs::write(&path, text).expect("write config");
    let _router = serve(&path);
    let resolve = format!("app.test:{web}:127.0.0.1");
    for (i, version) in
        ["--http1.1", "--http2-prior-knowledge", "--http1.1", "--http2-prior-knowledge"]
            .iter()
            .enumerate()
    {
        let url = format!("http://app.test:{web}/x?n={i}");
        let rid = format!("X-Request-Id: rid-{i}");
        let tp = format!("traceparent: {TRACEPARENT}");
        let args = [
            *version,
            "--resolve",
            &resolve,
            "-A",
            "agent/1",
            "-e",
            "https://ref.test/",
            "-H",
            &rid,
            "-H",
            &tp,
            &url,
        ];
        assert_eq!(curl(&args), "good\n");
    }
    let lines = lines_of(&dir.0.join("web.log"), 4);
    let mut retried = 0;
    for line in &lines {
        let v: Vec<&str> = line.split('|').collect();
        assert_eq!(v.len(), 23, "{line}");
        let i = v[4].strip_prefix("n=").expect("the query").parse::<usize>().expect("n");
        assert_eq!(v[0], "127.0.0.1", "{line}");
        assert_eq!(v[1], format!("app.test:{web}"), "{line}");
        assert_eq!((v[2], v[3]), ("GET", "/x"), "{line}");
        assert_eq!(v[5], if i % 2 == 0 { "HTTP/1.1" } else { "HTTP/2" }, "{line}");
        assert_eq!((v[6], v[7], v[8]), ("200", "0", "5"), "{line}");
        assert_eq!((v[9], v[10]), ("agent/1", "https://ref.test/"), "{line}");
        assert_eq!((v[11], v[12]), (format!("rid-{i}").as_str(), TRACEPARENT), "{line}");
        assert_eq!((v[13], v[14], v[15]), ("main", "good", good.to_string().as_str()), "{line}");
        let tries: usize = v[16].parse().expect("tries");
        let each: Vec<f64> = v[17].split(',').map(|t| t.parse().expect("ms")).collect();
        assert_eq!(each.len(), tries, "one time per try: {line}");
        if tries == 2 {
            retried += 1;
            assert!((250.0..2000.0).contains(&each[0]), "the slow try timed out: {line}");
            assert!(each[1] < 250.0, "{line}");
        }
        let (first, total): (f64, f64) = (v[18].parse().expect("ms"), v[19].parse().expect("ms"));
        assert!(first >= each.iter().sum::<f64>() && first <= total, "{line}");
        assert_eq!((v[20], v[21]), ("-", "-"), "no TLS: {line}");
        // Both paths time the connections they open: the first request of each (0 on the own
        // HTTP/1 path, 1 on hyper's for h2c; their pools are their own) opened one to the good
        // member; the third and fourth found theirs in the pool.
        match (i, v[22]) {
            (0 | 1, ms) => assert!(ms.parse::<f64>().is_ok_and(|ms| ms < first), "{line}"),
            (_, ms) => assert_eq!(ms, "-", "{line}"),
        }
    }
    assert!(retried >= 1, "round robin sent a request to the slow member first: {lines:?}");

    tls_lines_name_the_version_and_the_server_name(&dir.0, tls);
}

/// The TLS listener's JSON lines: only the `fields` asked for, with the TLS version and the
/// server name, over HTTP/1.1 and HTTP/2 by ALPN.
fn tls_lines_name_the_version_and_the_server_name(dir: &Path, tls: u16) {
    // TLS: the version and the server name, over HTTP/1.1 and HTTP/2 by ALPN.
    let resolve = format!("log.test:{tls}:127.0.0.1");
    let url = format!("https://log.test:{tls}/");
    for version in ["--http1.1", "--http2"] {
        let args = ["-k", version, "--resolve", &resolve, "-A", "agent/2", &url];
        assert_eq!(curl(&args), "good\n");
    }
    let lines = lines_of(&dir.join("tls.log"), 2);
    let mut protocols = Vec::new();
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).expect(line);
        let keys: Vec<&str> = v.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 12, "only the fields asked for: {line}");
        assert_eq!(v["host"], format!("log.test:{tls}"), "{line}");
        assert_eq!(
            (&v["tls_version"], &v["sni"]),
            (&"TLSv1.3".into(), &"log.test".into()),
            "{line}"
        );
        assert_eq!((&v["status"], &v["tries"]), (&200.into(), &1.into()), "{line}");
        assert_eq!(v["try_ms"].as_array().map(Vec::len), Some(1), "{line}");
        assert!(v["first_byte_ms"].as_f64().is_some(), "{line}");
        assert_eq!(
            (&v["request_id"], &v["user_agent"]),
            (&serde_json::Value::Null, &"agent/2".into())
        );
        assert!(v["client"].as_str().is_some_and(|c| c.starts_with("127.0.0.1:")), "{line}");
        protocols.push(v["protocol"].as_str().expect("protocol").to_owned());
    }
    protocols.sort();
    assert_eq!(protocols, ["HTTP/1.1", "HTTP/2"]);
}

#[test]
fn an_unknown_field_in_a_template_is_refused_with_the_nearest_name() {
    let dir = TempDir::new("observe");
    let path = dir.0.join("rondo.toml");
    let text = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:1\"\n\
                access_log = { path = \"-\", format = \"{hots} {status}\" }\n\n\
                [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
                [cluster.c]\nmembers = [{ name = \"m\", address = \"127.0.0.1:2\" }]\n\n\
                [metrics]\ndeparted_grace = \"2d\"\n";
    std::fs::write(&path, text).expect("write config");
    let out = Command::new(BIN)
        .args(["check", "--config", path.to_str().expect("utf-8")])
        .output()
        .expect("run rondo check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("rondo.toml:4:"), "{err}");
    assert!(err.contains("listener[0].access_log.format"), "{err}");
    assert!(err.contains("unknown access log field `hots`, did you mean `host`?"), "{err}");
    assert!(err.contains("metrics.departed_grace_ms"), "{err}");
    assert!(err.contains("departed_grace must be 0 to 24h"), "{err}");
}
