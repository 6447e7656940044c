//! The `soap` filter with real clients: curl sends SOAP 1.1 (`text/xml`, `SOAPAction`) over
//! HTTP/1.1 and h2c to a route whose service speaks only SOAP 1.2; the service checks what it
//! got and answers 1.2 (a result, or a fault); the client gets 1.1 back.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use super::support::router;

const SOAP11: &str = "http://schemas.xmlsoap.org/soap/envelope/";
const SOAP12: &str = "http://www.w3.org/2003/05/soap-envelope";

/// A SOAP 1.2-only service: anything but `application/soap+xml` with an `action` parameter and
/// a 1.2 envelope is answered 415 naming what was wrong; `Add` is answered with a result, any
/// other operation with a 1.2 fault (500).
async fn soap12_service(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let ct = req.headers().get("content-type").map(|v| v.to_str().unwrap_or("").to_owned());
    let has_soap_action = req.headers().contains_key("soapaction");
    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body = String::from_utf8_lossy(&body).into_owned();
    let ct = ct.unwrap_or_default();
    let wrong = if !ct.starts_with("application/soap+xml") {
        Some(format!("content-type {ct}"))
    } else if !ct.contains("action=\"urn:calc/Add\"") {
        Some(format!("no action in {ct}"))
    } else if has_soap_action {
        Some("a SOAPAction field".to_owned())
    } else if !body.contains(SOAP12) || body.contains(SOAP11) {
        Some(format!("not a 1.2 envelope: {body}"))
    } else {
        None
    };
    let resp = |status: StatusCode, text: String| {
        let mut r = Response::new(Full::new(Bytes::from(text)));
        *r.status_mut() = status;
        r.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/soap+xml; charset=utf-8"),
        );
        r
    };
    Ok(match wrong {
        Some(why) => {
            let mut r = resp(StatusCode::UNSUPPORTED_MEDIA_TYPE, why);
            r.headers_mut().insert("content-type", http::HeaderValue::from_static("text/plain"));
            r
        }
        None if body.contains("<m:Add") => resp(
            StatusCode::OK,
            format!(
                r#"<e:Envelope xmlns:e="{SOAP12}"><e:Body><m:AddResult xmlns:m="urn:calc">3</m:AddResult></e:Body></e:Envelope>"#
            ),
        ),
        None => resp(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                r#"<e:Envelope xmlns:e="{SOAP12}"><e:Body><e:Fault><e:Code><e:Value>e:Sender</e:Value></e:Code><e:Reason><e:Text xml:lang="en">unknown operation</e:Text></e:Reason></e:Fault></e:Body></e:Envelope>"#
            ),
        ),
    })
}

async fn service() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = service_fn(soap12_service);
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// curl POSTs a SOAP 1.1 message: the status, content type and body it got.
fn post11(h2: bool, url: &str, operation: &str) -> (u16, String, String) {
    let body = format!(
        r#"<s:Envelope xmlns:s="{SOAP11}"><s:Body><m:{operation} xmlns:m="urn:calc"><a>1</a><b>2</b></m:{operation}></s:Body></s:Envelope>"#
    );
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code} %{content_type}"])
        .arg(if h2 { "--http2-prior-knowledge" } else { "--http1.1" })
        .args(["-H", "content-type: text/xml; charset=utf-8", "-H", "SOAPAction: \"urn:calc/Add\""])
        .args(["--data-binary", &body, url])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').expect("curl's trailer line");
    let (status, ct) = tail.split_once(' ').unwrap_or((tail, ""));
    (status.parse().unwrap_or(0), ct.to_owned(), body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soap_11_client_reaches_a_soap_12_service_and_gets_11_back() {
    let svc = service().await;
    let config = format!(
        r#"[[listener]]
name = "web"
listen = "127.0.0.1:0"

[[route]]
listener = "web"
cluster = "calc"
filters = [ {{ soap = {{ to = "1.2" }} }} ]

[cluster.calc]
members = [ {{ name = "svc", address = "{svc}" }} ]
"#
    );
    let r = router(&config).await;
    let url = format!("http://127.0.0.1:{}/calc", r.addr("web").port());
    for h2 in [false, true] {
        let u = url.clone();
        let (status, ct, body) =
            tokio::task::spawn_blocking(move || post11(h2, &u, "Add")).await.unwrap();
        assert_eq!(status, 200, "h2={h2}: {body}");
        assert_eq!(ct, "text/xml; charset=utf-8", "h2={h2}");
        assert!(body.contains(SOAP11) && !body.contains(SOAP12), "h2={h2}: {body}");
        assert!(body.contains(r#"<m:AddResult xmlns:m="urn:calc">3</m:AddResult>"#), "{body}");
        // A 1.2 fault reaches the 1.1 client as a 1.1 fault.
        let u = url.clone();
        let (status, _, body) =
            tokio::task::spawn_blocking(move || post11(h2, &u, "Divide")).await.unwrap();
        assert_eq!(status, 500, "h2={h2}: {body}");
        assert!(
            body.contains(
                "<faultcode>e:Client</faultcode><faultstring>unknown operation</faultstring>"
            ),
            "h2={h2}: {body}"
        );
    }
    // What is not SOAP 1.1 passes untouched (the service refuses it, and says why).
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-H", "content-type: application/json"])
        .args(["--data-binary", "{}", &url])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("content-type application/json"));
    // A 1.1 content type around something that is no envelope is the client's error.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"])
        .args(["-H", "content-type: text/xml", "--data-binary", "<nope>", &url])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "400");
}
