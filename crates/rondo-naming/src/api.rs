//! The naming HTTP API (placeholder while being written).
