//! Tracing in a build without the `otel` cargo feature: the same names as `otel/mod.rs`, with
//! no values. A listener's tracer is then always `None` (a configuration with `[tracing]` is
//! refused before anything starts), and the forward stage's tracing code folds away.

use std::net::SocketAddr;

use http::HeaderValue;
use rondo_core::{MemberSpec, Route};

use crate::error::Kind;
use crate::head::Headers;

/// No tracer can be made without the `otel` feature.
#[derive(Debug)]
pub enum Tracer {}

impl Tracer {
    pub(crate) fn request(
        &self,
        _: &impl Headers,
        _: About<'_>,
        _: &Route,
        _: SocketAddr,
    ) -> ReqTrace {
        match *self {}
    }
}

/// No tracer: `[tracing]` needs the `otel` feature (`rondo check` says so first).
pub fn tracer(
    spec: Option<&rondo_config::TracingSpec>,
    _: &std::sync::Arc<rondo_runtime::metrics::Metrics>,
) -> Result<Option<std::sync::Arc<Tracer>>, String> {
    match spec {
        None => Ok(None),
        Some(_) => Err("tracing needs a rondo built with the `otel` cargo feature".to_owned()),
    }
}

/// What the server span says about a request besides its headers.
#[derive(Debug, Clone, Copy)]
#[allow(dead_code, reason = "read by the `otel` feature's tracer only")]
pub(crate) struct About<'a> {
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) host: Option<&'a str>,
    /// The request's `traceparent` is the router's own (`request_id` started it), not a parent.
    pub(crate) own_parent: bool,
}

/// A traced request (none without the feature).
#[derive(Debug)]
pub(crate) enum ReqTrace {}

impl ReqTrace {
    pub(crate) fn try_begins(&mut self, _: &str, _: &MemberSpec, _: u32) -> Option<HeaderValue> {
        match *self {}
    }

    pub(crate) fn hedge_begins(&mut self, _: &str, _: &MemberSpec) -> Option<HeaderValue> {
        match *self {}
    }

    pub(crate) fn hedges_end(&mut self, _: usize) {
        match *self {}
    }

    pub(crate) fn try_answered(&mut self, _: Option<u16>) {
        match *self {}
    }

    pub(crate) fn try_failed(&mut self, _: Kind) {
        match *self {}
    }

    pub(crate) fn end(self, _: Option<u16>, _: Option<Kind>) {
        match self {}
    }
}
