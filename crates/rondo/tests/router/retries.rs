//! Retries on a member's status (issue 38, `retry.retry_on`): a 5xx (or a listed status)
//! before any byte reached the client sends the request to another member; a request that runs
//! out of tries gets the last member's own answer; a POST is retried only with
//! `retry_non_idempotent`, and only when its body fit `retry_buffer_bytes`. On both codecs (the
//! own HTTP/1 path hands such routes to hyper's).

use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};

use super::recorder::Recorder;
use super::support::*;

fn config(members: &str, retry: &str) -> String {
    format!(
        "[[listener]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\n\n\
         [[route]]\nlistener = \"web\"\ncluster = \"c\"\n\n\
         [cluster.c]\nalgorithm = \"round-robin\"\nretry = {{ {retry} }}\nmembers = [{members}]\n"
    )
}

/// A POST of `body` to `url`: status, the answering member's name, and the body.
async fn post(url: &str, body: Vec<u8>) -> (StatusCode, String) {
    let client = client_of::<Full<bytes::Bytes>>(false);
    let req = Request::builder()
        .method(Method::POST)
        .uri(url)
        .body(Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = client.request(req).await.expect("an answer");
    let status = resp.status();
    let member = resp.headers().get("x-member").map(|v| v.to_str().unwrap().to_owned());
    let _ = resp.into_body().collect().await;
    (status, member.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_5xx_goes_to_another_member_on_both_codecs() {
    let (bad, good) = (Recorder::spawn("bad"), Recorder::spawn("good"));
    bad.answer_with(503);
    let members = format!("{}, {}", bad.entry(), good.entry());
    let r = router(&config(&members, "attempts = 2, retry_on = [\"5xx\"]")).await;
    for c in [client(), h2_client()] {
        for _ in 0..10 {
            let reply = get(&c, &r.url("web", "/")).await;
            assert_eq!(reply.status, 200, "{}", reply.body);
            assert!(reply.body.starts_with("good"), "{}", reply.body);
        }
    }
    assert!(!bad.seen().is_empty(), "round robin never tried the bad member");
    // Without retry_on, the same answers reach the client.
    let plain = router(&config(&members, "attempts = 2")).await;
    let statuses: Vec<u16> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(get(&client(), &plain.url("web", "/")).await.status.as_u16());
        }
        v
    };
    assert!(statuses.contains(&503), "{statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_tries_the_client_gets_the_last_members_own_answer() {
    let (a, b) = (Recorder::spawn("a"), Recorder::spawn("b"));
    a.answer_with(502);
    b.answer_with(502);
    let members = format!("{}, {}", a.entry(), b.entry());
    let r = router(&config(&members, "attempts = 2, retry_on = [\"gateway-error\"]")).await;
    let reply = get(&client(), &r.url("web", "/x")).await;
    assert_eq!(reply.status, 502);
    assert!(
        reply.body.starts_with('a') || reply.body.starts_with('b'),
        "the member's body: {}",
        reply.body
    );
    assert!(reply.headers.contains_key("x-member"), "the member's headers");
    assert_eq!(a.seen().len() + b.seen().len(), 2, "tried on both");
    // A status outside the list is an answer.
    a.answer_with(500);
    b.answer_with(500);
    let reply = get(&client(), &r.url("web", "/y")).await;
    assert_eq!(reply.status, 500);
    assert_eq!(a.seen().len() + b.seen().len(), 3, "not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_retried_only_when_the_cluster_says_so_and_its_body_was_kept() {
    let (bad, good) = (Recorder::spawn("bad"), Recorder::spawn("good"));
    bad.answer_with(429);
    let members = format!("{}, {}", bad.entry(), good.entry());
    let body = vec![b'p'; 1000];

    // Not idempotent, no retry_non_idempotent: the 429 is the answer.
    let r = router(&config(&members, "attempts = 2, retry_on = [\"retriable-status:429\"]")).await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(post(&r.url("web", "/p"), body.clone()).await.0.as_u16());
    }
    assert!(answers.contains(&429), "{answers:?}");

    // With it: every POST reaches the good member, whole.
    let retry = "attempts = 2, retry_on = [\"retriable-status:429\"], retry_non_idempotent = true";
    let r = router(&config(&members, retry)).await;
    let before = good.seen().len();
    for _ in 0..4 {
        assert_eq!(post(&r.url("web", "/q"), body.clone()).await, (StatusCode::OK, "good".into()));
    }
    let got: Vec<_> = good.seen().into_iter().skip(before).collect();
    assert_eq!(got.len(), 4);
    assert!(got.iter().all(|s| s.body == body), "the retried body arrived whole");

    // A body over retry_buffer_bytes is not kept, so not sent again.
    let retry = format!("{retry}, retry_buffer_bytes = \"512B\"");
    let r = router(&config(&members, &retry)).await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(post(&r.url("web", "/big"), body.clone()).await.0.as_u16());
    }
    assert!(answers.contains(&429), "{answers:?}");
}
