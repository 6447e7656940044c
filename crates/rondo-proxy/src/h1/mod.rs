//! The router's own HTTP/1.1 forwarding path, for HTTP listeners, plain or TLS: heads parsed
//! in place ([`parse`]), chunked bodies followed byte by byte as they pass ([`chunked`]), member
//! connections pooled per member and buffers borrowed only while a request is in flight
//! ([`pool`]), and the stages as this path runs them in the connection's own task, the same as
//! hyper's path ([`crate::http`]): the connection loop (`conn`), the request's stages and tries
//! (`tries`), a try's exchange with a member and the response (`exchange`), the byte pumps
//! (`pump`), with bodies of known length spliced between plain sockets (`zero_copy`), and the
//! heads written (`write`).
//!
//! The path is chosen per connection: an HTTP listener's connections start here (on a TLS
//! listener, unless the client chose `h2` by ALPN); the first request this path declines (the
//! HTTP/2 preface, HTTP/1.0, a target that is not origin-form, `Upgrade`, a route whose clusters
//! speak TLS or HTTP/2 to their members) hands the connection, with every byte already read, to
//! hyper for the rest of its life. There, [`follow`] still checks chunked bodies by this
//! path's rules (hyper does not read chunk extensions).

pub mod chunked;
mod client;
pub(crate) mod conn;
mod exchange;
pub mod follow;
#[cfg(feature = "fuzzing")]
pub mod fuzz;
pub mod parse;
pub mod pool;
mod pump;
mod tries;
mod write;
mod zero_copy;
