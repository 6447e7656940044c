//! The router's clock for the core: the process-wide mapping of `rondo-clock` (shared with the
//! naming service and the client library), read from the std clock.

pub use rondo_clock::{from_std, now, to_std};
