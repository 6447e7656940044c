//! Who a request is, checked below the products that act on it: the router (`rondo-proxy`) and
//! a queue listener's intake (`rondo-queue`) make the same calls, and neither depends on the
//! other for them.
//!
//! [`auth`] verifies a route's sign-on token or tier session and gives the [`auth::Identity`]
//! members are told (and signs users on for login routes); [`head`] is how a request's header
//! fields (and cookies) are read, whichever parser made them; [`names`] the field names the
//! router owns, which no client may send a member.

pub mod auth;
pub mod head;
pub mod names;
