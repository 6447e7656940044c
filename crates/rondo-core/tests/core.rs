//! Integration tests of the pure core: one test binary, one module per concern.

mod core {
    pub(crate) mod support;

    mod adaptive;
    mod eligibility;
    mod failover;
    mod hashing;
    mod load_aware;
    mod orderly;
    mod routes;
    mod shadow;
    mod state;
}
