//! Benchmark tools for rondo. `rondo-loadgen` (the binary) drives the loopback benchmark in
//! `bench/run.sh`:
//!
//! - [`rate`]: an open-loop generator. A pacer thread releases requests at fixed intervals;
//!   keep-alive connections take them in order; latency runs from the moment a request was
//!   released, so a slow response delays the requests queued behind it *and is charged for
//!   it* (no coordinated omission).
//! - [`hold`]: opens many keep-alive connections, does one request on each and holds them open
//!   so the proxy's memory can be read while they are held.
//! - [`tls`]: full TLS handshakes per second (no resumption) and idle TLS connections held
//!   open, for `bench/run.sh --tls`.
//! - [`h3load`] (feature `http3`, binary `rondo-h3load`): closed-loop HTTP/3 requests over
//!   quinn and h3, for `bench/h3.sh`.
//!
//! Everything is bounded: request counts, durations, per-request timeouts and reconnects.
//!
//! A second binary, `rondo-overhead` (`bench/overhead.sh`), measures the PKUAS overhead table:
//! call latency over loopback direct, with a per-lookup pick from the naming service, and with
//! the client library picking every call (see `docs/benchmarks.md`).

pub mod client;
#[cfg(feature = "http3")]
pub mod h3load;
pub mod hold;
pub mod rate;
pub mod stats;
pub mod tls;
