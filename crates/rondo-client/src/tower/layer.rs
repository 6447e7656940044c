//! [`BalanceLayer`]: the tower [`Layer`] that wraps an HTTP service into a [`Balanced`] one,
//! and the facade's ways to get it, [`Client::layer`] and [`Session::layer`] (defined here so
//! that the facade does not depend on the tower layer).

use std::sync::Arc;

use tower::Layer;

use super::service::Balanced;
use crate::client::{Client, Session};
use crate::inner::SessionCell;

/// Wraps an HTTP service into a [`Balanced`] one; from [`Client::layer`] (per request, or per
/// session when the policy's granularity is `session`) or [`Session::layer`] (every request in
/// that session).
#[derive(Debug, Clone)]
pub struct BalanceLayer {
    client: Client,
    session: Option<Arc<SessionCell>>,
}

impl<S> Layer<S> for BalanceLayer {
    type Service = Balanced<S>;

    fn layer(&self, inner: S) -> Balanced<S> {
        Balanced::with(self.client.clone(), self.session.clone(), inner)
    }
}

impl Client {
    /// A tower layer balancing HTTP requests (hyper, tonic) over the service's members; see
    /// [`BalanceLayer`].
    pub fn layer(&self) -> BalanceLayer {
        BalanceLayer { client: self.clone(), session: None }
    }
}

impl Session {
    /// A tower layer whose requests all belong to this session.
    pub fn layer(&self) -> BalanceLayer {
        BalanceLayer { client: self.client.clone(), session: Some(self.cell.clone()) }
    }
}
