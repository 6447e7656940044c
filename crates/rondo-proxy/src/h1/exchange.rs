//! One try's exchange with a member on the own path: a pooled member connection (or a new one),
//! the edited head and the request body sent ([`OwnTries::send`]), the response head read, and
//! the respond stage ([`OwnTries::respond`]): the member's answer streamed to the client with
//! its head rewritten, and the member connection given back to its pool when it can carry
//! another request.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use http::HeaderValue;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::client::{ClientStream, Next};
use super::parse::{Framing, ResponseHead};
use super::pool::{self, Idle};
use super::pump::{HeadFailure, SendError, Unsent, pump_body, pump_response, read_response_head};
use super::tries::OwnTries;
use super::write::{is, write_response_head};
use super::zero_copy::Mover;
use crate::access;
use crate::auth::LOGIN_HEADER;
use crate::body::Finish;
use crate::chain::ResponseEdits;
use crate::error::Kind;
use crate::http::Tries;

/// While a member has not answered for this long, the router watches whether the client went
/// away (a request it abandoned is ended on its member, not left counted in flight).
const WATCH_CLIENT_AFTER: Duration = Duration::from_millis(50);
/// A member connection ready for a request; `header`: the PROXY header it starts with.
async fn connect(idle: &Idle, address: &str, header: Option<Vec<u8>>) -> Result<TcpStream, Kind> {
    let target = match idle.literal {
        Some(addr) => addr,
        None => match tokio::net::lookup_host(address).await.map(|mut a| a.next()) {
            Ok(Some(addr)) => addr,
            _ => return Err(Kind::Resolve),
        },
    };
    match tokio::time::timeout(idle.connect_timeout, TcpStream::connect(target)).await {
        Ok(Ok(mut s)) => {
            let _ = s.set_nodelay(true);
            if let Some(header) = header
                && s.write_all(&header).await.is_err()
            {
                return Err(Kind::Connect);
            }
            Ok(s)
        }
        _ => Err(Kind::Connect),
    }
}

impl<'a, S: ClientStream> OwnTries<'a, S> {
    /// Sends the request to the member and reads its response head: a pooled connection when
    /// one is idle, else a new one. A pooled connection that turns out closed before any answer
    /// is replaced by a new one only for an idempotent request: whether the member got the
    /// request before it went cannot be known, and a POST must never arrive twice.
    pub(super) async fn exchange(
        &mut self,
        idle: &Idle,
        address: &str,
        started: Instant,
        waiting_client: &AtomicBool,
    ) -> Result<(TcpStream, Vec<u8>, ResponseHead, bool), Kind> {
        let mut pooled = match &idle.send_proxy {
            None => idle.take(started),
            Some((_, to)) => self.c.proxied.take(to),
        };
        if let Some(start) = self.start.as_mut() {
            start.connected(None);
        }
        // A body that came with the head is sent in the time of a write: the try's start is
        // then the start of the wait for the answer, without another clock reading.
        let sent_at_start = self.body.complete;
        loop {
            let reused = pooled.is_some();
            let mut upstream = match pooled.take() {
                Some(s) => s,
                None => {
                    // Boxed: a new connection is the rare case on keep-alive traffic, and its
                    // resolution and timer would take room in every try's future.
                    let header = idle.send_proxy.as_ref().map(|(version, _)| {
                        crate::proxy_protocol::header(*version, self.c.peer, self.c.local)
                    });
                    let opening = Instant::now();
                    let s = Box::pin(connect(idle, address, header)).await?;
                    if let Some(start) = self.start.as_mut() {
                        start.connected(Some(opening.elapsed()));
                    }
                    idle.opened(&s);
                    s
                }
            };
            match self.send(&mut upstream, waiting_client).await {
                Ok(early) => {
                    let mut rbuf = pool::take();
                    // While the member thinks, a client that closes its connection ends the try.
                    let since = if sent_at_start {
                        tokio::time::Instant::from_std(started)
                    } else {
                        tokio::time::Instant::now()
                    };
                    let watch = (!early).then_some((&self.c.stream, since + WATCH_CLIENT_AFTER));
                    let head_request = self.is_head();
                    match read_response_head(&mut upstream, &mut rbuf, head_request, watch).await {
                        Ok(head) => return Ok((upstream, rbuf, head, early)),
                        Err(failure) => {
                            pool::give(rbuf);
                            match failure {
                                HeadFailure::Stale if reused && self.may_replace() && !early => {
                                    continue;
                                }
                                HeadFailure::Stale => return Err(Kind::Reset),
                                HeadFailure::Failed(kind) => return Err(kind),
                                HeadFailure::ClientGone => {
                                    self.gone = true;
                                    self.close = true;
                                    return Err(Kind::ClientBody);
                                }
                            }
                        }
                    }
                }
                Err(SendError::Member) if reused && self.may_replace() => continue,
                Err(SendError::Member) => return Err(Kind::Reset),
                Err(SendError::Client(kind)) => return Err(kind),
            }
        }
    }

    /// How this listener's bodies move (`splice`) and where their bytes are counted.
    fn mover(&self) -> Mover<'a> {
        let ctx: &'a crate::http::HttpCtx = self.ctx;
        Mover {
            splice: ctx.listener.splice == rondo_config::Splice::Auto,
            bytes: &ctx.metrics.bodies,
        }
    }

    /// Whether a try may go again on a new connection to the same member.
    fn may_replace(&self) -> bool {
        self.idempotent && self.replayable()
    }

    /// Writes the head (and the body in the buffer), then streams the rest of the body from the
    /// client. `Ok(true)`: the member answered before the body was complete.
    async fn send(
        &mut self,
        upstream: &mut TcpStream,
        waiting_client: &AtomicBool,
    ) -> Result<bool, SendError> {
        if upstream.write_all(&self.out).await.is_err() {
            return Err(SendError::Member);
        }
        if self.body.complete {
            return Ok(false);
        }
        // Boxed: a body that did not come whole with its head is the rarer case, and the
        // pump's timer and waits would take room in every try's future.
        Box::pin(self.send_rest(upstream, waiting_client)).await
    }

    /// The rest of [`OwnTries::send`]: the body beyond what came with the head, streamed from
    /// the client.
    async fn send_rest(
        &mut self,
        upstream: &mut TcpStream,
        waiting_client: &AtomicBool,
    ) -> Result<bool, SendError> {
        if self.body.touched {
            // Another try read part of the body already (never reached: not replayable).
            return Err(SendError::Client(Kind::ClientBody));
        }
        self.body.touched = true;
        if self.head.expect_continue {
            // The client waits for this before it sends its body (RFC 9110 10.1.1).
            if self.c.stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.is_err() {
                return Err(SendError::Client(Kind::ClientBody));
            }
        }
        let start = self.head.len;
        let in_buf = &self.buf[start..start + self.body.in_buf];
        if !in_buf.is_empty() && upstream.write_all(in_buf).await.is_err() {
            return Err(SendError::Member);
        }
        let limit = (self.ctx.listener.max_body_bytes, self.ctx.listener.body_read_timeout);
        let mover = self.mover();
        let (up_read, mut up_write) = upstream.split();
        let sent = pump_body(
            &mut self.body,
            &mut self.extra,
            limit,
            &mut self.c.stream,
            &mut up_write,
            Some(up_read.as_ref()),
            waiting_client,
            mover,
        )
        .await;
        if sent.is_err() {
            self.close = true;
        }
        sent
    }

    /// Streams the member's response to the client; the member connection goes back to its
    /// pool when the response was whole and the member keeps it open. A body that broke its
    /// framing before any byte went to the client is the try's failure (`BadBody`): the client
    /// then gets the router's 502, or another member's answer, instead of nothing.
    ///
    /// An `async` block, not an `async fn`: an `async fn`'s future keeps each argument twice (as
    /// passed, and as moved into its body), and these are large.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn respond(
        &mut self,
        mut upstream: TcpStream,
        idle: &Idle,
        mut rbuf: Vec<u8>,
        rhead: ResponseHead,
        (set_cookie, login, view_id): (&[Option<HeaderValue>; 2], bool, Option<u64>),
        edits: Option<ResponseEdits<'_>>,
        finish: Finish,
    ) -> impl Future<Output = Result<Next, Kind>> {
        let mut finish = Some(finish);
        async move {
            if let Some(f) = finish.as_mut() {
                // A body still streaming (the member answered early) is counted as far as it came.
                f.received(self.body.received);
            }
            if rhead.framing == Framing::Close {
                self.close = true;
            }
            // The client's head in a buffer of its own: `self.out` keeps the request as members get
            // it, for another try should this response turn out broken before any of it went.
            let mut out = pool::take();
            // A member's `x-rondo-login` never reaches the client (`write_response_head` drops it
            // on every route); on a login route (its chain's `login` step) it becomes the tier
            // session's cookie. In a block: the login cookie and the list that borrows it would
            // otherwise keep their room through the pumps.
            {
                let login = self.route.filter(|_| login).and_then(|route| {
                    let vouched = rhead
                        .fields
                        .iter()
                        .find(|f| is(f.name.get(&rbuf), LOGIN_HEADER.as_bytes()))?;
                    let value = vouched.value.get(&rbuf);
                    crate::chain::login::cookie(true, self.ctx, route, rhead.status, value)
                });
                let [sticky, split] = set_cookie;
                let cookies = [login.as_ref(), sticky.as_ref(), split.as_ref()];
                // A draining process says so on the response in progress, and then closes; so does a
                // connection past the listener's age limit.
                self.close |=
                    self.ctx.drain.is_on() || self.c.spent(&self.ctx.listener.connections);
                let alt_svc = self.ctx.alt_svc.as_ref();
                let close = self.close;
                write_response_head(
                    &mut out,
                    &rbuf,
                    &rhead,
                    cookies,
                    edits.as_ref(),
                    (alt_svc, view_id),
                    close,
                );
            }
            let pumped = if self.body.complete {
                let mover = self.mover();
                let ends = (&mut upstream, &mut self.c.stream);
                pump_response(&rhead, &mut out, &mut rbuf, ends, &mut finish, mover).await
            } else {
                // The member answered before the body was over (a stream, an echo): both ways at
                // once. Boxed: the two pumps side by side took 1 KiB more in every request's future,
                // which is made (and copied into its box) for every request, and this case is rare.
                self.close = true;
                let both = self.pump_both(&rhead, &mut out, &mut rbuf, &mut upstream, &mut finish);
                Box::pin(both).await
            };
            pool::give(out);
            pool::give(rbuf);
            let (whole, client_ok, clean) = match pumped {
                Ok(pumped) => pumped,
                Err(Unsent(why)) => {
                    tracing::debug!(
                        error = why.0,
                        "member's response body refused before it was sent"
                    );
                    self.close |= !self.body.complete;
                    if let Some(mut f) = finish.take() {
                        f.failed();
                        // The line is the router's answer's now (written with the 502, or with
                        // the next member's response).
                        self.start = f.take_log().map(access::Pending::into_start);
                    }
                    return Err(Kind::BadBody);
                }
            };
            if !whole {
                self.close = true;
            }
            if whole && clean && rhead.reusable && self.body.complete {
                match &idle.send_proxy {
                    None => idle.give(upstream),
                    Some((_, to)) => self.c.proxied.keep(to, upstream),
                }
            } else if !whole && client_ok {
                // The member broke off mid-body.
                if let Some(f) = finish.as_mut() {
                    f.failed();
                }
            }
            drop(finish);
            Ok(if self.close || !client_ok { Next::Close } else { Next::KeepAlive })
        }
    }

    /// Streams the rest of the request body to the member and its response to the client at
    /// once, until the response ends; a client body that then fails cuts the response.
    async fn pump_both(
        &mut self,
        rhead: &ResponseHead,
        out: &mut Vec<u8>,
        rbuf: &mut Vec<u8>,
        upstream: &mut TcpStream,
        finish: &mut Option<Finish>,
    ) -> Result<(bool, bool, bool), Unsent> {
        let limit = (self.ctx.listener.max_body_bytes, self.ctx.listener.body_read_timeout);
        let never = AtomicBool::new(false);
        let mover = self.mover();
        let (mut client_read, mut client_write) = tokio::io::split(&mut self.c.stream);
        let (mut up_read, mut up_write) = upstream.split();
        let body = pump_body(
            &mut self.body,
            &mut self.extra,
            limit,
            &mut client_read,
            &mut up_write,
            None,
            &never,
            mover,
        );
        let ends = (&mut up_read, &mut client_write);
        let response = pump_response(rhead, out, rbuf, ends, finish, mover);
        tokio::pin!(body, response);
        let mut body_over = false;
        loop {
            tokio::select! {
                r = &mut response => break r,
                r = &mut body, if !body_over => {
                    body_over = true;
                    // A member that stops reading the body (it answered, then closed)
                    // still gets its answer to the client; a client whose body fails
                    // does not.
                    if let Err(SendError::Client(_)) = r {
                        break Ok((false, false, false));
                    }
                }
            }
        }
    }
}
