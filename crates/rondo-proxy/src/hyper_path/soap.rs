//! The `soap` filter's bodies on hyper's path: a converted request's message is read whole
//! (within the filter's `max_body_bytes`) and handed to the tries in the other version, and the
//! member's response message is read whole and converted back before the client gets it
//! ([`crate::chain::soap`] does the XML). Both are bounded in size and by the route's request
//! timeout, so a slow or huge message holds nothing without bound.

use crate::client_body::ClientBody;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use rondo_core::Route;

use super::request::{Peeked, whole_body};
use crate::body::ProxyBody;
use crate::chain::Applied;
use crate::chain::soap::{self, Plan, Version};
use crate::error::Kind;
use crate::http::{Failure, HttpCtx, on_route};

/// The request's message, whole and converted to the service's version; its new length is
/// among the request's edits. A message over the limit is answered 413, one that is no SOAP
/// message of the client's version 400.
pub(super) async fn request(
    ctx: &HttpCtx,
    route: &Route,
    req: &mut Request<ClientBody>,
    read: Option<Peeked>,
    plan: Plan,
    applied: &mut Applied,
) -> Result<Peeked, Failure> {
    let limit = plan.max_body_bytes;
    let whole = whole_body(ctx, route, req, read, limit, "soap: the message").await?;
    let converted = soap::convert(&whole.bytes, plan.to).map_err(|why| {
        let detail = format!("soap: the request is no SOAP message the filter converts: {why}");
        on_route(route, Kind::BadRequest, detail)
    })?;
    applied.request.set(&header::CONTENT_LENGTH, HeaderValue::from(converted.len()));
    Ok(Peeked { bytes: Bytes::from(converted), trailers: whole.trailers, complete: true })
}

/// The member's response, its message converted back to the client's version when it is a
/// SOAP message of the service's. One that cannot be read whole in time, is over the limit or
/// cannot be converted becomes a 502 that says so (the member is charged with a failure).
pub(super) async fn response(
    resp: Response<ProxyBody>,
    plan: Plan,
    route: &Route,
) -> Response<ProxyBody> {
    let is_soap = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|ct| Version::of_content_type(ct.as_bytes()))
        == Some(plan.to);
    if !is_soap {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    // Never a body the router made: `respond` gives the member's.
    let Some((inner, mut finish)) = body.into_upstream() else {
        return Response::from_parts(parts, ProxyBody::local(Bytes::new()));
    };
    let read = Limited::new(inner, usize::try_from(plan.max_body_bytes).unwrap_or(usize::MAX));
    let collected = tokio::time::timeout(route.request_timeout, read.collect()).await;
    let converted = match collected {
        Ok(Ok(body)) => soap::convert(&body.to_bytes(), plan.to.other()),
        Ok(Err(e)) => Err(format!("the member's message could not be read whole: {e}")),
        Err(_) => Err("the member's message did not arrive in time".to_owned()),
    };
    let client = plan.to.other();
    match converted {
        Ok(bytes) => {
            let content_type =
                parts.headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
            let new_type = soap::response_content_type(content_type.unwrap_or(""), client);
            if let Ok(v) = HeaderValue::from_str(&new_type) {
                parts.headers.insert(header::CONTENT_TYPE, v);
            }
            parts.headers.remove(header::TRANSFER_ENCODING);
            parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
            let mut body = ProxyBody::local(Bytes::from(bytes));
            if let Some(f) = finish {
                body.set_finish(f);
            }
            Response::from_parts(parts, body)
        }
        Err(why) => {
            tracing::debug!(route = %route.name, error = %why, "soap response not converted");
            if let Some(f) = finish.as_mut() {
                f.failed();
            }
            let text = format!("bad gateway: soap: {why}\n");
            let mut resp = Response::new(ProxyBody::local(Bytes::from(text)));
            *resp.status_mut() = StatusCode::BAD_GATEWAY;
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; charset=utf-8"),
            );
            if let Some(f) = finish {
                resp.body_mut().set_finish(f);
            }
            resp
        }
    }
}
