//! `login` (a route's sign-on, SGD's): a member of a login route signs a user on by naming
//! them in its response's `x-rondo-login`; the response phase turns that into the tier
//! session's cookie ([`cookie`]). The field itself never reaches the client, on any route:
//! both codecs drop it (hyper's through [`on_response`], the own path as it writes the head).

use http::{HeaderMap, HeaderValue};
use rondo_core::Route;

use super::Applied;
use crate::auth::LOGIN_HEADER;
use crate::http::HttpCtx;

/// The session cookie for the subject a member vouched for (`vouched`, the value of its
/// `x-rondo-login`), when the request's chain has the route's `login` (`login`, from
/// [`Applied::login`]).
pub(crate) fn cookie(
    login: bool,
    ctx: &HttpCtx,
    route: &Route,
    status: u16,
    vouched: &[u8],
) -> Option<HeaderValue> {
    if !login {
        tracing::debug!(route = %route.name, "x-rondo-login from a member of a route without login: dropped");
        return None;
    }
    let (tier, secure) = (ctx.live.tier_key(), ctx.listener.tls.is_some());
    let now = std::time::SystemTime::now();
    crate::auth::login_cookie(route, status, vouched, tier.as_deref(), secure, now)
}

/// hyper's response phase for `login`: the member's `x-rondo-login` removed from the head, and
/// the session cookie [`cookie`] makes of it added.
pub(crate) fn on_response(
    applied: Option<&Applied>,
    ctx: &HttpCtx,
    route: &Route,
    status: u16,
    headers: &mut HeaderMap,
) {
    let Some(vouched) = headers.remove(LOGIN_HEADER) else { return };
    let login = applied.is_some_and(|a| a.login);
    if let Some(v) = cookie(login, ctx, route, status, vouched.as_bytes()) {
        headers.append(http::header::SET_COOKIE, v);
    }
}
