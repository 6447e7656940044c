//! The live dashboard: one self-contained HTML page (inline CSS and JS, no external resources)
//! served at `GET /` and `GET /dashboard` without authentication, and the link that opens it
//! with the token. The page holds no data: it takes the admin token from the link's fragment
//! (`#token=...`, which browsers never send to the server) or asks for it, keeps it in
//! `sessionStorage`, polls `GET /api/v1/status` every second with it and calls the
//! drain/undrain endpoints (`X-Rondo-Operator: dashboard`).

use std::net::SocketAddr;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// The page, embedded at build time.
pub const PAGE: &str = include_str!("dashboard.html");

/// Only same-origin requests, only the inline script and styles; no framing (the page has
/// buttons that change member state).
const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; \
                   base-uri 'none'; form-action 'none'";

/// `GET /` and `GET /dashboard`, to be merged after the auth layer (they need no token).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/", get(page)).route("/dashboard", get(page))
}

/// The dashboard's address; with a token, `#token=` and the token percent-encoded (every byte
/// but RFC 3986's unreserved characters), which the page reads and removes from the address bar.
/// Without one, the page asks for it.
pub fn link(scheme: &str, addr: SocketAddr, token: Option<&[u8]>) -> String {
    let Some(token) = token else {
        return format!("{scheme}://{addr}/ (it asks for the admin token)");
    };
    let mut fragment = String::with_capacity(token.len());
    for &b in token {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            fragment.push(char::from(b));
        } else {
            fragment.push_str(&format!("%{b:02X}"));
        }
    }
    format!("{scheme}://{addr}/#token={fragment}")
}

async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        PAGE,
    )
}

#[cfg(test)]
mod tests {
    use super::{PAGE, link};

    #[test]
    fn the_link_carries_the_token_in_the_fragment_encoded() {
        let addr = "127.0.0.1:9900".parse().unwrap();
        assert_eq!(link("http", addr, Some(b"ab-1_.~")), "http://127.0.0.1:9900/#token=ab-1_.~");
        // `+`, `&`, `#`, `%`, spaces and non-ASCII bytes would be read as something else.
        assert_eq!(
            link("https", addr, Some("a+b&c#d%e f\u{e9}".as_bytes())),
            "https://127.0.0.1:9900/#token=a%2Bb%26c%23d%25e%20f%C3%A9"
        );
        assert_eq!(
            link("http", addr, None),
            "http://127.0.0.1:9900/ (it asks for the admin token)"
        );
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for bad in ["src=\"http", "href=\"http", "@import", "url(", "<link"] {
            assert!(!PAGE.contains(bad), "dashboard.html contains `{bad}`");
        }
        assert!(PAGE.contains("/api/v1/status"));
        assert!(PAGE.contains("X-Rondo-Operator"));
    }
}
