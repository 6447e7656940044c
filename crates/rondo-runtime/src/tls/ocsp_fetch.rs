//! OCSP stapling for `ocsp = "fetch"`: one task per such certificate of a TLS socket asks the
//! responder its certificate names (authorityInfoAccess) over HTTP, checks the answer with
//! `rondo_config::ocsp::check_response` (the same check a response file gets), keeps it in
//! [`Staples`] and has the socket's rustls configuration rebuilt so new handshakes staple it.
//! It asks again half way to the response's `nextUpdate`; a failed fetch (responder down, an
//! answer that does not check) is counted (`rondo_tls_ocsp_fetches_total{result="failed"}`) and
//! logged, the last good response stays, and it tries again after a backoff (5 s doubling to
//! 10 min). SIGHUP fetches again at once. Every fetch is bounded in time and in the size of the
//! answer.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rondo_config::ocsp::{self, Staple};
use rondo_config::tls as ctls;
use rustls_pki_types::CertificateDer;

/// How long one fetch (connect, request, whole answer) may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read (real responses are a few KiB).
const MAX_RESPONSE: usize = 64 * 1024;
/// The first wait after a failed fetch; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(600);

/// The last good fetched responses of one TLS socket, by certificate file.
#[derive(Debug, Default)]
pub struct Staples(Mutex<HashMap<PathBuf, Staple>>);

impl Staples {
    /// The staple kept for the certificate file `cert`, when it still checks against its
    /// `chain` (a replaced certificate's old staple is not sent).
    pub fn current(&self, cert: &Path, chain: &[CertificateDer<'_>]) -> Option<Vec<u8>> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let staple = map.get(cert)?;
        let issuer = chain.get(1).map(|c| c.as_ref());
        ocsp::check_response(&staple.der, chain.first()?, issuer, now_unix()).ok().map(|s| s.der)
    }

    fn put(&self, cert: &Path, staple: Staple) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(cert.to_owned(), staple);
    }
}

pub(crate) fn now_unix() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

/// Fetches a response for the certificate file `cert` (its chain: leaf, then issuer) from the
/// responder the leaf names, and checks it.
pub async fn fetch(cert: &Path) -> Result<Staple, String> {
    let chain = ctls::read_certs(cert, "certificate")?;
    let (leaf, issuer) = match chain.as_slice() {
        [leaf, issuer, ..] => (leaf, issuer),
        _ => return Err(format!("no issuer certificate after the leaf in {}", cert.display())),
    };
    let url = ocsp::responder_url(leaf)?;
    let request = ocsp::request(leaf, issuer)?;
    let der = tokio::time::timeout(FETCH_TIMEOUT, post(&url, request))
        .await
        .map_err(|_| format!("{url}: no answer within {FETCH_TIMEOUT:?}"))??;
    ocsp::check_response(&der, leaf, Some(issuer), now_unix()).map_err(|e| format!("{url}: {e}"))
}

/// POSTs `body` as `application/ocsp-request` to the `http://` `url`; the answer's body.
async fn post(url: &str, body: Vec<u8>) -> Result<Vec<u8>, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let authority = uri.authority().ok_or_else(|| format!("{url}: no host"))?.clone();
    let port = authority.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((authority.host(), port))
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let conn = tokio::spawn(conn);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let req = http::Request::post(path)
        .header(http::header::HOST, authority.as_str())
        .header(http::header::CONTENT_TYPE, "application/ocsp-request")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("{url}: {e}"))?;
    let resp = send.send_request(req).await.map_err(|e| format!("{url}: {e}"));
    let result = match resp {
        Err(e) => Err(e),
        Ok(resp) if resp.status() != http::StatusCode::OK => {
            Err(format!("{url}: the responder answered {}", resp.status()))
        }
        Ok(resp) => Limited::new(resp.into_body(), MAX_RESPONSE)
            .collect()
            .await
            .map(|b| b.to_bytes().to_vec())
            .map_err(|e| format!("{url}: reading the answer: {e}")),
    };
    conn.abort();
    result
}

/// What a fetch loop reports to its socket.
pub(crate) trait Restaple: Send + Sync + 'static {
    /// The socket's name (logs, metrics).
    fn name(&self) -> &str;
    /// The socket's staples.
    fn staples(&self) -> &Staples;
    /// Counts a fetch.
    fn counted(&self, ok: bool);
    /// Rebuilds the socket's configuration with the staples now kept.
    fn restaple(&self);
    /// Woken to fetch again at once (SIGHUP).
    fn refetch(&self) -> &tokio::sync::Notify;
}

/// Fetches for the certificate file `cert` of `socket` until aborted.
pub(crate) async fn fetch_loop<S: Restaple>(socket: std::sync::Arc<S>, cert: PathBuf) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let wait = match fetch(&cert).await {
            Ok(staple) => {
                let now = now_unix();
                let next = ocsp::refresh_at(&staple, now);
                socket.staples().put(&cert, staple);
                socket.counted(true);
                socket.restaple();
                tracing::info!(
                    listener = %socket.name(),
                    "ocsp response for {} stapled, next fetch in {} s",
                    cert.display(),
                    next - now
                );
                backoff = FIRST_BACKOFF;
                Duration::from_secs((next - now).max(1) as u64)
            }
            Err(e) => {
                socket.counted(false);
                tracing::warn!(
                    listener = %socket.name(),
                    "ocsp fetch for {} failed, the last good response stays: {e}",
                    cert.display()
                );
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = socket.refetch().notified() => {}
        }
    }
}
