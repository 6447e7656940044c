//! The client library reads `RONDO_NAMING_ENDPOINTS` when its builder was given no endpoint.
//! The variable belongs to the whole process, so the client runs in a child: this test binary
//! started again on [`in_child`] alone, with the variable set for it only.

use std::process::Command;
use std::time::Duration;

use rondo_client::{BootstrapError, Client};

use super::support::serve;
use crate::common::{TempDir, free_port, start_member};

/// Tells [`in_child`] the naming address and the dead one, and that it is the child.
const CHILD: &str = "RONDO_TEST_CLIENT_ENV_CHILD";

/// Runs [`in_child`] in a child process with `RONDO_NAMING_ENDPOINTS=list` (unset when
/// `None`); its assertion failures fail this test.
fn child(list: Option<&str>, naming: &str, dead: &str, case: &str) {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args(["--exact", "naming_tier::client_env::in_child", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{case} {naming} {dead}"))
        .env_remove("RONDO_NAMING_ENDPOINTS");
    if let Some(l) = list {
        cmd.env("RONDO_NAMING_ENDPOINTS", l);
    }
    let out = cmd.output().expect("run the child");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child {case}: {text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("1 passed"), "child {case} did not run: {text}");
}

#[test]
fn the_client_takes_its_endpoints_from_the_environment_when_given_none() {
    let dir = TempDir::new("naming-env");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let s = serve(
        &dir,
        &format!(
            "[cluster.c]\nmembers = [{{ name = \"m1\", address = \"{a1}\" }}]\n\n\
             [naming]\nlisten = \"127.0.0.1:0\"\n"
        ),
    );
    let naming = s.naming.to_string();
    let dead = format!("127.0.0.1:{}", free_port());
    child(Some(&format!("{dead}, http://{naming}")), &naming, &dead, "live");
    child(Some(&format!("http://{naming}")), &naming, &dead, "builder-wins");
    child(Some("127.0.0.1:1,nope"), &naming, &dead, "malformed");
    child(None, &naming, &dead, "unset");
}

/// The child's side: does nothing unless started by [`child`].
#[test]
fn in_child() {
    let Ok(args) = std::env::var(CHILD) else { return };
    let mut args = args.split(' ');
    let (case, naming, dead) = (args.next(), args.next(), args.next());
    let (Some(case), Some(naming), Some(dead)) = (case, naming, dead) else {
        panic!("bad {CHILD}")
    };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let connect =
        |b: rondo_client::Builder| rt.block_on(b.naming_timeout(Duration::from_secs(2)).connect());
    match case {
        "live" => {
            let client = connect(Client::builder("c")).expect("the variable's live endpoint");
            assert_eq!(client.endpoint(), format!("http://{naming}"));
            assert_eq!(client.members()[0].name, "m1");
        }
        "builder-wins" => {
            // The variable would answer; the builder's dead endpoint is all that is tried.
            let err = connect(Client::builder("c").endpoint(dead)).unwrap_err();
            assert!(matches!(err, BootstrapError::NoAnswer { .. }), "{err:?}");
            assert!(err.to_string().contains(dead), "{err}");
        }
        "malformed" => {
            let err = connect(Client::builder("c")).unwrap_err();
            assert!(matches!(err, BootstrapError::BadEnv(_)), "{err:?}");
            assert_eq!(
                err.to_string(),
                "RONDO_NAMING_ENDPOINTS=`127.0.0.1:1,nope`: entry 2 `nope`: no port (write \
                 host:port)"
            );
        }
        "unset" => {
            let err = connect(Client::builder("c")).unwrap_err();
            assert_eq!(err, BootstrapError::NoEndpoint);
            assert!(err.to_string().contains("RONDO_NAMING_ENDPOINTS"), "{err}");
        }
        other => panic!("unknown case {other}"),
    }
}
