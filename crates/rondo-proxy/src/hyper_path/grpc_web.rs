//! The `grpc_web` filter's bodies on hyper's path ([`crate::chain::grpc_web`] recognises the
//! call and edits its head). A `grpc-web-text` request's base64 body is decoded whole (within
//! the filter's `max_body_bytes`: gRPC-Web has no client streaming, so a request is one
//! message) before it is sent; a binary one streams as it is, its framing being gRPC's. The
//! member's answer streams back reframed ([`Web`]): data frames as they come (base64 for
//! text calls, in groups of three bytes so that only the end is padded), and the trailers as
//! one last frame (flag `0x80`, `name:value\r\n` lines), since a browser cannot read HTTP
//! trailers. A trailers-only answer keeps its status in the head, where gRPC-Web clients read it.

use crate::client_body::ClientBody;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response, header};
use rondo_core::Route;

use super::request::{Peeked, whole_body};
use crate::body::{ProxyBody, Reframe};
use crate::chain::Applied;
use crate::chain::grpc_web::Plan;
use crate::error::Kind;
use crate::http::{Failure, HttpCtx, on_route};

/// A text call's body, read whole and decoded; its new length is among the request's edits.
/// One over the limit is answered 413, one that is no base64 400.
pub(super) async fn request(
    ctx: &HttpCtx,
    route: &Route,
    req: &mut Request<ClientBody>,
    read: Option<Peeked>,
    plan: Plan,
    applied: &mut Applied,
) -> Result<Peeked, Failure> {
    let limit = plan.max_body_bytes;
    let whole = whole_body(ctx, route, req, read, limit, "grpc_web: the request").await?;
    let decoded = decode_text(&whole.bytes).map_err(|why| {
        let detail = format!("grpc_web: the grpc-web-text body is no base64: {why}");
        on_route(route, Kind::BadRequest, detail)
    })?;
    applied.request.set(&header::CONTENT_LENGTH, HeaderValue::from(decoded.len()));
    Ok(Peeked { bytes: Bytes::from(decoded), trailers: None, complete: true })
}

/// A `grpc-web-text` body: base64, possibly several padded pieces one after the other (each
/// message encoded on its own), with any ASCII whitespace between them ignored.
fn decode_text(text: &[u8]) -> Result<Vec<u8>, base64::DecodeError> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let mut piece = Vec::with_capacity(text.len());
    for &b in text.iter().filter(|b| !b.is_ascii_whitespace()) {
        piece.push(b);
        // A piece ends with its padding, at a four-character boundary.
        if piece.len() % 4 == 0 && piece.last() == Some(&b'=') {
            STANDARD.decode_vec(&piece, &mut out)?;
            piece.clear();
        }
    }
    STANDARD.decode_vec(&piece, &mut out)?;
    Ok(out)
}

/// The `content-type` a gRPC-Web call's answers have (`None`: no gRPC-Web call).
pub(super) fn client_type(headers: &HeaderMap) -> Option<HeaderValue> {
    let content_type = headers.get(header::CONTENT_TYPE)?;
    crate::chain::grpc_web::plan_of(content_type.as_bytes(), 0).map(|p| p.client_type())
}

/// The member's answer as the gRPC-Web client reads it: its `content-type`, no length (the
/// trailers' frame adds to the body), and its body reframed by [`Web`].
pub(super) fn response(resp: Response<ProxyBody>, plan: Plan) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    parts.headers.insert(header::CONTENT_TYPE, plan.client_type());
    parts.headers.remove(header::CONTENT_LENGTH);
    let web = Web { text: plan.text, carry: BytesMut::new() };
    Response::from_parts(parts, body.reframed(Box::new(web)))
}

/// gRPC-Web's framing of a member's body: its data, then its trailers as a frame of the body.
struct Web {
    /// Base64 out (`grpc-web-text`).
    text: bool,
    /// Bytes not yet encoded (fewer than three: base64 pads only at the end).
    carry: BytesMut,
}

impl Web {
    /// `bytes` as they go out: as they are, or base64 of whole groups of three (the rest
    /// carried), or with `last`, everything carried, padded.
    fn out(&mut self, bytes: &[u8], last: bool) -> Bytes {
        if !self.text {
            return Bytes::copy_from_slice(bytes);
        }
        self.carry.extend_from_slice(bytes);
        let n = if last { self.carry.len() } else { self.carry.len() / 3 * 3 };
        let now = self.carry.split_to(n);
        Bytes::from(STANDARD.encode(&now))
    }
}

impl Reframe for Web {
    fn data(&mut self, data: &[u8]) -> Bytes {
        self.out(data, false)
    }

    fn trailers(&mut self, trailers: &HeaderMap) -> Bytes {
        self.out(&trailer_frame(trailers), true)
    }

    fn end(&mut self) -> Bytes {
        // No trailers (a trailers-only answer, or not gRPC): what is carried, padded.
        self.out(&[], true)
    }
}

/// The trailers' frame: flag `0x80`, the block's length (four bytes, big-endian), then
/// `name:value\r\n` for each field (names lower case, as HTTP/2 has them).
fn trailer_frame(trailers: &HeaderMap) -> BytesMut {
    let mut block = BytesMut::new();
    for (name, value) in trailers {
        block.put_slice(name.as_str().as_bytes());
        block.put_u8(b':');
        block.put_slice(value.as_bytes());
        block.put_slice(b"\r\n");
    }
    let mut frame = BytesMut::with_capacity(5 + block.len());
    frame.put_u8(0x80);
    frame.put_u32(u32::try_from(block.len()).unwrap_or(u32::MAX));
    frame.put_slice(&block);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_bodies_decode_in_padded_pieces_and_refuse_what_is_no_base64() {
        let one = STANDARD.encode(b"\0\0\0\0\x03abc");
        assert_eq!(decode_text(one.as_bytes()).unwrap(), b"\0\0\0\0\x03abc");
        let two = format!("{}\r\n{}", STANDARD.encode(b"ab"), STANDARD.encode(b"cde"));
        assert_eq!(decode_text(two.as_bytes()).unwrap(), b"abcde");
        assert!(decode_text(b"not base64!").is_err());
        assert_eq!(decode_text(b"").unwrap(), b"");
    }

    #[test]
    fn text_answers_are_base64_of_the_whole_stream_padded_only_at_the_end() {
        let mut web = Web { text: true, carry: BytesMut::new() };
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        let pieces = [web.data(b"ab"), web.data(b"cdefg"), web.data(b""), web.trailers(&t)];
        assert!(pieces[..3].iter().all(|p| !p.ends_with(b"=")), "{pieces:?}");
        let text: Vec<u8> = pieces.concat();
        let mut want = b"abcdefg".to_vec();
        want.extend_from_slice(&trailer_frame(&t));
        assert_eq!(STANDARD.decode(&text).unwrap(), want);
        let mut binary = Web { text: false, carry: BytesMut::new() };
        assert_eq!(binary.data(b"\0raw"), &b"\0raw"[..]);
        assert!(binary.end().is_empty());
    }

    #[test]
    fn the_trailers_frame_carries_each_field_as_a_line() {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        t.insert("grpc-message", HeaderValue::from_static("ok"));
        let f = trailer_frame(&t);
        assert_eq!(f[0], 0x80);
        let len = u32::from_be_bytes([f[1], f[2], f[3], f[4]]) as usize;
        assert_eq!(&f[5..], b"grpc-status:0\r\ngrpc-message:ok\r\n");
        assert_eq!(len, f.len() - 5);
    }
}
