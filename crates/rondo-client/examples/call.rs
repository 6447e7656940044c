//! Balances a few HTTP calls over a service's members, learned from rondo's naming service.
//!
//! ```text
//! rondo member --name m1 --listen 127.0.0.1:9001 &
//! rondo member --name m2 --listen 127.0.0.1:9002 &
//! rondo serve --config rondo.toml &     # with [naming] listen = "127.0.0.1:7070" and cluster web
//! cargo run -p rondo-client --example call -- web 127.0.0.1:7070 127.0.0.1:7071
//! ```
//!
//! Arguments: the service, then one or more naming endpoints (any of them may be down). Ten
//! calls go through the tower layer around a hyper client, then ten through the closure API;
//! each line says which member answered. Kill a member meanwhile: no call fails.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use rondo_client::{Client, Failed, SlotBody};
use tower::{Layer, Service};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut args = std::env::args().skip(1);
    let (Some(service), endpoints) = (args.next(), args.collect::<Vec<_>>()) else {
        eprintln!("usage: call SERVICE NAMING-ENDPOINT [NAMING-ENDPOINT...]");
        std::process::exit(2);
    };
    let client = Client::builder(service).endpoints(endpoints).connect().await?;
    let answer = client.answer();
    println!(
        "{} from {} (view {}): {} with {} member(s)",
        answer.service,
        client.endpoint(),
        answer.view_id,
        answer.policy.algorithm,
        answer.members.len()
    );

    // 1. The tower layer around a hyper client: the URI's authority becomes the member's.
    let http: HttpClient<_, SlotBody<Empty<Bytes>>> =
        HttpClient::builder(TokioExecutor::new()).build_http();
    let mut web = client.layer().layer(http);
    for i in 0..10 {
        let req = http::Request::get(format!("http://{}/", client.service())).body(Empty::new())?;
        let resp = web.call(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        println!("tower   #{i}: {status} {}", String::from_utf8_lossy(&body).trim());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // 2. The closure API: any protocol; say how a failed try failed.
    let plain: HttpClient<_, Empty<Bytes>> = HttpClient::builder(TokioExecutor::new()).build_http();
    for i in 0..10 {
        let answer = client
            .call(|member| {
                let plain = plain.clone();
                async move {
                    let uri = format!("http://{}/", member.addr()).parse().expect("uri");
                    let resp = plain
                        .get(uri)
                        .await
                        .map_err(|e| Failed::classify(e).map(|e| e.to_string()))?;
                    let body = resp
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| Failed::Member(e.to_string()))?;
                    Ok(format!(
                        "{} says {}",
                        member.name(),
                        String::from_utf8_lossy(&body.to_bytes()).trim()
                    ))
                }
            })
            .await;
        match answer {
            Ok(text) => println!("closure #{i}: {text}"),
            // Every option failed: the error says why (`is_*`) and lists each attempt.
            Err(e) => {
                let budget = if e.is_budget_exhausted() { " (retry budget exhausted)" } else { "" };
                println!("closure #{i}: call to {} failed{budget}", e.service());
                for attempt in e.attempts() {
                    println!("  {attempt}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
