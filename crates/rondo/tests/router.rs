//! Integration tests of the router: real sockets on 127.0.0.1, real members (in-process servers
//! or `rondo member` processes), the router started from a configuration text.

mod common;

mod router {
    pub(crate) mod recorder;
    pub(crate) mod support;

    mod balancing;
    pub(crate) mod breakers;
    mod conn_breakers;
    mod connect_timeout;
    mod desync;
    mod errors;
    mod filters;
    pub(crate) mod grpc;
    mod grpc_web;
    mod h1_smuggling;
    mod h1path;
    mod h2_rapid_reset;
    mod hardening;
    pub(crate) mod hardening_h2;
    mod hedging;
    mod limits;
    mod multicast;
    mod protocols;
    mod proxy_members;
    pub(crate) mod proxy_protocol;
    mod rebalance;
    mod retries;
    mod serve;
    mod session_replay;
    pub(crate) mod traffic;
    mod traffic_compress;
    mod traffic_cors;
    mod traffic_fault;
    mod traffic_mirror;
    mod traffic_rate_limit;
    mod traffic_soap;
    pub(crate) mod traffic_split;
}
