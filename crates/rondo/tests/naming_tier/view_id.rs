//! The view id on every reply (PKUAS): a cluster with `view_id_header = true` gets
//! `rondo-view-id` on every proxied response (HTTP/1.1 on the own path, HTTP/2 on hyper's),
//! others get nothing; a client library with its watch turned off learns of a registration from
//! one reply through the router.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use rondo_client::wire::Register;
use rondo_client::{Client, NamingClient, SlotBody};
use tower::{Layer, Service, ServiceExt};

use super::support::{curl, header, serve};
use crate::common::{TempDir, start_member};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_its_watch_refetches_when_a_reply_carries_a_newer_view() {
    let dir = TempDir::new("naming-view-id");
    let (_m1, a1) = start_member("m1", "127.0.0.1:0");
    let (_m2, a2) = start_member("m2", "127.0.0.1:0");
    let s = serve(
        &dir,
        &format!(
            "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"plain\"\nmatch = {{ path_prefix = \"/plain\" }}\n\n\
             [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
             [cluster.c]\nview_id_header = true\nmembers = [{{ name = \"m1\", address = \"{a1}\" }}]\n\n\
             [cluster.plain]\nmembers = [{{ name = \"m1\", address = \"{a1}\" }}]\n\n\
             [naming]\nlisten = \"127.0.0.1:0\"\n"
        ),
    );
    let (naming, web) = (s.naming, s.listener.expect("listener"));
    let status = |n| async move {
        let (_, _, body) =
            tokio::task::spawn_blocking(move || curl(&format!("http://{n}/v1/status"), &[]))
                .await
                .expect("curl");
        let v: serde_json::Value = serde_json::from_str(&body).expect("status json");
        v["view_id"].as_u64().expect("view_id")
    };
    let view = status(naming).await;

    // Both codecs carry the id of the view in effect; a cluster without the option nothing.
    let (code, head, _) = curl(&format!("http://{web}/x"), &[]);
    assert_eq!(code, 200);
    assert_eq!(header(&head, "rondo-view-id"), Some(view.to_string().as_str()), "{head}");
    let (code, head, _) = curl(&format!("http://{web}/x"), &["--http2-prior-knowledge"]);
    assert_eq!(code, 200);
    assert_eq!(header(&head, "rondo-view-id"), Some(view.to_string().as_str()), "{head}");
    let (code, head, _) = curl(&format!("http://{web}/plain"), &[]);
    assert_eq!(code, 200);
    assert_eq!(header(&head, "rondo-view-id"), None, "{head}");

    // A client with no watch: only replies can tell it of a new view.
    let client = Client::builder("c")
        .endpoint(naming.to_string())
        .watch(false)
        .connect()
        .await
        .expect("connect");
    let held = client.view_id();
    let api = NamingClient::new(&naming.to_string(), Duration::from_secs(2)).expect("endpoint");
    let register =
        Register { address: a2.to_string(), weight: None, group: None, ttl_ms: Some(30_000) };
    api.register("c", "m2", &register).await.expect("register");
    let newer = status(naming).await;
    assert!(newer > held, "{newer} > {held}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(client.view_id(), held, "no watch: nothing told the client yet");
    assert_eq!(client.members().len(), 1);

    // The client balances service `c`; its transport sends each call through the router
    // (which proxies it to `c` as well), so the reply carries the router's view id.
    let http: HttpClient<_, SlotBody<Empty<Bytes>>> =
        HttpClient::builder(TokioExecutor::new()).build_http();
    let via_router = tower::service_fn(move |mut req: http::Request<SlotBody<Empty<Bytes>>>| {
        let http = http.clone();
        *req.uri_mut() = format!("http://{web}{}", req.uri().path()).parse().expect("uri");
        async move { http.request(req).await }
    });
    let mut svc = client.layer().layer(via_router);
    let req = http::Request::get("http://c/x").body(Empty::<Bytes>::new()).expect("request");
    let resp = svc.ready().await.expect("ready").call(req).await.expect("call");
    assert_eq!(resp.headers()["rondo-view-id"], newer.to_string().as_str());
    let _ = resp.into_body().collect().await;
    tokio::time::timeout(Duration::from_secs(5), client.wait_for_view(newer))
        .await
        .expect("one reply brought the new view");
    let mut names: Vec<String> = client.members().into_iter().map(|m| m.name).collect();
    names.sort();
    assert_eq!(names, ["m1", "m2"]);
}
