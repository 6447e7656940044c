//! NATS JetStream backend (placeholder until written).
