//! The naming service's xDS server driving proxyless gRPC clients (issue 44): real `rondo serve`
//! processes, real grpcio members answering their name and real grpcio clients with the target
//! `xds:///CLUSTER` and a bootstrap pointing at rondo on 127.0.0.1, one client process per
//! scenario (the xDS client is process-global). Helpers in `xds/support.rs`, the Python peers
//! in `xds/peer.py`.

mod common;
#[path = "xds/support.rs"]
mod support;

use std::time::{Duration, Instant};

use support::*;

const LONG: Duration = Duration::from_secs(60);

fn cluster(name: &str, extra: &str, members: &[(&Member, u32)]) -> String {
    format!("[cluster.{name}]\nupstream_protocol = \"http2\"\n{extra}\n{}\n", members_toml(members))
}

fn route(cluster: &str) -> String {
    format!("[[route]]\nlistener = \"web\"\ncluster = \"{cluster}\"\n\n")
}

/// Three members m1..m3 and a client of `web` that has reached all of them.
fn three(extra: &str, weights: [u32; 3]) -> (Vec<Member>, Rondo, Client) {
    let ms: Vec<Member> = ["m1", "m2", "m3"].iter().map(|n| Member::start(n)).collect();
    let body = format!(
        "{}{}",
        route("web"),
        cluster("web", extra, &[(&ms[0], weights[0]), (&ms[1], weights[1]), (&ms[2], weights[2])])
    );
    let rondo = Rondo::start(&body);
    let mut client = Client::start(rondo.xds, "web", None);
    for m in &ms {
        client.wait_for(&m.name, 20);
    }
    (ms, rondo, client)
}

#[test]
fn round_robin_takes_members_in_thirds() {
    let (_ms, rondo, mut client) = three("", [1, 2, 3]);
    let v = client.calls(300);
    assert_eq!(errors(&v), 0, "{v}");
    // Round robin ignores weights, as the router does: exactly one in three each.
    for m in ["m1", "m2", "m3"] {
        assert_eq!(count(&v, m), 100, "{m}: {v}");
    }
    assert!(rondo.metric("rondo_xds_clients", "") >= 1.0);
    assert_eq!(rondo.metric("rondo_xds_cluster_clients", "cluster=\"web\""), 1.0);
    assert!(rondo.metric("rondo_xds_acks_total", "type=\"eds\"") >= 1.0);
    // The dashboard's data: connected xDS clients per cluster.
    let (status, body) = http(rondo.admin, "GET", "/api/v1/status", Some("t"), "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["clusters"][0]["name"], "web");
    assert_eq!(v["clusters"][0]["xds_clients"], 1, "{body}");
}

#[test]
fn rondo_check_validates_the_xds_table() {
    let dir = common::TempDir::new("xds-check");
    let path = dir.0.join("rondo.toml");
    let text = "[naming]\nxds = { listen = \"127.0.0.1:99999\" }\n";
    std::fs::write(&path, text).expect("write");
    let out = std::process::Command::new(common::BIN)
        .args(["check", path.to_str().expect("utf-8")])
        .output()
        .expect("rondo check");
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("rondo.toml:2:18"), "file:line:column: {text}");
    assert!(text.contains("naming.xds.listen"), "{text}");
}

/// Where `@grpc/grpc-js` and `@grpc/grpc-js-xds` are installed (`.ci/run` puts them in
/// `target/xds-node`; `RONDO_XDS_NODE_DIR` overrides), or `None` after saying what is missing
/// (a failure under CI, which installs them).
fn node_modules() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("RONDO_XDS_NODE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::browser::repo().join("target/xds-node"))
        .join("node_modules");
    let node = std::process::Command::new("node").arg("--version").output();
    if node.is_ok_and(|o| o.status.success())
        && dir.join("@grpc/grpc-js-xds/package.json").is_file()
    {
        return Some(dir);
    }
    let missing = format!(
        "node or @grpc/grpc-js-xds in {} (npm install --prefix target/xds-node \
         @grpc/grpc-js@1 @grpc/grpc-js-xds@1)",
        dir.display()
    );
    assert!(!common::browser::in_ci(), "CI is set but the Node xDS test cannot run: {missing}");
    eprintln!("SKIPPED the Node xDS test: missing {missing}");
    None
}

#[test]
fn a_node_grpc_js_client_takes_members_in_thirds_and_drops_a_removed_member() {
    let Some(modules) = node_modules() else { return };
    let ms: Vec<Member> = ["m1", "m2", "m3"].iter().map(|n| Member::start(n)).collect();
    let all = [(&ms[0], 1), (&ms[1], 1), (&ms[2], 1)];
    let mut rondo = Rondo::start(&format!("{}{}", route("web"), cluster("web", "", &all)));
    let mut client = Client::start_node(rondo.xds, "web", &modules);
    for m in &ms {
        client.wait_for(&m.name, 30);
    }
    let v = client.calls(300);
    assert_eq!(errors(&v), 0, "{v}");
    for m in ["m1", "m2", "m3"] {
        assert_eq!(count(&v, m), 100, "{m}: {v}");
    }
    // m3 leaves the configuration: the client stops calling it.
    let two = [(&ms[0], 1), (&ms[1], 1)];
    rondo.reload(&format!("{}{}", route("web"), cluster("web", "", &two)));
    eventually(Duration::from_secs(10), "the Node client drops m3", || {
        count(&client.calls(10), "m3") == 0
    });
    let v = client.calls(100);
    assert_eq!((count(&v, "m1"), count(&v, "m2"), errors(&v)), (50, 50, 0), "{v}");
}

#[test]
fn weights_1_2_3_hold_within_5_points() {
    let (_ms, _rondo, mut client) = three("algorithm = \"weighted\"", [1, 2, 3]);
    let n = 1800;
    let v = client.calls(n);
    assert_eq!(errors(&v), 0, "{v}");
    for (m, w) in [("m1", 1.0), ("m2", 2.0), ("m3", 3.0)] {
        let share = count(&v, m) as f64 / n as f64;
        let want = w / 6.0;
        assert!((share - want).abs() <= 0.05, "{m}: share {share:.3}, want {want:.3}: {v}");
    }
}

/// Calls for 4 s while `event` happens 1.5 s in (returning when, in ms since the calls
/// started); `member` answers before it, none after ~1 s, and no call fails.
fn no_new_calls_after(client: &mut Client, member: &str, event: impl FnOnce() -> u64) {
    client.send("run 4000");
    std::thread::sleep(Duration::from_millis(1500));
    let at = event();
    let v = client.answer(LONG);
    assert_eq!(errors(&v), 0, "a call failed: {v}");
    let last = last_call(&v, member).expect("the member answered before the event");
    assert!(last <= at + 1000, "{member} answered at {last} ms, the event was at {at} ms");
    let calls = v["seq"].as_array().map_or(0, Vec::len);
    let after = v["seq"].as_array().unwrap().iter().filter(|c| c[0].as_u64() > Some(at + 1000));
    assert!(after.count() > 10, "too few calls after the event ({calls} in all): {v}");
}

fn since(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[test]
fn a_drained_member_gets_no_new_calls_within_a_second() {
    let (ms, mut rondo, mut client) = three("", [1, 1, 1]);
    let t0 = Instant::now();
    no_new_calls_after(&mut client, "m1", || {
        let m1 = format!(
            "{{ name = \"m1\", address = \"{}\", weight = 1, state = \"draining\" }}",
            ms[0].addr
        );
        let rest = members_toml(&[(&ms[1], 1), (&ms[2], 1)]).replace("members = [", "");
        let body = format!(
            "{}[cluster.web]\nupstream_protocol = \"http2\"\nmembers = [{m1}, {rest}\n",
            route("web")
        );
        let at = since(t0);
        rondo.reload(&body);
        at
    });
}

#[test]
fn a_lapsed_lease_gets_no_new_calls_within_a_second() {
    let ms: Vec<Member> = ["m1", "m2", "m3"].iter().map(|n| Member::start(n)).collect();
    let body = format!("{}{}", route("web"), cluster("web", "", &[(&ms[0], 1), (&ms[1], 1)]));
    let rondo = Rondo::start(&body);
    let mut client = Client::start(rondo.xds, "web", None);
    rondo.register("web", "m3", &ms[2].addr.to_string(), 600_000);
    client.wait_for("m3", 20);
    // Registered again with a lease of 2.5 s and no keepalive: it lapses 1 s into the calls.
    let registered = Instant::now();
    rondo.register("web", "m3", &ms[2].addr.to_string(), 2500);
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    no_new_calls_after(&mut client, "m3", || {
        let lapse = registered + Duration::from_millis(2500);
        u64::try_from(lapse.saturating_duration_since(t0).as_millis()).unwrap_or(0)
    });
}

#[test]
fn a_killed_member_gets_no_new_calls_and_no_call_fails() {
    let (mut ms, _rondo, mut client) = three("", [1, 1, 1]);
    let t0 = Instant::now();
    no_new_calls_after(&mut client, "m2", || {
        let at = since(t0);
        ms[1].kill();
        at
    });
}

#[test]
fn ring_hash_keys_stay_on_their_member_and_a_third_move_when_one_leaves() {
    let (ms, mut rondo, mut client) =
        three("algorithm = \"hash\"\nhash = { key = \"header:x-key\" }", [1, 1, 1]);
    let before = client.cmd("keys 600", LONG);
    let again = client.cmd("keys 600", LONG);
    assert_eq!(errors(&before), 0, "{before}");
    assert_eq!(before["keys"], again["keys"], "keys moved without a change");
    let keys = |v: &serde_json::Value| -> Vec<String> {
        v["keys"].as_array().unwrap().iter().map(|k| k.as_str().unwrap().to_owned()).collect()
    };
    let spread: std::collections::BTreeSet<String> = keys(&before).into_iter().collect();
    assert_eq!(spread.len(), 3, "keys reach every member: {spread:?}");
    // m3 leaves: its keys move, the others' stay.
    let body = format!(
        "{}{}",
        route("web"),
        cluster(
            "web",
            "algorithm = \"hash\"\nhash = { key = \"header:x-key\" }",
            &[(&ms[0], 1), (&ms[1], 1)]
        )
    );
    rondo.reload(&body);
    let mut after = client.cmd("keys 600", LONG);
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys(&after).iter().any(|k| k == "m3") && Instant::now() < deadline {
        after = client.cmd("keys 600", LONG);
    }
    assert_eq!(errors(&after), 0, "{after}");
    let (b, a) = (keys(&before), keys(&after));
    let moved = b.iter().zip(&a).filter(|(x, y)| x != y).count();
    for (x, y) in b.iter().zip(&a) {
        assert!(x == "m3" || x == y, "a key of {x} moved to {y}");
    }
    let share = moved as f64 / b.len() as f64;
    assert!((0.2..=0.47).contains(&share), "{moved} of {} keys moved", b.len());
}

#[test]
fn a_retry_on_unavailable_succeeds_on_another_member() {
    let mut ms: Vec<Member> = ["m1", "m2"].iter().map(|n| Member::start(n)).collect();
    let policy = "outlier = { consecutive_failures = 0 }\nretry = { attempts = 3 }";
    let body = format!("{}{}", route("web"), cluster("web", policy, &[(&ms[0], 1), (&ms[1], 1)]));
    let mut rondo = Rondo::start(&body);
    let mut client = Client::start(rondo.xds, "web", None);
    client.wait_for("m1", 20);
    client.wait_for("m2", 20);
    ms[0].fail(true);
    let v = client.calls(100);
    assert_eq!(errors(&v), 0, "{v}");
    assert_eq!(count(&v, "m2"), 100, "{v}");
    // Without retries the same calls fail half the time: the retries above were rondo's.
    let once = "outlier = { consecutive_failures = 0 }\nretry = { attempts = 1 }";
    let body = format!("{}{}", route("web"), cluster("web", once, &[(&ms[0], 1), (&ms[1], 1)]));
    rondo.reload(&body);
    eventually(Duration::from_secs(10), "calls fail without retries", || {
        errors(&client.calls(20)) > 0
    });
}

#[test]
fn outlier_detection_ejects_a_failing_member() {
    let (mut ms, _rondo, mut client) = three(
        "outlier = { consecutive_failures = 5, base_ejection_ms = 30000 }\nretry = { attempts = 1 }",
        [1, 1, 1],
    );
    ms[0].fail(true);
    let v = client.cmd("run 4000", LONG);
    let seq = v["seq"].as_array().unwrap();
    let failed: Vec<u64> = seq
        .iter()
        .filter(|c| c[1].as_str().unwrap().starts_with("ERR"))
        .map(|c| c[0].as_u64().unwrap())
        .collect();
    assert!(!failed.is_empty(), "m1 failed no call: {v}");
    // gRPC evaluates ejections every second (the interval rondo sends).
    let last = *failed.last().unwrap();
    assert!(last < 3000, "m1 still took calls at {last} ms");
    let late = seq.iter().filter(|c| c[0].as_u64().unwrap() > 3000).count();
    assert!(late > 10, "{v}");
}

#[test]
fn an_aggregate_cluster_fails_over_to_the_backups() {
    let mut p1 = Member::start("p1");
    let b1 = Member::start("b1");
    let body = format!(
        "[[route]]\nlistener = \"web\"\ncluster = \"primary\"\nbackups = [\"backup\"]\n\n{}{}",
        cluster("primary", "", &[(&p1, 1)]),
        cluster("backup", "", &[(&b1, 1)])
    );
    let rondo = Rondo::start(&body);
    let mut client = Client::start(rondo.xds, "primary", None);
    client.wait_for("p1", 20);
    let v = client.calls(20);
    assert_eq!(count(&v, "p1"), 20, "the primary takes every call while it can: {v}");
    p1.kill();
    client.wait_for("b1", 20);
    let v = client.calls(50);
    assert_eq!((count(&v, "b1"), errors(&v)), (50, 0), "{v}");
}

#[test]
fn a_nack_keeps_the_last_good_config_and_is_counted() {
    let ms: Vec<Member> = ["m1", "m2"].iter().map(|n| Member::start(n)).collect();
    let body = format!("{}{}", route("web"), cluster("web", "", &[(&ms[0], 1), (&ms[1], 1)]));
    let rondo = Rondo::start(&body);
    let mut client = Client::start(rondo.xds, "web", None);
    client.wait_for("m1", 20);
    client.wait_for("m2", 20);
    assert_eq!(rondo.metric("rondo_xds_nacks_total", "type=\"eds\""), 0.0);
    // A member by host name: gRPC takes IP addresses only and rejects the assignment.
    rondo.register("web", "m3", "localhost:9", 600_000);
    eventually(Duration::from_secs(10), "the client NACKs the assignment", || {
        rondo.metric("rondo_xds_nacks_total", "type=\"eds\"") >= 1.0
    });
    let v = client.calls(60);
    assert_eq!(errors(&v), 0, "{v}");
    assert_eq!((count(&v, "m1"), count(&v, "m2")), (30, 30), "the last good config: {v}");
}

#[test]
fn clients_keep_serving_from_their_cache_while_rondo_restarts() {
    let ms: Vec<Member> = ["m1", "m2"].iter().map(|n| Member::start(n)).collect();
    let body = format!("{}{}", route("web"), cluster("web", "", &[(&ms[0], 1), (&ms[1], 1)]));
    let port = common::free_port();
    let mut rondo = Rondo::start_on(&body, port);
    let mut client = Client::start(rondo.xds, "web", None);
    client.wait_for("m1", 20);
    client.wait_for("m2", 20);
    rondo.proc.kill();
    let v = client.calls(100);
    assert_eq!((errors(&v), count(&v, "m1"), count(&v, "m2")), (0, 50, 50), "{v}");
    // Back on the same port with m1 drained: the client reconnects and follows.
    let drained = body.replace("weight = 1 }", "weight = 1, state = \"draining\" }").replacen(
        ", state = \"draining\" }",
        " }",
        1,
    );
    assert!(drained.contains("state = \"draining\""));
    let dir = std::mem::replace(&mut rondo.dir, common::TempDir::new("xds-unused"));
    let _rondo = Rondo::start_in(dir, &drained, port);
    eventually(Duration::from_secs(30), "the client follows the restarted rondo", || {
        count(&client.calls(10), "m2") == 0
    });
}

#[test]
fn prefer_local_puts_the_clients_zone_first_and_fails_over_to_the_rest() {
    let mut east = Member::start("east1");
    let west = Member::start("west1");
    let body = format!(
        "{}[cluster.web]\nupstream_protocol = \"http2\"\nlocality = {{ prefer_local = true }}\n\
         members = [{{ name = \"east1\", address = \"{}\", group = \"east\" }}, \
         {{ name = \"west1\", address = \"{}\", group = \"west\" }}]\n",
        route("web"),
        east.addr,
        west.addr
    );
    let rondo = Rondo::start(&body);
    let mut client = Client::start(rondo.xds, "web", Some("east"));
    client.wait_for("east1", 20);
    let v = client.calls(50);
    assert_eq!((count(&v, "east1"), errors(&v)), (50, 0), "{v}");
    // A client of the other zone gets its own priorities.
    let mut other = Client::start(rondo.xds, "web", Some("west"));
    other.wait_for("west1", 20);
    let v = other.calls(50);
    assert_eq!(count(&v, "west1"), 50, "{v}");
    drop(other);
    east.kill();
    client.wait_for("west1", 20);
    let v = client.calls(50);
    assert_eq!((count(&v, "west1"), errors(&v)), (50, 0), "{v}");
}

#[test]
fn least_sessions_and_rotating_clusters_are_accepted_and_balanced_as_mapped() {
    let ms: Vec<Member> = ["m1", "m2", "m3"].iter().map(|n| Member::start(n)).collect();
    let all = [(&ms[0], 1), (&ms[1], 1), (&ms[2], 1)];
    let body = format!(
        "{}{}{}",
        route("least"),
        cluster("least", "algorithm = \"least-sessions\"", &all),
        cluster("rotating", "algorithm = \"rotating\"", &all)
    );
    let rondo = Rondo::start(&body);
    // Least sessions: the members in one locality, least_request where the client has it and
    // round robin (grpcio) otherwise; one call at a time, so about a third each either way.
    let mut least = Client::start(rondo.xds, "least", None);
    for m in &ms {
        least.wait_for(&m.name, 20);
    }
    let v = least.calls(600);
    assert_eq!(errors(&v), 0, "{v}");
    for m in ["m1", "m2", "m3"] {
        assert!((150..=250).contains(&count(&v, m)), "{m}: {v}");
    }
    drop(least);
    // Rotating: pick_first over a list shuffled once per client: one member takes every call.
    let mut rotating = Client::start(rondo.xds, "rotating", None);
    let v = rotating.calls(100);
    assert_eq!(errors(&v), 0, "{v}");
    let counts = v["counts"].as_object().expect("counts");
    assert_eq!(counts.len(), 1, "{v}");
    assert_eq!(rondo.metric("rondo_xds_nacks_total", ""), 0.0);
}

#[test]
fn least_cpu_weights_follow_the_agents_reports() {
    let ms: Vec<Member> = ["m1", "m2", "m3"].iter().map(|n| Member::start(n)).collect();
    let all = [(&ms[0], 1), (&ms[1], 1), (&ms[2], 1)];
    let key = "xds-test-key-0123456789abcdef";
    let body = format!(
        "[agent]\nlisten = \"127.0.0.1:0\"\nkey = \"{key}\"\ninterval_ms = 200\n\n{}{}",
        route("web"),
        cluster("web", "algorithm = \"least-cpu\"\nagent = { timeout_ms = 2000 }", &all)
    );
    let rondo = Rondo::start(&body);
    let receiver = rondo.agents.expect("agent receiver").to_string();
    // CPU in use 90 %, 50 %, 10 %: weights 1 - CPU, that is 10, 50 and 90 of 150.
    let agent = |m: &str, cpu: &str| {
        let args = ["agent", "--report-to", &receiver, "--cluster", "web", "--member", m];
        let more = ["--key", key, "--interval-ms", "200", "--fixed-cpu", cpu];
        common::Proc::start(&[&args[..], &more[..]].concat())
    };
    let mut agents: Vec<common::Proc> =
        [("m1", "0.9"), ("m2", "0.5"), ("m3", "0.1")].iter().map(|(m, c)| agent(m, c)).collect();
    let mut client = Client::start(rondo.xds, "web", None);
    client.wait_for("m1", 20);
    // The streams rebuild their endpoints every 3 s: the reported loads arrive within that.
    let n = 1500;
    let mut v = serde_json::Value::Null;
    eventually(Duration::from_secs(20), "weights follow the reports", || {
        v = client.calls(300);
        count(&v, "m3") > 3 * count(&v, "m1")
    });
    let _ = v;
    let v = client.calls(n);
    assert_eq!(errors(&v), 0, "{v}");
    for (m, w) in [("m1", 10.0), ("m2", 50.0), ("m3", 90.0)] {
        let share = count(&v, m) as f64 / n as f64;
        let want = w / 150.0;
        assert!((share - want).abs() <= 0.05, "{m}: share {share:.3}, want {want:.3}: {v}");
    }
    // m1's load falls to m3's: no view changes (m1 stays available), the periodic rebuild
    // pushes the new weights.
    agents[0].kill();
    agents[0] = agent("m1", "0.1");
    eventually(Duration::from_secs(20), "m1's weight follows its new report", || {
        let v = client.calls(300);
        count(&v, "m1") * 2 > count(&v, "m3")
    });
}

#[test]
fn streams_past_max_clients_are_refused() {
    let ms: Vec<Member> = ["m1"].iter().map(|n| Member::start(n)).collect();
    let body = format!("{}{}", route("web"), cluster("web", "", &[(&ms[0], 1)]));
    let dir = common::TempDir::new("xds-max");
    let rondo = Rondo::start_in_with(dir, &body, 0, "max_clients = 1");
    let mut first = Client::start(rondo.xds, "web", None);
    first.wait_for("m1", 20);
    // The second client's stream is refused: it has no config, so its call fails.
    let mut second = Client::start(rondo.xds, "web", None);
    let v = second.calls(1);
    assert_eq!(count(&v, "m1"), 0, "{v}");
    assert_eq!(errors(&v), 1, "{v}");
    assert_eq!(rondo.metric("rondo_xds_clients", ""), 1.0);
    assert_eq!(errors(&first.calls(10)), 0);
}

#[test]
fn a_hitless_upgrade_moves_the_clients_to_the_new_process_without_a_failed_call() {
    let ms: Vec<Member> = ["m1", "m2"].iter().map(|n| Member::start(n)).collect();
    let dir = common::TempDir::new("xds-upgrade");
    let sock = dir.0.join("upgrade.sock");
    let body = format!(
        "[router]\nupgrade_socket = \"{}\"\ndrain_timeout_ms = 1000\n\n{}{}",
        sock.display(),
        route("web"),
        cluster("web", "", &[(&ms[0], 1), (&ms[1], 1)])
    );
    let path = dir.0.join("rondo.toml");
    let mut old = Rondo::start_in(dir, &body, common::free_port());
    let mut client = Client::start(old.xds, "web", None);
    client.wait_for("m1", 20);
    client.wait_for("m2", 20);
    client.send("run 5000");
    std::thread::sleep(Duration::from_millis(500));
    let mut new = common::Proc::start(&["serve", "--upgrade", "--config", path.to_str().unwrap()]);
    let xds = new.addr_after("naming xDS (ADS) on");
    assert_eq!(xds, old.xds, "the socket is handed over");
    eventually(Duration::from_secs(20), "the old process ends", || {
        old.proc.child.try_wait().ok().flatten().is_some()
    });
    let v = client.answer(LONG);
    assert_eq!(errors(&v), 0, "no call fails across the upgrade: {v}");
    // The client follows the new process's view: m1 drained there.
    let drain = "/api/v1/clusters/web/members/m1/drain";
    let (status, answer) = http(old.admin, "POST", drain, Some("t"), "");
    assert_eq!(status, 200, "{answer}");
    eventually(Duration::from_secs(20), "the client follows the new process", || {
        count(&client.calls(10), "m1") == 0
    });
    drop(new);
}

/// `xds = { lb = "orca-wrr" }`: the client weighs members by the ORCA load reports on their
/// answers (gRFC A58), qps / CPU utilization. Both members answer 100 queries per second, m1
/// at 20 % CPU and m2 at 80 %: weights 500 and 125, so m1 takes 80 % of the calls (round robin,
/// which the client would run without the policy, gives each half). The configured weights
/// (1:4, the other way) are not what the client goes by: the members share a locality.
#[test]
fn orca_wrr_shifts_calls_to_the_member_reporting_less_load() {
    let mut ms: Vec<Member> = ["m1", "m2"].iter().map(|n| Member::start(n)).collect();
    ms[0].report_load(0.2, 100.0);
    ms[1].report_load(0.8, 100.0);
    let all = [(&ms[0], 1), (&ms[1], 4)];
    let extra = "algorithm = \"weighted\"\nxds = { lb = \"orca-wrr\" }";
    let body = format!("{}{}", route("web"), cluster("web", extra, &all));
    let rondo = Rondo::start(&body);
    let mut client = Client::start(rondo.xds, "web", None);
    client.wait_for("m1", 20);
    client.wait_for("m2", 20);
    let share = |v: &serde_json::Value, m: &str, n: usize| count(v, m) as f64 / n as f64;
    // Weights count after 2 s of reports (the blackout) and are recomputed every second.
    eventually(Duration::from_secs(20), "calls shift to m1", || {
        share(&client.calls(200), "m1", 200) >= 0.7
    });
    let v = client.calls(400);
    assert_eq!(errors(&v), 0, "{v}");
    let m1 = share(&v, "m1", 400);
    assert!((0.7..=0.9).contains(&m1), "m1's share {m1:.3}, want 0.8: {v}");
    // The reports swap: the calls follow them, with no change to the configuration.
    ms[0].report_load(0.8, 100.0);
    ms[1].report_load(0.2, 100.0);
    eventually(Duration::from_secs(20), "calls shift to m2", || {
        share(&client.calls(200), "m2", 200) >= 0.7
    });
    let v = client.calls(400);
    assert_eq!(errors(&v), 0, "{v}");
    let m2 = share(&v, "m2", 400);
    assert!((0.7..=0.9).contains(&m2), "m2's share {m2:.3}, want 0.8: {v}");
    // The client took the Cluster: ACKed, never NACKed.
    assert!(rondo.metric("rondo_xds_acks_total", "type=\"cds\"") >= 1.0);
    assert_eq!(rondo.metric("rondo_xds_nacks_total", ""), 0.0);
}

#[test]
fn rondo_check_validates_a_clusters_xds_lb() {
    let dir = common::TempDir::new("xds-check-lb");
    let path = dir.0.join("rondo.toml");
    let check = |text: &str| {
        std::fs::write(&path, text).expect("write");
        let out = std::process::Command::new(common::BIN)
            .args(["check", path.to_str().expect("utf-8")])
            .output()
            .expect("rondo check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let members = "members = [{ name = \"a\", address = \"127.0.0.1:9001\" }]\n";
    let (ok, text) = check(&format!("[cluster.web]\nxds = {{ lb = \"wrr\" }}\n{members}"));
    assert!(!ok, "{text}");
    assert!(text.contains("rondo.toml:2:14"), "file:line:column: {text}");
    assert!(text.contains("cluster.web.xds.lb"), "{text}");
    assert!(text.contains("unknown xds lb `wrr`, expected `auto` or `orca-wrr`"), "{text}");
    let hash = "algorithm = \"hash\"\nxds = { lb = \"orca-wrr\" }\n";
    let (ok, text) = check(&format!("[cluster.web]\n{hash}{members}"));
    assert!(!ok, "{text}");
    assert!(text.contains("rondo.toml:3:14"), "file:line:column: {text}");
    assert!(text.contains("cannot serve a `hash` cluster"), "{text}");
    let (ok, text) = check(&format!("[cluster.web]\nxds = {{ lb = \"orca-wrr\" }}\n{members}"));
    assert!(ok, "{text}");
}

/// The same `orca-wrr` cluster to Node clients: grpc-js-xds 1.14 has weighted round robin
/// behind `GRPC_EXPERIMENTAL_XDS_WRR_LB`, so without it the client takes the fallback (round
/// robin: exact halves, whatever the reports) and ACKs, and with it the calls follow the
/// reports as grpcio's do.
#[test]
fn orca_wrr_falls_back_to_round_robin_where_the_client_lacks_it() {
    let Some(modules) = node_modules() else { return };
    let mut ms: Vec<Member> = ["m1", "m2"].iter().map(|n| Member::start(n)).collect();
    ms[0].report_load(0.2, 100.0);
    ms[1].report_load(0.8, 100.0);
    let all = [(&ms[0], 1), (&ms[1], 1)];
    let body = format!("{}{}", route("web"), cluster("web", "xds = { lb = \"orca-wrr\" }", &all));
    let rondo = Rondo::start(&body);
    let mut plain = Client::start_node(rondo.xds, "web", &modules);
    plain.wait_for("m1", 30);
    plain.wait_for("m2", 30);
    // Longer than the blackout and a weight update: a client weighing by reports would shift.
    std::thread::sleep(Duration::from_secs(4));
    let v = plain.calls(200);
    assert_eq!(errors(&v), 0, "{v}");
    assert_eq!((count(&v, "m1"), count(&v, "m2")), (100, 100), "round robin: {v}");
    drop(plain);
    let wrr = [("GRPC_EXPERIMENTAL_XDS_WRR_LB", "true")];
    let mut client = Client::start_node_env(rondo.xds, "web", &modules, &wrr);
    client.wait_for("m1", 30);
    eventually(Duration::from_secs(20), "the Node client's calls shift to m1", || {
        let v = client.calls(200);
        count(&v, "m1") as f64 / 200.0 >= 0.7
    });
    let v = client.calls(400);
    assert_eq!(errors(&v), 0, "{v}");
    let m1 = count(&v, "m1") as f64 / 400.0;
    assert!((0.7..=0.9).contains(&m1), "m1's share {m1:.3}, want 0.8: {v}");
    assert_eq!(rondo.metric("rondo_xds_nacks_total", ""), 0.0);
}
