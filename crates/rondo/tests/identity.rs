//! Sign-on at the router (docs/identity.md), end to end: a development key from `rondo auth
//! dev-key`, tokens from `rondo auth token` and from the tests themselves (EdDSA, ES256, RS256,
//! HS256), a real `rondo serve` and a real `rondo member` that shows the headers it got.
//! Forged, expired, not-yet-valid, wrong-key, wrong-audience and `alg = none` tokens get 401
//! with `WWW-Authenticate`, are counted by reason, and never reach the member; identity headers
//! a client sends never reach a member; the JWKS file is reloaded when it changes.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::{BIN, Proc, TempDir, start_member};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "orders";

/// An answer: status, headers (lower-case names), body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// GET `path` with extra header lines, on a fresh connection.
fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    call(addr, "GET", path, headers, "")
}

/// One request with extra header lines and a body, on a fresh connection.
fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the router");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
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
    // A chunked body's framing is left in: the tests look for lines inside it.
    Answer { status: status.unwrap_or(0), headers, body: body.to_owned() }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn claims() -> Value {
    json!({
        "iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": now() + 600,
        "scope": "orders:read orders:write", "email": "alice@example.test"
    })
}

fn sign(alg: Algorithm, kid: &str, claims: &Value, key: &EncodingKey) -> String {
    let mut h = Header::new(alg);
    h.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&h, claims, key).unwrap()
}

/// The dev key `rondo auth dev-key` wrote, as an encoding key.
fn dev_key(dir: &Path) -> EncodingKey {
    let pem = std::fs::read_to_string(dir.join("dev-key.pem")).unwrap();
    let pair = rcgen::KeyPair::from_pem(&pem).unwrap();
    EncodingKey::from_ed_der(&pair.serialize_der())
}

fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().expect("run rondo");
    assert!(out.status.success(), "rondo {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `rondo_auth_refusals_total` of `route` by reason, from the admin API's `/metrics`.
fn refusals(admin: SocketAddr, route: &str) -> Vec<(String, u64)> {
    let text = get(admin, "/metrics", &[("Authorization", "Bearer admin-secret")]).body;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("rondo_auth_refusals_total{")) {
        if !line.contains(&format!("route=\"{route}\"")) {
            continue;
        }
        let reason = line.split("reason=\"").nth(1).and_then(|r| r.split('"').next()).unwrap();
        let n = line.rsplit(' ').next().unwrap().parse().unwrap();
        out.push((reason.to_owned(), n));
    }
    out.sort();
    out
}

/// Member responses of `member` counted by the router (`rondo_requests_total`), summed.
fn served(admin: SocketAddr, member: &str) -> u64 {
    let text = get(admin, "/metrics", &[("Authorization", "Bearer admin-secret")]).body;
    text.lines()
        .filter(|l| l.starts_with("rondo_requests_total{"))
        .filter(|l| l.contains(&format!("member=\"{member}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `openssl` makes the RSA key (ring cannot generate one): PKCS#1 DER and the JWK's `n`.
fn rsa_key(dir: &Path) -> (EncodingKey, String) {
    let pem = dir.join("rsa.pem");
    let der = dir.join("rsa.der");
    let ok = Command::new("openssl")
        .args(["genrsa", "-out", pem.to_str().unwrap(), "2048"])
        .output()
        .expect("openssl")
        .status
        .success();
    assert!(ok, "openssl genrsa");
    let ok = Command::new("openssl")
        .args(["rsa", "-in", pem.to_str().unwrap(), "-traditional", "-outform", "DER"])
        .args(["-out", der.to_str().unwrap()])
        .output()
        .expect("openssl")
        .status
        .success();
    assert!(ok, "openssl rsa");
    let out = Command::new("openssl")
        .args(["rsa", "-in", pem.to_str().unwrap(), "-noout", "-modulus"])
        .output()
        .expect("openssl");
    let text = String::from_utf8(out.stdout).unwrap();
    let hex = text.trim().strip_prefix("Modulus=").expect("modulus");
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    (EncodingKey::from_rsa_der(&std::fs::read(der).unwrap()), URL_SAFE_NO_PAD.encode(bytes))
}

#[test]
fn tokens_are_checked_before_any_member_sees_the_request() {
    let dir = TempDir::new("identity");
    let keys = dir.0.join("keys");
    // The docs' worked example: a development key, then a token minted with it.
    let wrote = run(&["auth", "dev-key", keys.to_str().unwrap()]);
    assert!(wrote.contains("jwks.json"), "{wrote}");
    // Never over an existing key; a claim that is not NAME=VALUE is named.
    let again =
        Command::new(BIN).args(["auth", "dev-key", keys.to_str().unwrap()]).output().unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("never overwritten"));
    let bad = Command::new(BIN)
        .args(["auth", "token", "--key", keys.join("dev-key.pem").to_str().unwrap()])
        .args(["--issuer", "i", "--audience", "a", "--subject", "s", "--claim", "scope"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not NAME=VALUE"));
    let (_member, m1) = start_member("m1", "127.0.0.1:0");

    // A second key file with ES256, RS256 and HS256 keys.
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let raw = ec.public_key_raw();
    let (rsa, n) = rsa_key(&dir.0);
    let secret = b"a tier secret of thirty-two byte";
    let multi = json!({"keys": [
        {"kty": "EC", "crv": "P-256", "kid": "ec", "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
         "y": URL_SAFE_NO_PAD.encode(&raw[33..65])},
        {"kty": "RSA", "kid": "rsa", "n": n, "e": "AQAB"},
        {"kty": "oct", "kid": "hmac", "k": URL_SAFE_NO_PAD.encode(secret)}
    ]});
    std::fs::write(dir.0.join("multi.json"), multi.to_string()).unwrap();

    let config = format!(
        "[router]\ntier_key = \"the tier key of the identity test\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"admin-secret\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"plain\"\nlistener = \"web\"\ncluster = \"c\"\n\
         match = {{ headers = {{ x-open = \"1\" }} }}\n\n\
         [[route]]\nname = \"multi\"\nlistener = \"web\"\ncluster = \"c\"\n\
         match = {{ headers = {{ x-keys = \"multi\" }} }}\n\
         auth = {{ issuer = \"{ISSUER}\", audience = \"{AUDIENCE}\", keys = \"multi.json\" }}\n\n\
         [[route]]\nname = \"orders\"\nlistener = \"web\"\ncluster = \"c\"\n\
         match = {{ path_prefix = \"/headers\" }}\n\
         auth = {{ issuer = \"{ISSUER}\", audience = \"{AUDIENCE}\", keys = \"keys/jwks.json\", \
         require = {{ scope = \"orders:read\" }}, claims = [\"email\"] }}\n\n\
         [[route]]\nname = \"login\"\nlistener = \"web\"\ncluster = \"c\"\n\
         match = {{ path_prefix = \"/login/\" }}\nlogin = {{ ttl_ms = 600000 }}\n\n\
         [[route]]\nname = \"open\"\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nmembers = [{{ name = \"m1\", address = \"{m1}\" }}]\n"
    );
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, config).unwrap();
    let mut router = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
    let web = router.addr_after("rondo: listener web on");
    let admin = router.addr_after("rondo: admin API on");

    let good = run(&[
        "auth",
        "token",
        "--key",
        keys.join("dev-key.pem").to_str().unwrap(),
        "--issuer",
        ISSUER,
        "--audience",
        AUDIENCE,
        "--subject",
        "alice",
        "--claim",
        "scope=orders:read",
        "--claim",
        "email=alice@example.test",
    ]);
    let good = good.trim();

    // A good token: the member gets the subject and the chosen claim, and none of the client's
    // own copies of those headers.
    let a = get(
        web,
        "/headers",
        &[
            ("Authorization", &bearer(good)),
            ("X-Rondo-Subject", "root"),
            ("X-Rondo-Claim-Email", "root@evil.test"),
            ("X-Rondo-Claim-Role", "admin"),
        ],
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("x-rondo-subject: alice"), "{}", a.body);
    assert!(a.body.contains("x-rondo-claim-email: alice@example.test"), "{}", a.body);
    assert!(!a.body.contains("root"), "a client's identity header reached the member: {}", a.body);
    assert!(!a.body.contains("x-rondo-claim-role"), "{}", a.body);

    // On a route without auth too, the client's copies never reach the member.
    let a = get(web, "/headers", &[("X-Rondo-Subject", "root"), ("X-Open", "1")]);
    assert_eq!(a.status, 200);
    assert!(a.body.contains("x-open: 1"), "the member's header list: {}", a.body);
    assert!(!a.body.contains("x-rondo-subject"), "{}", a.body);
    let before = served(admin, "m1");
    assert_eq!(before, 2, "the member's responses are counted");

    // Every refused token: 401, a challenge, and no member saw it.
    let key = dev_key(&keys);
    let with = |k: &str, v: Value| {
        let mut c = claims();
        c[k] = v;
        sign(Algorithm::EdDSA, "dev-1", &c, &key)
    };
    let other = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let wrong_key = sign(
        Algorithm::EdDSA,
        "dev-1",
        &claims(),
        &EncodingKey::from_ed_der(&other.serialize_der()),
    );
    let mut forged: Vec<String> = good.split('.').map(str::to_owned).collect();
    let mut c = claims();
    c["sub"] = json!("mallory");
    forged[1] = URL_SAFE_NO_PAD.encode(c.to_string());
    let forged = forged.join(".");
    let none = format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims().to_string())
    );
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("missing", None, "Bearer realm=\"rondo\""),
        ("expired", Some(with("exp", json!(now() - 3600))), "expired"),
        ("not yet valid", Some(with("nbf", json!(now() + 3600))), "not_yet_valid"),
        ("wrong audience", Some(with("aud", json!("billing"))), "wrong_audience"),
        ("wrong issuer", Some(with("iss", json!("https://evil.test"))), "wrong_issuer"),
        ("no scope", Some(with("scope", json!("orders:write"))), "missing_claim"),
        ("wrong key", Some(wrong_key), "bad_signature"),
        ("forged", Some(forged), "bad_signature"),
        ("alg none", Some(none), "alg_none"),
    ];
    for (what, token, challenge) in &cases {
        let auth = token.as_deref().map(bearer);
        let headers: Vec<(&str, &str)> =
            auth.as_deref().map(|a| ("Authorization", a)).into_iter().collect();
        let a = get(web, "/headers", &headers);
        assert_eq!(a.status, 401, "{what}: {}", a.body);
        let www = a.header("www-authenticate").unwrap_or_else(|| panic!("{what}: no challenge"));
        assert!(www.starts_with("Bearer realm=\"rondo\""), "{what}: {www}");
        assert!(www.contains(challenge), "{what}: {www}");
    }
    assert_eq!(served(admin, "m1"), before, "a refused request reached the member");
    let counted = refusals(admin, "orders");

    let want: Vec<(String, u64)> = [
        ("alg_none", 1),
        ("bad_signature", 2),
        ("expired", 1),
        ("missing", 1),
        ("missing_claim", 1),
        ("not_yet_valid", 1),
        ("wrong_audience", 1),
        ("wrong_issuer", 1),
    ]
    .into_iter()
    .map(|(r, n)| (r.to_owned(), n))
    .collect();
    assert_eq!(counted, want);

    // ES256, RS256 and HS256 keys of another route's file; a token signed for one key's kid
    // with another algorithm (HS256 under the RSA key's id: the algorithm confusion) is refused.
    let ec_key = EncodingKey::from_ec_der(&ec.serialize_der());
    for (alg, kid, key) in [
        (Algorithm::ES256, "ec", &ec_key),
        (Algorithm::RS256, "rsa", &rsa),
        (Algorithm::HS256, "hmac", &EncodingKey::from_secret(secret)),
    ] {
        let t = sign(alg, kid, &claims(), key);
        let a = get(web, "/headers", &[("Authorization", &bearer(&t)), ("X-Keys", "multi")]);
        assert_eq!(a.status, 200, "{alg:?}: {}", a.body);
        assert!(a.body.contains("x-rondo-subject: alice"), "{alg:?}: {}", a.body);
    }
    let confused = sign(Algorithm::HS256, "rsa", &claims(), &EncodingKey::from_secret(&rsa_n(&n)));
    let a = get(web, "/headers", &[("Authorization", &bearer(&confused)), ("X-Keys", "multi")]);
    assert_eq!(a.status, 401, "{}", a.body);

    // The key file is replaced: the new key is accepted and the old one refused, without a
    // reload of the configuration.
    let fresh = dir.0.join("fresh");
    run(&["auth", "dev-key", fresh.to_str().unwrap(), "--kid", "dev-2"]);
    std::fs::copy(fresh.join("jwks.json"), keys.join("jwks.json")).unwrap();
    let mut with_id = claims();
    with_id["jti"] = json!("token-7");
    let new_token = sign(Algorithm::EdDSA, "dev-2", &with_id, &dev_key(&fresh));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let a = get(web, "/headers", &[("Authorization", &bearer(&new_token))]);
        if a.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the new key was not taken up: {}", a.body);
        std::thread::sleep(Duration::from_millis(100));
    }
    let a = get(web, "/headers", &[("Authorization", &bearer(good))]);
    assert_eq!(a.status, 401, "a removed key still verifies: {}", a.body);

    // Sign-on through the login route: the member vouches, the router issues the session.
    let a = get(web, "/login/carol", &[]);
    assert_eq!(a.status, 200);
    assert!(a.header("x-rondo-login").is_none(), "the vouching header reached the client");
    let set = a.header("set-cookie").expect("a session cookie");
    assert!(set.starts_with("rondo-session=") && set.contains("Max-Age=600"), "{set}");
    let session = set.split(';').next().unwrap().to_owned();
    // It stands for its subject on an auth route without `require`...
    let a = get(web, "/headers", &[("Cookie", &session), ("X-Keys", "multi")]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("x-rondo-subject: carol"), "{}", a.body);
    // ...but grants no scope a route requires.
    let a = get(web, "/headers", &[("Cookie", &session)]);
    assert_eq!(a.status, 401);
    assert!(a.header("www-authenticate").unwrap().contains("insufficient_scope"));
    // A member of a route without `login` cannot sign anyone on.
    let a = get(web, "/login/mallory", &[("X-Open", "1")]);
    assert_eq!(a.status, 200);
    assert!(a.header("set-cookie").is_none() && a.header("x-rondo-login").is_none());
    // A session cookie whose subject was changed does not verify.
    let (payload, mac) = session.trim_start_matches("rondo-session=").split_once('.').unwrap();
    let mut claims: Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    claims["sub"] = json!("root");
    let forged = format!("rondo-session={}.{mac}", URL_SAFE_NO_PAD.encode(claims.to_string()));
    let a = get(web, "/headers", &[("Cookie", &forged), ("X-Keys", "multi")]);
    assert_eq!(a.status, 401, "{}", a.body);

    // Revocation through the admin API: by subject (the session) and by token id (a JWT).
    let admin_auth = [("Authorization", "Bearer admin-secret")];
    for body in [r#"{"subject": "carol"}"#, r#"{"token_id": "token-7"}"#] {
        let a = call(admin, "POST", "/api/v1/revocations", &admin_auth, body);
        assert_eq!(a.status, 201, "{}", a.body);
    }
    let a = get(web, "/headers", &[("Cookie", &session), ("X-Keys", "multi")]);
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(a.header("www-authenticate").unwrap().contains("revoked"));
    let a = get(web, "/headers", &[("Authorization", &bearer(&new_token))]);
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(a.header("www-authenticate").unwrap().contains("revoked"));
    let listed = get(admin, "/api/v1/revocations", &admin_auth).body;
    assert!(listed.contains("carol") && listed.contains("token-7"), "{listed}");
    // The same through `rondo ctl`: a token of dave's passes until ctl revokes his subject.
    let mut of_dave = self::claims();
    of_dave["sub"] = json!("dave");
    let dave = sign(Algorithm::EdDSA, "dev-2", &of_dave, &dev_key(&fresh));
    assert_eq!(get(web, "/headers", &[("Authorization", &bearer(&dave))]).status, 200);
    let ctl = |args: &[&str]| {
        let admin = admin.to_string();
        let out = Command::new(BIN)
            .args(["ctl", "--admin", &admin, "--token", "admin-secret"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success(), text + &String::from_utf8_lossy(&out.stderr))
    };
    let (ok, text) = ctl(&["revoke", "--subject", "dave", "--ttl-ms", "60000"]);
    assert!(ok && text.starts_with("revoked subject dave until "), "{text}");
    let a = get(web, "/headers", &[("Authorization", &bearer(&dave))]);
    assert_eq!(a.status, 401, "{}", a.body);
    let (ok, text) = ctl(&["revocations"]);
    assert!(ok, "{text}");
    for line in ["subject carol until", "token id token-7 until", "subject dave until"] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    let (ok, text) = ctl(&["revoke", "--subject", "eve", "--ttl-ms", "10"]);
    assert!(!ok && text.contains("ttl_ms") && text.contains("400"), "{text}");
    let (ok, text) = ctl(&["revoke"]);
    assert!(!ok && text.contains("--token-id"), "{text}");
    let a = call(admin, "POST", "/api/v1/revocations", &admin_auth, r#"{"ttl_ms": 5000}"#);
    assert_eq!(a.status, 400, "{}", a.body);
}

/// The RSA modulus bytes (what an attacker would use as an HMAC secret).
fn rsa_n(n: &str) -> Vec<u8> {
    URL_SAFE_NO_PAD.decode(n).unwrap()
}

#[test]
fn a_route_whose_key_file_is_missing_does_not_start() {
    let dir = TempDir::new("identity-nokeys");
    let config = "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\
         auth = { issuer = \"i\", audience = \"a\", keys = \"missing.json\" }\n\n\
         [cluster.c]\nmembers = [{ name = \"m1\", address = \"127.0.0.1:9\" }]\n";
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, config).unwrap();
    let out =
        Command::new(BIN).args(["serve", "--config", file.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot read auth keys") && err.contains("missing.json"), "{err}");
}

/// `curl --http2-prior-knowledge` (h2c, so hyper's path) GET of `path` with header lines:
/// status, the response's header lines (lower-case names) and body.
fn curl_h2(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--http2-prior-knowledge", "--max-time", "10", "-D", "-"]);
    for (n, v) in headers {
        cmd.args(["-H", &format!("{n}: {v}")]);
    }
    let out = cmd.arg(format!("http://{addr}{path}")).output().expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let first = lines.next().unwrap_or_default();
    assert!(first.starts_with("HTTP/2 "), "not an HTTP/2 answer: {text}");
    let status = first.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    Answer { status, headers, body: body.to_owned() }
}

/// An HTTP/1.0 GET (the own path hands it to hyper's): status and body.
fn get_http10(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the router");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut head = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n");
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text)
}

/// Issue 41 item 4: `Authorization` is no list field (RFC 9110 section 11.6.2). A request with
/// two (a good token first) was let through on the first, and the member got both beside the
/// first's `x-rondo-subject`; tier sessions that differ were decided by the first. Now either
/// is a 400 with `invalid_request`, on the own HTTP/1.1 path, on hyper's (HTTP/1.0 and h2c),
/// and no member sees the request. One session sent twice is still one session.
#[test]
fn two_authorization_fields_or_differing_sessions_are_refused_on_every_path() {
    let dir = TempDir::new("identity-twice");
    let secret = b"the secret of the two-field test";
    let keys = json!({"keys": [{"kty": "oct", "kid": "h1", "k": URL_SAFE_NO_PAD.encode(secret)}]});
    std::fs::write(dir.0.join("keys.json"), keys.to_string()).unwrap();
    let (_member, m1) = start_member("m1", "127.0.0.1:0");
    let config = format!(
        "[router]\ntier_key = \"the tier key of the two-field test\"\n\n\
         [admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"admin-secret\"\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nname = \"login\"\nlistener = \"web\"\ncluster = \"c\"\n\
         match = {{ path_prefix = \"/login/\" }}\nlogin = {{ ttl_ms = 600000 }}\n\n\
         [[route]]\nname = \"orders\"\nlistener = \"web\"\ncluster = \"c\"\n\
         auth = {{ issuer = \"{ISSUER}\", audience = \"{AUDIENCE}\", keys = \"keys.json\" }}\n\n\
         [cluster.c]\nmembers = [{{ name = \"m1\", address = \"{m1}\" }}]\n"
    );
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, config).unwrap();
    let mut router = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
    let web = router.addr_after("rondo: listener web on");
    let admin = router.addr_after("rondo: admin API on");
    let key = EncodingKey::from_secret(secret);
    let alice = bearer(&sign(Algorithm::HS256, "h1", &claims(), &key));
    let mut of_bob = claims();
    of_bob["sub"] = json!("bob");
    let bob = bearer(&sign(Algorithm::HS256, "h1", &of_bob, &key));

    // Each path on its own passes one good token (so a 400 below is the second field's doing).
    let a = get(web, "/headers", &[("Authorization", &alice)]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("x-rondo-subject: alice"), "{}", a.body);
    let (status, text) = get_http10(web, "/headers", &[("Authorization", &alice)]);
    assert_eq!(status, 200, "{text}");
    let a = curl_h2(web, "/headers", &[("Authorization", &alice)]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("x-rondo-subject: alice"), "{}", a.body);
    // The login route hands out a tier session (the member vouches for carol).
    let a = get(web, "/login/carol", &[]);
    let set = a.header("set-cookie").expect("a session cookie");
    let session = set.split(';').next().unwrap().to_owned();
    let a = get(web, "/headers", &[("Cookie", &session)]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.body.contains("x-rondo-subject: carol"), "{}", a.body);
    // The same session twice (two paths of one cookie, or two Cookie fields) is one session.
    let twice = format!("{session}; {session}");
    let a = get(web, "/headers", &[("Cookie", &twice)]);
    assert_eq!(a.status, 200, "{}", a.body);
    let a = curl_h2(web, "/headers", &[("Cookie", &session), ("Cookie", &session)]);
    assert_eq!(a.status, 200, "{}", a.body);
    let before = served(admin, "m1");
    assert_eq!(before, 7, "the member's responses are counted");

    let other = format!("{}x", &session[..session.len() - 1]);
    let differ = format!("{session}; {other}");
    let two_tokens: [(&str, &str); 2] = [("Authorization", &alice), ("Authorization", &bob)];
    let same_token: [(&str, &str); 2] = [("Authorization", &alice), ("Authorization", &alice)];
    let token_then_basic: [(&str, &str); 2] =
        [("Authorization", &alice), ("Authorization", "Basic YWxpY2U6eA==")];
    let two_sessions: [(&str, &str); 1] = [("Cookie", &differ)];
    let two_cookie_fields: [(&str, &str); 2] = [("Cookie", &session), ("Cookie", &other)];
    let cases: [(&str, &[(&str, &str)]); 5] = [
        ("two tokens", &two_tokens),
        ("one token twice", &same_token),
        ("a token and basic", &token_then_basic),
        ("two sessions in one field", &two_sessions),
        ("two sessions in two fields", &two_cookie_fields),
    ];
    let mut refused = 0;
    for (what, headers) in cases {
        let a = get(web, "/headers", headers);
        assert_eq!(a.status, 400, "HTTP/1.1, {what}: {}", a.body);
        let www = a.header("www-authenticate").unwrap_or_else(|| panic!("{what}: no challenge"));
        assert!(www.contains("error=\"invalid_request\""), "{what}: {www}");
        assert!(a.body.contains("more than one"), "{what}: {}", a.body);
        let (status, text) = get_http10(web, "/headers", headers);
        assert_eq!(status, 400, "HTTP/1.0, {what}: {text}");
        let a = curl_h2(web, "/headers", headers);
        assert_eq!(a.status, 400, "h2c, {what}: {}", a.body);
        assert!(a.header("www-authenticate").is_some_and(|w| w.contains("invalid_request")));
        refused += 3;
    }
    assert_eq!(served(admin, "m1"), before, "a refused request reached the member");
    assert_eq!(refusals(admin, "orders"), [("ambiguous".to_owned(), refused)]);

    // Sign-on is the login route's chain step on hyper's path too (h2c, HTTP/1.0): the member's
    // vouching header becomes the session cookie and never reaches the client.
    let a = curl_h2(web, "/login/erin", &[]);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(a.header("x-rondo-login").is_none(), "the vouching header reached the client");
    let set = a.header("set-cookie").expect("a session cookie over h2c");
    let erin = set.split(';').next().unwrap().to_owned();
    let a = get(web, "/headers", &[("Cookie", &erin)]);
    assert!(a.body.contains("x-rondo-subject: erin"), "{}", a.body);
    let (status, text) = get_http10(web, "/login/frank", &[]);
    assert_eq!(status, 200, "{text}");
    let lower = text.to_ascii_lowercase();
    assert!(lower.contains("set-cookie: rondo-session="), "{text}");
    assert!(!lower.contains("x-rondo-login"), "{text}");
}

/// `auth` is a step of the route's filter chain: the listener's filters run before it, the
/// route's after it, and they see the verified subject (`${identity.sub}`).
#[test]
fn filters_around_auth_see_the_verified_subject() {
    let dir = TempDir::new("identity-filters");
    let keys = dir.0.join("keys");
    run(&["auth", "dev-key", keys.to_str().unwrap()]);
    let (_member, m1) = start_member("m1", "127.0.0.1:0");
    let config = format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\
         filters = [ {{ request_id = {{}} }} ]\n\n\
         [[route]]\nname = \"orders\"\nlistener = \"web\"\ncluster = \"c\"\n\
         auth = {{ issuer = \"{ISSUER}\", audience = \"{AUDIENCE}\", keys = \"keys/jwks.json\" }}\n\
         filters = [ {{ headers = {{ request = {{ set = {{ \"x-user\" = \"user=${{identity.sub}}\" }} }}, \
         response = {{ set = {{ \"x-sub\" = \"${{identity.sub}}\" }} }} }} }} ]\n\n\
         [cluster.c]\nmembers = [{{ name = \"m1\", address = \"{m1}\" }}]\n"
    );
    let file = dir.0.join("rondo.toml");
    std::fs::write(&file, config).unwrap();
    let mut router = Proc::start(&["serve", "--config", file.to_str().unwrap()]);
    let web = router.addr_after("rondo: listener web on");
    let token = bearer(&sign(Algorithm::EdDSA, "dev-1", &claims(), &dev_key(&keys)));
    for h2 in [false, true] {
        let call = |headers: &[(&str, &str)]| {
            if h2 { curl_h2(web, "/headers", headers) } else { get(web, "/headers", headers) }
        };
        let a = call(&[("authorization", &token), ("x-request-id", "rid-1")]);
        assert_eq!(a.status, 200, "h2={h2}: {}", a.body);
        assert!(a.body.to_lowercase().contains("x-user: user=alice"), "h2={h2}: {}", a.body);
        assert_eq!(a.header("x-sub"), Some("alice"), "h2={h2}");
        assert_eq!(a.header("x-request-id"), Some("rid-1"), "h2={h2}");
        let refused = call(&[("x-user", "user=mallory")]);
        assert_eq!(refused.status, 401, "h2={h2}: {}", refused.body);
        assert_eq!(refused.header("x-sub"), None, "h2={h2}: no route filter ran");
    }
}
