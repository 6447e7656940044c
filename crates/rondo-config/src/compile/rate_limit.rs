//! The `rate_limit` filter's options: its key, its rate (`N/s`, `N/m`, `N/h`), its burst and
//! how many buckets it keeps, and whether the tier's routers share it (`scope`).

use rondo_core::bucket::Rate;
use rondo_core::traffic::{LimitKey, RateLimit};

use super::{Compiler, is_token};
use crate::path::FieldPath;
use crate::raw::RawRateLimit;

/// Most buckets one filter may keep.
const MAX_KEYS: u64 = 10_000_000;

/// Compiles a `rate_limit`; `None` (with an error) when its rate or key is unusable.
pub(super) fn rate_limit(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRateLimit,
) -> Option<RateLimit> {
    let key = match r.key.as_deref().unwrap_or("client_ip") {
        "client_ip" => Some(LimitKey::ClientIp),
        "identity" => Some(LimitKey::Identity),
        "route" => Some(LimitKey::Route),
        other => match other.strip_prefix("header:") {
            Some(name) if is_token(name) => Some(LimitKey::Header(name.to_ascii_lowercase())),
            Some(name) => {
                c.err(path.key("key"), format!("`{name}` is not a valid header name"));
                None
            }
            None => {
                c.err(
                    path.key("key"),
                    format!(
                        "unknown key `{other}`, expected `client_ip`, `header:NAME`, \
                         `identity` or `route`"
                    ),
                );
                None
            }
        },
    };
    let rate = match r.rate.as_deref() {
        Some(text) => Rate::parse(text).map_err(|e| c.err(path.key("rate"), e)).ok(),
        None => {
            c.err(path.clone(), "a rate_limit needs `rate` (`N/s`, `N/m` or `N/h`)");
            None
        }
    };
    let tier = match r.scope.as_deref() {
        None | Some("router") => false,
        Some("tier") => true,
        Some(other) => {
            let expected = "expected `router` or `tier`";
            c.err(path.key("scope"), format!("unknown scope `{other}`, {expected}"));
            false
        }
    };
    let max_keys =
        c.int(path.key("max_keys"), r.max_keys, RateLimit::DEFAULT_MAX_KEYS, 1, MAX_KEYS);
    let rate = rate?;
    let burst = c.int(path.key("burst"), r.burst, rate.per_second(), 1, Rate::MAX_COUNT);
    Some(RateLimit { key: key?, rate, burst, max_keys, tier })
}
