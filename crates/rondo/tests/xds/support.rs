//! What the xDS tests share: grpcio members and proxyless grpcio clients (`peer.py`), the
//! Node client (`client.js`), a
//! `rondo serve` with a naming service and its xDS server, and plain HTTP calls to its APIs.

use std::io::{BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{Proc, TempDir, send_lines};

const PEER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/xds/peer.py");

type Piped = (Child, ChildStdin, mpsc::Receiver<String>);

fn python(args: &[&str]) -> Piped {
    let mut cmd = Command::new("python3");
    cmd.arg(PEER).args(args);
    spawn(cmd, None)
}

fn spawn(mut cmd: Command, env: Option<(&str, String)>) -> Piped {
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
    if std::env::var_os("RONDO_TEST_STDERR").is_none() {
        cmd.stderr(Stdio::null());
    }
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("python3 (with grpcio: pip install grpcio) or node runs");
    let stdin = child.stdin.take().expect("stdin");
    let lines = send_lines(child.stdout.take().expect("stdout"));
    (child, stdin, lines)
}

fn next_line(lines: &mpsc::Receiver<String>, wait: Duration, what: &str) -> String {
    lines.recv_timeout(wait).unwrap_or_else(|e| panic!("no answer from {what} ({e})"))
}

/// A grpcio member answering `/test.Echo/Say` with its name.
pub struct Member {
    pub name: String,
    pub addr: SocketAddr,
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Member {
    pub fn start(name: &str) -> Member {
        let (child, stdin, lines) = python(&["serve", name]);
        let line = next_line(&lines, Duration::from_secs(20), name);
        let port: u16 = line.strip_prefix("listening ").and_then(|p| p.parse().ok()).expect("port");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        Member { name: name.to_owned(), addr, child, stdin, lines }
    }

    /// From now on every call fails with UNAVAILABLE (`true`) or is answered (`false`).
    pub fn fail(&mut self, on: bool) {
        let cmd = if on { "fail" } else { "ok" };
        writeln!(self.stdin, "{cmd}").expect("member stdin");
        next_line(&self.lines, Duration::from_secs(5), &self.name);
    }

    /// From now on every answer carries an ORCA load report (`endpoint-load-metrics-bin`) of
    /// this CPU utilization and queries per second.
    pub fn report_load(&mut self, cpu: f64, qps: f64) {
        writeln!(self.stdin, "load {cpu} {qps}").expect("member stdin");
        next_line(&self.lines, Duration::from_secs(5), &self.name);
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A proxyless grpcio client of `xds:///CLUSTER` (one process: the xDS client is
/// process-global), bootstrapped to the xDS server at `xds` with node `locality.zone`.
pub struct Client {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Client {
    pub fn start(xds: SocketAddr, cluster: &str, zone: Option<&str>) -> Client {
        let mut cmd = Command::new("python3");
        cmd.args([PEER, "client", cluster]);
        Client::start_with(cmd, xds, cluster, zone)
    }

    /// The same client in Node (@grpc/grpc-js with @grpc/grpc-js-xds from `modules`).
    pub fn start_node(xds: SocketAddr, cluster: &str, modules: &std::path::Path) -> Client {
        Client::start_node_env(xds, cluster, modules, &[])
    }

    /// [`Client::start_node`] with more environment (e.g. grpc-js-xds's experiment switches).
    pub fn start_node_env(
        xds: SocketAddr,
        cluster: &str,
        modules: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Client {
        let mut cmd = Command::new("node");
        cmd.arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/xds/client.js"))
            .arg(cluster)
            .env("NODE_PATH", modules)
            .envs(env.iter().copied());
        Client::start_with(cmd, xds, cluster, None)
    }

    fn start_with(cmd: Command, xds: SocketAddr, cluster: &str, zone: Option<&str>) -> Client {
        // Node's grpc-js-xds requires a locality, if empty.
        let mut node = serde_json::json!({ "id": format!("test-{cluster}"), "locality": {} });
        if let Some(z) = zone {
            node["locality"] = serde_json::json!({ "zone": z });
        }
        let bootstrap = serde_json::json!({
            "xds_servers": [{
                "server_uri": xds.to_string(),
                "channel_creds": [{ "type": "insecure" }],
                "server_features": ["xds_v3"],
            }],
            "node": node,
        });
        let (child, stdin, lines) =
            spawn(cmd, Some(("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap.to_string())));
        Client { child, stdin, lines }
    }

    /// One command (see `peer.py`) and its JSON answer.
    pub fn cmd(&mut self, cmd: &str, wait: Duration) -> Value {
        writeln!(self.stdin, "{cmd}").expect("client stdin");
        let line = next_line(&self.lines, wait, "the xDS client");
        serde_json::from_str(&line).expect("json")
    }

    /// Sends a command whose answer is read later with [`Client::answer`].
    pub fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").expect("client stdin");
    }

    pub fn answer(&mut self, wait: Duration) -> Value {
        let line = next_line(&self.lines, wait, "the xDS client");
        serde_json::from_str(&line).expect("json")
    }

    /// Calls until `member` answers one (at most `secs`); panics otherwise.
    pub fn wait_for(&mut self, member: &str, secs: u64) {
        let v = self.cmd(&format!("wait {member} {secs}"), Duration::from_secs(secs + 10));
        assert_eq!(v["ok"], true, "{member} never answered within {secs} s: {v}");
    }

    /// `n` calls (with header `x-key: key`): member -> count, and errors by code.
    pub fn calls(&mut self, n: usize) -> Value {
        self.cmd(&format!("calls {n}"), Duration::from_secs(60))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A member count in a `calls` answer (0 when absent).
pub fn count(v: &Value, member: &str) -> u64 {
    v["counts"][member].as_u64().unwrap_or(0)
}

/// The errors of an answer, in all.
pub fn errors(v: &Value) -> u64 {
    v["errors"].as_object().map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
}

/// The last millisecond of a `run` answer at which `member` answered, if ever.
pub fn last_call(v: &Value, member: &str) -> Option<u64> {
    v["seq"].as_array()?.iter().filter(|c| c[1] == member).filter_map(|c| c[0].as_u64()).next_back()
}

/// A cluster table's members line for `members` with weights.
pub fn members_toml(members: &[(&Member, u32)]) -> String {
    let rows: Vec<String> = members
        .iter()
        .map(|(m, w)| {
            format!("{{ name = \"{}\", address = \"{}\", weight = {w} }}", m.name, m.addr)
        })
        .collect();
    format!("members = [{}]", rows.join(", "))
}

/// A `rondo serve` with a naming service (embedded registry), its xDS server and an admin API
/// (token `t`), on the config `body` (clusters and routes; a listener `web` is added).
pub struct Rondo {
    pub proc: Proc,
    pub dir: TempDir,
    pub naming: SocketAddr,
    pub xds: SocketAddr,
    pub admin: SocketAddr,
    /// The load agents' receiver, when the config has `[agent]`.
    pub agents: Option<SocketAddr>,
}

impl Rondo {
    pub fn start(body: &str) -> Rondo {
        Rondo::start_on(body, 0)
    }

    /// With the xDS server on `xds_port` (0: any).
    pub fn start_on(body: &str, xds_port: u16) -> Rondo {
        let dir = TempDir::new("xds");
        Rondo::start_in(dir, body, xds_port)
    }

    pub fn start_in(dir: TempDir, body: &str, xds_port: u16) -> Rondo {
        Rondo::start_in_with(dir, body, xds_port, "")
    }

    /// With more fields in the `xds` table (`max_clients = 1`).
    pub fn start_in_with(dir: TempDir, body: &str, xds_port: u16, xds_extra: &str) -> Rondo {
        let path = dir.0.join("rondo.toml");
        let text = config(body, xds_port);
        let text = if xds_extra.is_empty() {
            text
        } else {
            let listen = format!("xds = {{ listen = \"127.0.0.1:{xds_port}\"");
            text.replacen(&listen, &format!("{listen}, {xds_extra}"), 1)
        };
        std::fs::write(&path, text).expect("write config");
        let mut proc = Proc::start(&["serve", path.to_str().expect("utf-8")]);
        let (mut admin, mut naming, mut xds, mut agents) = (None, None, None, None);
        let wants_agents = body.contains("[agent]");
        while admin.is_none()
            || naming.is_none()
            || xds.is_none()
            || agents.is_none() && wants_agents
        {
            let line = proc.line_with("rondo: ", Duration::from_secs(20));
            let addr = line.rsplit(' ').next().and_then(|a| a.parse::<SocketAddr>().ok());
            if let Some(rest) = line.split_once("agent receiver on ").map(|(_, r)| r) {
                agents = rest.split(' ').next().and_then(|a| a.parse().ok());
            } else if line.contains("admin API on") {
                admin = addr;
            } else if line.contains("naming API") {
                naming = addr;
            } else if line.contains("naming xDS (ADS) on") {
                xds = addr;
            }
        }
        let (admin, naming, xds) = (admin.unwrap(), naming.unwrap(), xds.unwrap());
        Rondo { proc, dir, naming, xds, admin, agents }
    }

    /// Writes `body` as the new config and reloads it (SIGHUP).
    pub fn reload(&mut self, body: &str) {
        let path = self.dir.0.join("rondo.toml");
        std::fs::write(&path, config(body, self.xds.port())).expect("write config");
        let pid = self.proc.child.id().to_string();
        let ok = Command::new("kill").args(["-HUP", &pid]).status().expect("kill").success();
        assert!(ok, "SIGHUP");
    }

    /// A counter or gauge of `/metrics` (the sum over series whose labels contain `labels`).
    pub fn metric(&self, name: &str, labels: &str) -> f64 {
        let (status, body) = http(self.admin, "GET", "/metrics", Some("t"), "");
        assert_eq!(status, 200, "{body}");
        body.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter(|l| l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Registers `member` at `address` into `cluster` with a lease of `ttl_ms`.
    pub fn register(&self, cluster: &str, member: &str, address: &str, ttl_ms: u64) {
        let body = serde_json::json!({ "address": address, "ttl_ms": ttl_ms }).to_string();
        let path = format!("/v1/services/{cluster}/members/{member}");
        let (status, answer) = http(self.naming, "PUT", &path, None, &body);
        assert_eq!(status, 200, "{answer}");
    }
}

fn config(body: &str, xds_port: u16) -> String {
    format!(
        "[log]\nlevel = \"warn\"\n\n[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"t\"\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\nxds = {{ listen = \"127.0.0.1:{xds_port}\" }}\n\n\
         [[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n{body}"
    )
}

/// One HTTP/1.1 request (`Host: 127.0.0.1`, an optional bearer token): status and body.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("send");
    let mut answer = Vec::new();
    let _ = BufReader::new(&mut s).read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

/// Waits until `f` holds (at most `wait`, checking every 50 ms).
pub fn eventually(wait: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: not within {wait:?}");
}
