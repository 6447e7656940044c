//! [`NamingClient`]: the naming service's HTTP API at one endpoint (full answer, lookup, watch,
//! register, keepalive, deregister), speaking `rondo_core::wire`. [`crate::Client`] uses it to
//! bootstrap and to keep its answer current; members can use it to register themselves.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rondo_core::wire::{self, Answer, Lease, Lookup, Register, Watch};
use serde::de::DeserializeOwned;

use crate::error::NamingError;
use crate::tls::{HttpsConnector, TlsConfig};

/// Largest naming response body read.
const MAX_BODY: usize = 16 << 20;

/// The naming API of one endpoint.
#[derive(Debug, Clone)]
pub struct NamingClient {
    base: String,
    http: Http,
    timeout: Duration,
}

/// The HTTP client of an endpoint: plain, or TLS for `https://` endpoints.
#[derive(Debug, Clone)]
enum Http {
    Plain(HttpClient<HttpConnector, Full<Bytes>>),
    Tls(HttpClient<HttpsConnector, Full<Bytes>>),
}

impl NamingClient {
    /// A client for `endpoint` (`host:port` or `http://host:port`) whose requests (other than
    /// [`NamingClient::watch`], which waits longer by design) time out after `timeout`.
    pub fn new(endpoint: &str, timeout: Duration) -> Option<NamingClient> {
        Self::with_tls(endpoint, timeout, None)
    }

    /// [`NamingClient::new`] that also takes `https://host:port` endpoints, reached with `tls`
    /// (`None` when `tls` is).
    pub fn with_tls(
        endpoint: &str,
        timeout: Duration,
        tls: Option<&TlsConfig>,
    ) -> Option<NamingClient> {
        let base = endpoint.trim().trim_end_matches('/');
        let (base, https) = match (base.strip_prefix("http://"), base.strip_prefix("https://")) {
            (Some(rest), _) => (rest, false),
            (None, Some(rest)) => (rest, true),
            (None, None) if base.contains("://") => return None,
            (None, None) => (base, false),
        };
        let authority: http::uri::Authority = base.parse().ok()?;
        authority.port_u16()?;
        let builder = {
            let mut b = HttpClient::builder(TokioExecutor::new());
            b.pool_idle_timeout(Duration::from_secs(30));
            b
        };
        let (http, scheme) = if https {
            let mut connector = tls?.clone().alpn(&[b"http/1.1"]).connector();
            connector.set_connect_timeout(Some(timeout));
            (Http::Tls(builder.build(connector)), "https")
        } else {
            let mut connector = HttpConnector::new();
            connector.set_connect_timeout(Some(timeout));
            connector.set_nodelay(true);
            (Http::Plain(builder.build(connector)), "http")
        };
        Some(NamingClient { base: format!("{scheme}://{authority}"), http, timeout })
    }

    /// The endpoint, as `http://host:port` or `https://host:port`.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    /// `GET /v1/services/{service}`: the members that may take work, the policy, the view id.
    pub async fn answer(&self, service: &str) -> Result<Answer, NamingError> {
        let path = format!("/v1/services/{}", encode(service));
        self.json(Method::GET, &path, None, self.timeout).await
    }

    /// `GET /v1/services/{service}` as JSON, with the fields a naming hierarchy adds beside the
    /// [`Answer`]'s (`level`, `answered_by`, `stale`): a naming service relaying its parent's
    /// answers reads them here.
    pub async fn answer_json(&self, service: &str) -> Result<serde_json::Value, NamingError> {
        let path = format!("/v1/services/{}", encode(service));
        self.json(Method::GET, &path, None, self.timeout).await
    }

    /// `GET /v1/lookup/{service}?key=K&group=G`: one member picked by the service's policy.
    pub async fn lookup(
        &self,
        service: &str,
        key: Option<&str>,
        group: Option<&str>,
    ) -> Result<Lookup, NamingError> {
        let mut path = format!("/v1/lookup/{}", encode(service));
        let mut sep = '?';
        for (name, value) in [("key", key), ("group", group)] {
            if let Some(v) = value {
                path.push(sep);
                path.push_str(name);
                path.push('=');
                path.push_str(&encode(v));
                sep = '&';
            }
        }
        self.json(Method::GET, &path, None, self.timeout).await
    }

    /// `GET /v1/watch?after=N&timeout_ms=T`: returns once the view id passes `after`, or after
    /// `wait` with `changed == false`.
    pub async fn watch(&self, after: u64, wait: Duration) -> Result<Watch, NamingError> {
        let path = format!("/v1/watch?after={after}&timeout_ms={}", wait.as_millis());
        self.json(Method::GET, &path, None, wait + self.timeout).await
    }

    /// `PUT /v1/services/{service}/members/{member}`: registers a member with a lease.
    pub async fn register(
        &self,
        service: &str,
        member: &str,
        registration: &Register,
    ) -> Result<Lease, NamingError> {
        let path = format!("/v1/services/{}/members/{}", encode(service), encode(member));
        let body = serde_json::to_vec(registration).map_err(|e| self.error(e.to_string(), None))?;
        self.json(Method::PUT, &path, Some(body), self.timeout).await
    }

    /// [`NamingClient::register`] declaring the service's `policy` (the fields of a
    /// `[cluster.NAME]` table, e.g. `{"algorithm": "hash", "hash": {"key": "header:x-user"}}`):
    /// with `[naming] allow_registered_clusters` the first registration creates the service
    /// with it, later ones must declare the same (409 naming the field) or none; a configured
    /// service keeps its own.
    pub async fn register_declaring(
        &self,
        service: &str,
        member: &str,
        registration: &Register,
        policy: &serde_json::Value,
    ) -> Result<Lease, NamingError> {
        let path = format!("/v1/services/{}/members/{}", encode(service), encode(member));
        let mut body =
            serde_json::to_value(registration).map_err(|e| self.error(e.to_string(), None))?;
        if let serde_json::Value::Object(fields) = &mut body {
            fields.insert("policy".to_owned(), policy.clone());
        }
        let body = serde_json::to_vec(&body).map_err(|e| self.error(e.to_string(), None))?;
        self.json(Method::PUT, &path, Some(body), self.timeout).await
    }

    /// `POST /v1/leases/{lease}/keepalive`: renews a lease.
    pub async fn keepalive(&self, lease: &str) -> Result<Lease, NamingError> {
        let path = format!("/v1/leases/{}/keepalive", encode(lease));
        self.json(Method::POST, &path, None, self.timeout).await
    }

    /// `DELETE /v1/services/{service}/members/{member}`: removes a registration.
    pub async fn deregister(&self, service: &str, member: &str) -> Result<(), NamingError> {
        let path = format!("/v1/services/{}/members/{}", encode(service), encode(member));
        self.send(Method::DELETE, &path, None, self.timeout).await.map(drop)
    }

    fn error(&self, what: String, status: Option<u16>) -> NamingError {
        NamingError { endpoint: self.base.clone(), what, status }
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<T, NamingError> {
        let bytes = self.send(method, path, body, timeout).await?;
        serde_json::from_slice(&bytes)
            .map_err(|e| self.error(format!("{path}: bad answer: {e}"), None))
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Bytes, NamingError> {
        let mut req = Request::builder().method(method).uri(format!("{}{path}", self.base));
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.error(e.to_string(), None))?;
        let exchange = async {
            let resp = match &self.http {
                Http::Plain(c) => c.request(req).await,
                Http::Tls(c) => c.request(req).await,
            };
            let resp = resp.map_err(|e| self.error(chain(&e), None))?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| self.error(format!("{path}: reading the answer: {e}"), None))?
                .to_bytes();
            Ok::<_, NamingError>((status, body))
        };
        let (status, body) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| self.error(format!("{path}: no answer within {timeout:?}"), None))??;
        if status.is_success() {
            return Ok(body);
        }
        let what = serde_json::from_slice::<wire::Error>(&body)
            .map(|e| e.error)
            .unwrap_or_else(|_| String::from_utf8_lossy(&body).trim().to_owned());
        let status_text = status.canonical_reason().unwrap_or("");
        Err(self.error(
            format!("{path}: {} {status_text}: {what}", status.as_u16()),
            Some(status.as_u16()),
        ))
    }
}

/// Whether a naming error says the service does not exist there.
pub(crate) fn is_not_found(e: &NamingError) -> bool {
    e.status == Some(StatusCode::NOT_FOUND.as_u16())
}

/// An error with its sources, `a: b: c`.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        cur = s.source();
    }
    text
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_take_either_form() {
        let t = Duration::from_secs(1);
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let _guard = rt.enter();
        assert_eq!(
            NamingClient::new("127.0.0.1:7000", t).expect("ok").endpoint(),
            "http://127.0.0.1:7000"
        );
        assert_eq!(
            NamingClient::new("http://naming.local:80/", t).expect("ok").endpoint(),
            "http://naming.local:80"
        );
        assert!(NamingClient::new("https://x:1", t).is_none());
        assert!(NamingClient::new("no-port", t).is_none());
    }

    #[test]
    fn path_segments_are_encoded() {
        assert_eq!(encode("web-1.a_b~"), "web-1.a_b~");
        assert_eq!(encode("a/b c"), "a%2Fb%20c");
    }
}
