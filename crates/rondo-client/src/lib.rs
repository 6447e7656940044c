//! rondo's client library: balancing inside the caller.
//!
//! A [`Client`] bootstraps from two or more endpoints of rondo's naming service (any of them may
//! be down), fetches the service's full answer (members, policy, view id) and keeps it current
//! with a background task long-polling the naming service's `watch`. Every call is balanced by
//! the same pure core the router uses (`rondo-core`): the service's algorithm, granularity,
//! locality, slow start, passive outlier detection, retry attempts, per-try timeout and retry
//! budget, with this client's own view of each member's load and latency. When a member fails,
//! the call goes to the next one under the router's rules; an error reaches the caller only when
//! every option failed ([`CallError`]).
//!
//! With no [`Builder::endpoint`], the endpoints come from the `RONDO_NAMING_ENDPOINTS`
//! environment variable (`host:port,host:port`; see [`NAMING_ENDPOINTS_ENV`] and
//! [`parse_endpoints`]), as GlassFish clients took theirs from `com.sun.appserv.iiop.endpoints`.
//! A response with a newer view id (`rondo-view-id`, which routers add with a cluster's
//! `view_id_header`) makes the client refetch at once, so that [`Builder::watch`] can be
//! turned off.
//!
//! Three ways to call:
//!
//! - [`Client::call`]: a closure gets the picked member ([`Target`]) and says how a failed try
//!   failed ([`Failed`]); the client does the rest.
//! - [`Client::layer`]: a tower [`BalanceLayer`] around an HTTP service (a hyper-util client, or
//!   the transport under `tonic::client::Grpc` for gRPC), which rewrites each request's URI
//!   authority to the picked member and fails over on connect errors (and on resets for
//!   idempotent requests).
//! - [`Client::session`]: calls that stay on one member while it can keep them (GlassFish's
//!   per-context `rotating`, `least-sessions` counting sessions).
//!
//! ```no_run
//! use rondo_client::{Client, Failed};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder("web")
//!     .endpoint("10.0.0.1:7070")
//!     .endpoint("10.0.0.2:7070")
//!     .connect()
//!     .await?;
//!
//! // Any protocol: the closure gets the member's address.
//! let reply = client
//!     .call(|member| async move {
//!         let mut conn =
//!             tokio::net::TcpStream::connect(member.addr()).await.map_err(Failed::classify)?;
//!         conn.write_all(b"GET / HTTP/1.0\r\n\r\n").await.map_err(Failed::Member)?;
//!         let mut reply = String::new();
//!         conn.read_to_string(&mut reply).await.map_err(Failed::Member)?;
//!         Ok(reply)
//!     })
//!     .await?;
//! println!("{reply}");
//! # Ok(())
//! # }
//! ```
//!
//! With hyper (and the same way under tonic, with an HTTP/2-only client):
//!
//! ```no_run
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Empty};
//! use hyper_util::client::legacy::Client as HttpClient;
//! use hyper_util::rt::TokioExecutor;
//! use rondo_client::{Client, SlotBody};
//! use tower::{Layer, Service};
//!
//! # async fn run(client: Client) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let http: HttpClient<_, SlotBody<Empty<Bytes>>> =
//!     HttpClient::builder(TokioExecutor::new()).build_http();
//! let mut web = client.layer().layer(http);
//! // The authority is replaced by the picked member's address.
//! let req = http::Request::get("http://web/hello").body(Empty::<Bytes>::new())?;
//! let resp = web.call(req).await?;
//! let body = resp.into_body().collect().await?.to_bytes();
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//!
//! A [`CallError`] is opaque, in the way of hyper's errors: it answers why the call stopped
//! with `is_*` questions ([`is_no_member`](CallError::is_no_member),
//! [`is_all_failed`](CallError::is_all_failed), [`is_not_retryable`](CallError::is_not_retryable),
//! [`is_fatal`](CallError::is_fatal), [`is_budget_exhausted`](CallError::is_budget_exhausted),
//! [`is_deadline`](CallError::is_deadline)), names the [`service`](CallError::service) and
//! lists every try in order ([`attempts`](CallError::attempts): each [`Attempt`]'s member,
//! address and [`AttemptError`]). The tower layer's error is a [`BoxError`] holding a
//! [`BalancedError`] (downcast it to ask the same questions).
//!
//! ```
//! # fn show(err: rondo_client::CallError<std::io::Error>) {
//! if err.is_budget_exhausted() {
//!     eprintln!("{}: backing off", err.service());
//! }
//! for attempt in err.attempts() {
//!     eprintln!("{} failed: {}", attempt.member().unwrap_or("(no member)"), attempt.error());
//! }
//! # }
//! ```
//!
//! # How it is built
//!
//! The public facade (`client/`: [`Builder`], [`Client`], [`Session`]) hands each call to the
//! call internals (`call/`: the pick under one lock hold with the retry budget, the member's
//! request as a ticket, and the call loop, one hand-written future driving `rondo-core`'s
//! failover engine, the same as the router's), which work on the state every clone shares
//! (`inner.rs`) and the pure balancing state (`state.rs`). The tower layer (`tower/`) is built
//! on the facade and the call loop, laid out like tower's own middleware (layer, service,
//! future, body, error); a background task keeps the answer current (`watch.rs`, over
//! `naming.rs`). No module imports one above it.

#![warn(missing_docs)]

mod call;
mod client;
mod clock;
mod env;
mod error;
mod inner;
mod naming;
mod state;
mod tls;
mod tower;
mod watch;

pub use client::{Builder, CallOptions, Client, Session, Target};
pub use env::{NAMING_ENDPOINTS_ENV, endpoints_from_env, parse_endpoints};
pub use error::{Attempt, AttemptError, Attempts, BootstrapError, CallError, Failed, NamingError};
pub use naming::NamingClient;
pub use state::cluster_spec;
#[doc(hidden)]
pub use state::{Replay, ReplayRefusal};
pub use tls::{HttpsConnector, MaybeTls, TlsConfig, TlsConfigError, crypto_provider};
pub use tower::{
    BalanceLayer, Balanced, BalancedError, BoxError, HttpError, ResponseFuture, SlotBody, Tracked,
};

/// The naming service's wire format (re-exported from `rondo-core`).
pub use rondo_core::wire;
