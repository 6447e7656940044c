//! `RONDO_NAMING_ENDPOINTS` (GlassFish's `com.sun.appserv.iiop.endpoints`) read by `rondo ctl
//! lookup` and `rondo agent --register` (the flag wins over the variable); the client library's
//! reading is in `client_env.rs`.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::support::{curl, rondo, serve, until};
use crate::common::{ChildGuard, TempDir, free_port, start_member};

fn config(member: &str) -> String {
    format!(
        "[cluster.c]\nmembers = [{{ name = \"m1\", address = \"{member}\" }}]\n\n\
         [naming]\nlisten = \"127.0.0.1:0\"\n"
    )
}

#[test]
fn ctl_lookup_reads_the_endpoints_from_the_environment_and_its_flag_wins() {
    let dir = TempDir::new("naming-env");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let s = serve(&dir, &config(&a1.to_string()));
    let dead = format!("127.0.0.1:{}", free_port());
    let live = s.naming.to_string();

    // The variable, a dead endpoint first: the live one answers.
    let list = format!("{dead},{live}");
    let (ok, out, err) =
        rondo(&["ctl", "lookup", "c"], &[("RONDO_NAMING_ENDPOINTS", list.as_str())]);
    assert!(ok, "{err}");
    assert!(out.starts_with(&format!("member m1 at {a1} (view ")), "{out}");
    assert!(out.contains(&format!("from http://{live}")), "{out}");

    // Malformed: a clear error naming the variable and the entry.
    let (ok, _, err) =
        rondo(&["ctl", "lookup", "c"], &[("RONDO_NAMING_ENDPOINTS", "127.0.0.1:1,,x")]);
    assert!(!ok);
    assert!(err.contains("RONDO_NAMING_ENDPOINTS=`127.0.0.1:1,,x`: entry 2 is empty"), "{err}");

    // The flag wins: a malformed variable is not even read, and a variable naming the live
    // endpoint does not rescue a flag naming only a dead one.
    let (ok, out, err) = rondo(
        &["ctl", "--naming", &live, "lookup", "c"],
        &[("RONDO_NAMING_ENDPOINTS", "not a list")],
    );
    assert!(ok, "{err}");
    assert!(out.starts_with("member m1"), "{out}");
    let (ok, _, err) = rondo(
        &["ctl", "--naming", &dead, "lookup", "c"],
        &[("RONDO_NAMING_ENDPOINTS", live.as_str())],
    );
    assert!(!ok);
    assert!(err.contains("no naming endpoint answered") && err.contains(&dead), "{err}");

    // Neither: says both ways.
    let (ok, _, err) = rondo(&["ctl", "lookup", "c"], &[]);
    assert!(!ok);
    assert!(err.contains("--naming") && err.contains("RONDO_NAMING_ENDPOINTS"), "{err}");
    // An unknown service is the naming service's own answer, not a failover.
    let (ok, _, err) = rondo(&["ctl", "--naming", &live, "lookup", "nope"], &[]);
    assert!(!ok);
    assert!(err.contains("404"), "{err}");
}

#[test]
fn agent_registers_its_member_at_the_endpoints_of_the_environment() {
    let dir = TempDir::new("naming-env");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let s = serve(&dir, &config(&a1.to_string()));
    let dead = format!("127.0.0.1:{}", free_port());
    let list = format!("{dead},{}", s.naming);
    let answer = format!("http://{}/v1/services/c", s.naming);

    // Malformed variable: refused before anything runs.
    let (ok, _, err) = rondo(
        &["agent", "--register", &a2.to_string(), "--cluster", "c", "--member", "m2"],
        &[("RONDO_NAMING_ENDPOINTS", "a:1,b")],
    );
    assert!(!ok);
    assert!(err.contains("RONDO_NAMING_ENDPOINTS=`a:1,b`: entry 2 `b`: no port"), "{err}");

    let agent = Command::new(crate::common::BIN)
        .args(["agent", "--register", &a2.to_string(), "--cluster", "c", "--member", "m2"])
        .args(["--lease-ms", "3000"])
        .env("RONDO_NAMING_ENDPOINTS", &list)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start rondo agent");
    let agent = ChildGuard(agent);
    until(Duration::from_secs(10), "m2 registered", || {
        let (status, _, body) = curl(&answer, &[]);
        (status == 200 && body.contains("\"m2\"")).then_some(())
    });
    // Kept alive past its lease (3 s), renewed every second.
    std::thread::sleep(Duration::from_millis(4000));
    let (_, _, body) = curl(&answer, &[]);
    assert!(body.contains("\"m2\""), "{body}");

    // Stopped (SIGINT): it deregisters.
    agent.signal("-INT");
    until(Duration::from_secs(5), "m2 deregistered", || {
        let (status, _, body) = curl(&answer, &[]);
        (status == 200 && !body.contains("\"m2\"")).then_some(())
    });
}
