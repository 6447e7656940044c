//! The live dashboard: one self-contained HTML page (inline CSS and JS, no external resources)
//! served at `GET /` and `GET /dashboard` without authentication. The page holds no data: it
//! asks for the admin token, keeps it in `sessionStorage`, polls `GET /api/v1/status` every
//! second with it and calls the drain/undrain endpoints (`X-Rondo-Operator: dashboard`).

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
    use super::PAGE;

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for bad in ["src=\"http", "href=\"http", "@import", "url(", "<link"] {
            assert!(!PAGE.contains(bad), "dashboard.html contains `{bad}`");
        }
        assert!(PAGE.contains("/api/v1/status"));
        assert!(PAGE.contains("X-Rondo-Operator"));
    }
}
