//! The naming service's seed rows (issue 37, items 4 to 7) against real processes: the
//! endpoint list from `RONDO_NAMING_ENDPOINTS` (client library, `rondo ctl`, `rondo agent`),
//! redirect lookups and the `redirect_to_member` filter, the view id on proxied replies, and a
//! three-level naming hierarchy.

mod common;

mod naming_tier {
    pub(crate) mod support;

    mod client_env;
    mod env;
    mod hierarchy;
    mod redirect;
    mod view_id;
}
