//! A naming hierarchy in three real processes (PKUAS: a naming service falls back to the one
//! above it): leaf → middle → root, each `rondo serve` with `[naming] parent` naming the next.
//! A name registered only at the root is found from the leaf (which says the parent answered
//! and who holds it); a client watching the leaf sees a registration made at the root; with the
//! root killed the leaf still answers from its cache, marked stale; a registration at the leaf
//! shadows the root's name.

use std::net::SocketAddr;
use std::time::Duration;

use rondo_client::wire::Register;
use rondo_client::{Client, NamingClient};
use serde_json::Value;

use super::support::{curl, header, serve, until};
use crate::common::{TempDir, start_member};

/// `GET URL` at a naming API: status, headers, JSON.
fn get(naming: SocketAddr, path: &str) -> (u16, String, Value) {
    let (status, head, body) = curl(&format!("http://{naming}{path}"), &[]);
    (status, head, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn names(v: &Value) -> Vec<String> {
    let mut n: Vec<String> = v["members"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["name"].as_str().map(str::to_owned)).collect())
        .unwrap_or_default();
    n.sort();
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_levels_find_relay_go_stale_and_shadow() {
    let dir = TempDir::new("naming-hierarchy");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let (_m9, a9) = start_member("m9", "127.0.0.1:0");
    let mut root = serve(
        &dir,
        &format!(
            "[cluster.svc]\nmembers = [{{ name = \"m1\", address = \"{a1}\" }}]\n\n\
             [naming]\nlisten = \"127.0.0.1:0\"\n"
        ),
    );
    let middle = serve(
        &dir,
        &format!("[naming]\nlisten = \"127.0.0.1:0\"\nparent = [\"{}\"]\n", root.naming),
    );
    let leaf = serve(
        &dir,
        &format!(
            "[naming]\nlisten = \"127.0.0.1:0\"\nparent = [\"{}\"]\n\
             allow_registered_clusters = true\n",
            middle.naming
        ),
    );

    // Found from the leaf, two levels down; the answer says who holds it.
    let (status, head, v) = get(leaf.naming, "/v1/services/svc");
    assert_eq!(status, 200, "{head}{v}");
    assert_eq!(header(&head, "rondo-naming-level"), Some("parent"));
    assert_eq!(v["level"], "parent");
    assert_eq!(v["answered_by"], root.naming.to_string());
    assert_eq!(v["stale"], false);
    assert_eq!(names(&v), ["m1"]);
    assert_eq!(
        v["view_id"].as_u64().map(|i| i.to_string()).as_deref(),
        header(&head, "rondo-view-id")
    );
    let (status, head, v) = get(leaf.naming, "/v1/lookup/svc");
    assert_eq!(status, 200, "{v}");
    assert_eq!(header(&head, "rondo-naming-level"), Some("parent"));
    assert_eq!(v["member"]["name"], "m1");
    let (_, head, _) = get(root.naming, "/v1/services/svc");
    assert_eq!(header(&head, "rondo-naming-level"), Some("local"));
    let (status, _, v) = get(leaf.naming, "/v1/services/nope");
    assert_eq!(status, 404, "{v}");

    // A client of the leaf (the library's own watch) sees a registration made at the root.
    let client = Client::builder("svc")
        .endpoint(leaf.naming.to_string())
        .watch_wait(Duration::from_secs(60))
        .connect()
        .await
        .expect("the leaf answers for the root's name");
    let at_root =
        NamingClient::new(&root.naming.to_string(), Duration::from_secs(2)).expect("root");
    let reg = |a: SocketAddr| Register {
        address: a.to_string(),
        weight: None,
        group: None,
        ttl_ms: Some(60_000),
    };
    at_root.register("svc", "m2", &reg(a2)).await.expect("register at the root");
    let members = |c: &Client| {
        let mut n: Vec<String> = c.members().into_iter().map(|m| m.name).collect();
        n.sort();
        n
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while members(&client) != ["m1", "m2"] {
            client.changed().await;
        }
    })
    .await
    .expect("the root's registration relayed to the leaf's watchers");

    // The root dies: the leaf still answers from its cache, marked stale.
    root.proc.kill();
    let v = tokio::task::spawn_blocking(move || {
        until(Duration::from_secs(10), "the leaf's answer marked stale", || {
            let (status, head, v) = get(leaf.naming, "/v1/services/svc");
            (status == 200
                && v["stale"] == true
                && header(&head, "rondo-naming-stale") == Some("true"))
            .then_some(v)
        })
    })
    .await
    .expect("poll");
    assert_eq!(names(&v), ["m1", "m2"], "{v}");
    assert_eq!(v["answered_by"], root.naming.to_string());
    let (status, _, v) = get(leaf.naming, "/v1/lookup/svc");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stale"], true);

    // A registration at the leaf shadows the root's name there.
    let at_leaf =
        NamingClient::new(&leaf.naming.to_string(), Duration::from_secs(2)).expect("leaf");
    at_leaf.register("svc", "m9", &reg(a9)).await.expect("register at the leaf");
    let (status, head, v) = get(leaf.naming, "/v1/services/svc");
    assert_eq!(status, 200, "{v}");
    assert_eq!(header(&head, "rondo-naming-level"), Some("local"));
    assert_eq!(v["level"], "local");
    assert_eq!(v["answered_by"], leaf.naming.to_string());
    assert_eq!(names(&v), ["m9"]);
    tokio::time::timeout(Duration::from_secs(10), async {
        while members(&client) != ["m9"] {
            client.changed().await;
        }
    })
    .await
    .expect("the leaf's client follows the shadowing registration");
}
