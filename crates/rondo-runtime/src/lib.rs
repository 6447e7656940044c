//! rondo's live state, shared by the router, the naming service and (later) the admin API:
//! the current view and one balancer per cluster ([`live`]), the clock mapping ([`clock`]),
//! active probes that feed health and the response-time table ([`probe`]), and live
//! reconfiguration from the config file ([`reload`]: file watcher, SIGHUP), and the Prometheus
//! metrics ([`metrics`]: counted on the request path, state read at scrape time; the process's
//! own figures from `/proc/self` in [`process`]), and what the HTTP APIs share: bearer tokens
//! ([`secret`]) and the `Host` check against DNS rebinding ([`host`]).
//!
//! This crate is where time and randomness enter: it reads the clock and seeds generators, then
//! calls the pure `rondo-core` with them as arguments.

pub mod clock;
pub mod defaults;
pub mod dns_members;
pub mod host;
pub mod http_api;
pub mod live;
pub mod metrics;
pub mod pools;
pub mod probe;
mod probe_h2;
mod probe_udp;
pub mod process;
pub mod queues;
pub mod reject;
pub mod reload;
pub mod revoke;
pub mod secret;
pub mod sockets;
pub mod tier_key;
pub mod tier_load;
pub mod tls;

pub use live::{ClusterRt, Live, Placed, Refused, Registrations, Snapshot, Views, WeakViews};
pub use reload::Reloader;
pub use tier_key::TierKeys;
