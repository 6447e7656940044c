//! `grpc_web` (Envoy's `grpc_web` filter): a browser's gRPC call (`application/grpc-web`,
//! binary, or `application/grpc-web-text`, base64) goes to members as gRPC. The request phase
//! recognises the call and edits its head (`content-type` to gRPC's, `te: trailers`); the
//! bodies are hyper's path's (`hyper_path/grpc_web.rs`): a text body decoded, and the member's
//! answer sent back with its trailers as the body's last frame, base64 again for text calls.
//! A request that is no gRPC-Web call passes untouched.

use http::{HeaderName, HeaderValue, header};
use rondo_core::traffic::GrpcWeb;

use super::Applied;
use crate::head::Headers;

/// How a gRPC-Web call's bodies are translated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The call is `grpc-web-text`: its bodies are base64.
    pub(crate) text: bool,
    /// The message format the client named (`+proto`, `+json`), kept on the way back.
    suffix: Suffix,
    /// The largest text request body decoded.
    pub(crate) max_body_bytes: u64,
}

/// A content type's message format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suffix {
    None,
    Proto,
    Json,
}

impl Plan {
    /// The `content-type` the client gets.
    pub(crate) fn client_type(&self) -> HeaderValue {
        HeaderValue::from_static(match (self.text, self.suffix) {
            (false, Suffix::None) => "application/grpc-web",
            (false, Suffix::Proto) => "application/grpc-web+proto",
            (false, Suffix::Json) => "application/grpc-web+json",
            (true, Suffix::None) => "application/grpc-web-text",
            (true, Suffix::Proto) => "application/grpc-web-text+proto",
            (true, Suffix::Json) => "application/grpc-web-text+json",
        })
    }

    /// The `content-type` members get.
    fn member_type(&self) -> HeaderValue {
        HeaderValue::from_static(match self.suffix {
            Suffix::None => "application/grpc",
            Suffix::Proto => "application/grpc+proto",
            Suffix::Json => "application/grpc+json",
        })
    }
}

/// The plan for a request with this `content-type`: `None` when it is no gRPC-Web call.
pub(crate) fn plan_of(content_type: &[u8], max_body_bytes: u64) -> Option<Plan> {
    let essence = content_type.split(|b| *b == b';').next().unwrap_or_default().trim_ascii();
    let lower = essence.to_ascii_lowercase();
    let rest = lower.strip_prefix(b"application/grpc-web")?;
    let (text, rest) = match rest.strip_prefix(b"-text") {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let suffix = match rest {
        b"" => Suffix::None,
        b"+proto" => Suffix::Proto,
        b"+json" => Suffix::Json,
        _ => return None,
    };
    Some(Plan { text, suffix, max_body_bytes })
}

/// The request phase: a gRPC-Web call gets gRPC's head towards members.
pub(super) fn request(spec: &GrpcWeb, headers: &impl Headers, applied: &mut Applied) {
    let content_type = headers.get(header::CONTENT_TYPE.as_str()).unwrap_or_default();
    let Some(plan) = plan_of(content_type, spec.max_body_bytes) else { return };
    applied.request.set(&header::CONTENT_TYPE, plan.member_type());
    // gRPC servers want it; the hop-by-hop strip ran before the filters' edits apply.
    applied.request.set(&header::TE, HeaderValue::from_static("trailers"));
    // Browsers' gRPC-Web library marks its calls; members speak plain gRPC.
    applied.request.remove(&HeaderName::from_static("x-grpc-web"));
    applied.grpc_web = Some(plan);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_are_recognised_with_their_format_and_parameters() {
        let p = plan_of(b"application/grpc-web-text", 9).unwrap();
        assert!(p.text);
        assert_eq!(p.client_type(), "application/grpc-web-text");
        assert_eq!(p.member_type(), "application/grpc");
        let p = plan_of(b"Application/gRPC-Web+proto; charset=utf-8", 9).unwrap();
        assert!(!p.text);
        assert_eq!(p.client_type(), "application/grpc-web+proto");
        assert_eq!(p.member_type(), "application/grpc+proto");
        assert!(plan_of(b"application/grpc", 9).is_none());
        assert!(plan_of(b"application/grpc-web+thrift", 9).is_none());
        assert!(plan_of(b"application/grpc-webx", 9).is_none());
        assert!(plan_of(b"text/plain", 9).is_none());
    }
}
