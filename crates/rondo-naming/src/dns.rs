//! DNS answers (A, AAAA and SRV) for clients that only speak DNS: SGD's and PKUAS's DNS round
//! robin, but filtered and ordered by rondo's policy.
//!
//! For a zone such as `rondo.` the server answers, from the live snapshot of every query:
//!
//! - `<service>.<zone>` A (AAAA): one record per member of cluster `<service>` that may take new
//!   work (up, not disabled, not ejected, not draining) whose address is an IPv4 (IPv6) literal.
//!   The first record is the member the cluster's policy picks for this query
//!   ([`crate::answer::lookup`]: round robin rotates it from query to query, `weighted` follows
//!   the weights, ...), the rest follow in configuration order.
//! - `<service>.<zone>` and `_<anything>._tcp.<service>.<zone>` SRV: one record per such
//!   member (any address), same order, priority 0, weight the member's weight (at most 65535),
//!   port from its address. The target of a member at an IP literal is
//!   `<member>.<service>.<zone>`, whose A (AAAA) record is in the additional section; the
//!   target of a member at a host name is that host name (an SRV target must not be an alias).
//! - `<member>.<service>.<zone>` A (AAAA): the address of a configured (or registered) member
//!   at an IP literal, whatever its state, so a client following an SRV answer always finds it.
//!
//! Every record has TTL 0: the answer changes with every view and every pick, so resolvers
//! must not cache it. Responses are authoritative (AA).
//!
//! The zone's apex answers SOA (so that a resolver a parent zone delegates to this server
//! finds the zone): `<zone> SOA <zone> hostmaster.<zone>`, serial the view id (its low 32
//! bits), refresh and retry 60 s, expire 1 h, minimum 0. Every negative answer (NXDOMAIN,
//! NODATA) carries that SOA in its authority section, as RFC 2308 asks of an authoritative
//! server; its TTL and minimum of 0 make the negative-caching time 0, so a name that has no
//! member now is asked again next time. The apex has no NS records (the delegation in the
//! parent names the servers) and no addresses (the SOA's primary-server name is the apex
//! itself, which is legal; nothing transfers the zone). Zone transfers (AXFR, IXFR) are
//! REFUSED: the zone is made per query.
//!
//! Response codes: a name under the zone that is not one of the above (an unknown service, an
//! unknown member) is NXDOMAIN; a known name asked for another record type, or a service with
//! no member that may take work, is NOERROR with no answer (NODATA: the name exists, it just has
//! nothing to offer now, and the next view may); a name outside the zone, or a class other than
//! IN, is REFUSED; a message with other than one question is FORMERR; an opcode other than
//! QUERY is NOTIMP. Names compare case-insensitively. Malformed messages are answered FORMERR
//! (or dropped when shorter than a header) by hickory-server; nothing here panics on input.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::net::runtime::Time;
use hickory_server::proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use rondo_core::AdminState;
use rondo_core::wire::Member;
use rondo_runtime::{ClusterRt, Snapshot, Views};

use crate::NamingParts;

use crate::answer::{self, AnswerError, LookupFacts};

/// The TTL of every record: answers change with every view and every pick.
const TTL: u32 = 0;
/// How long a TCP connection may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(5);
/// Responses queued per TCP connection.
const TCP_RESPONSE_BUFFER: usize = 16;

/// A running DNS server (UDP and TCP on the same port).
#[derive(Debug)]
pub struct DnsServer {
    /// The bound address (UDP and TCP).
    pub addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
}

impl DnsServer {
    /// Stops serving: the sockets close shortly after (in-flight answers are dropped). Also
    /// done on drop.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves A, AAAA and SRV answers on UDP and TCP at `listen` (port 0 = any free port, the same
/// for both) for services under `zone` (e.g. `rondo.` or `svc.example.`; the final dot is
/// optional), answering from `parts`' current view. Must be called within a tokio runtime.
pub async fn start(listen: SocketAddr, zone: &str, parts: &NamingParts) -> io::Result<DnsServer> {
    let zone = zone_name(zone)?;
    let (udp, tcp) = bind(listen, &parts.sockets).await?;
    let addr = udp.local_addr()?;
    let mut server = hickory_server::Server::new(Handler {
        zone,
        views: parts.views.clone(),
        group: parts.group.clone(),
    });
    server.register_socket(udp);
    server.register_listener(tcp, TCP_IDLE, TCP_RESPONSE_BUFFER);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        // Stop on `stop()` or when the `DnsServer` is gone (the sender dropped).
        let _ = stopped.wait_for(|s| *s).await;
        if let Err(e) = server.shutdown_gracefully().await {
            tracing::warn!(error = %e, "dns server stopped with an error");
        }
    });
    tracing::info!(%addr, "dns answers listening (udp and tcp)");
    Ok(DnsServer { addr, stop })
}

/// The zone as a lower-case, fully qualified name.
fn zone_name(zone: &str) -> io::Result<Name> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let trimmed = zone.trim_end_matches('.');
    if trimmed.is_empty() {
        return Err(invalid(format!("`{zone}` is not a dns zone name")));
    }
    let mut name = Name::from_ascii(trimmed)
        .map_err(|e| invalid(format!("`{zone}` is not a dns zone name: {e}")))?
        .to_lowercase();
    name.set_fqdn(true);
    Ok(name)
}

/// A UDP socket and a TCP listener on the same port (with port 0, a free port for both), or
/// the ones a previous process handed over.
async fn bind(
    listen: SocketAddr,
    sockets: &rondo_runtime::sockets::Sockets,
) -> io::Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let (udp, tcp) = ("naming dns udp", "naming dns tcp");
    if listen.port() != 0 || sockets.is_inherited(udp, listen) {
        let u = sockets.udp(udp, listen, listen).await?;
        let at = u.local_addr()?;
        let t =
            sockets.tcp_listener_at(tcp, listen, at, rondo_runtime::sockets::DEFAULT_BACKLOG)?;
        return Ok((u, t));
    }
    // The UDP port the system picks may be taken for TCP: try a few.
    let mut last = None;
    for _ in 0..16 {
        let probe = tokio::net::UdpSocket::bind(listen).await?;
        let at = probe.local_addr()?;
        match tokio::net::TcpListener::bind(at).await {
            Ok(t) => {
                drop(t);
                drop(probe);
                // Both free at `at`: bound again through the process's sockets, so that an
                // upgrade can hand them over.
                match sockets.udp(udp, listen, at).await {
                    Ok(u) => match sockets.tcp_listener_at(
                        tcp,
                        listen,
                        at,
                        rondo_runtime::sockets::DEFAULT_BACKLOG,
                    ) {
                        Ok(t) => return Ok((u, t)),
                        Err(e) => last = Some(e),
                    },
                    Err(e) => last = Some(e),
                }
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free port for udp and tcp")))
}

/// Answers queries from the live snapshot.
struct Handler {
    /// Lower case, fully qualified.
    zone: Name,
    views: Views,
    /// This router's locality group, the default of a lookup's.
    group: Option<Arc<str>>,
}

/// What to send back.
struct Reply {
    code: ResponseCode,
    authoritative: bool,
    answers: Vec<Record>,
    additionals: Vec<Record>,
    /// The view the answer was made from (the SOA's serial).
    view_id: u64,
}

impl Reply {
    fn code(code: ResponseCode) -> Self {
        Reply {
            code,
            authoritative: false,
            answers: Vec::new(),
            additionals: Vec::new(),
            view_id: 0,
        }
    }

    /// Whether this is an authoritative negative answer (NXDOMAIN or NODATA), which carries the
    /// zone's SOA in its authority section.
    fn negative(&self) -> bool {
        self.authoritative
            && self.answers.is_empty()
            && matches!(self.code, ResponseCode::NXDomain | ResponseCode::NoError)
    }

    fn authoritative(code: ResponseCode) -> Self {
        Reply { authoritative: true, ..Self::code(code) }
    }

    fn nodata() -> Self {
        Self::authoritative(ResponseCode::NoError)
    }

    fn nxdomain() -> Self {
        Self::authoritative(ResponseCode::NXDomain)
    }
}

// `RequestHandler` is an `async_trait`; this is its expansion, to do without the macro crate.
impl RequestHandler for Handler {
    fn handle_request<'life0, 'life1, 'async_trait, R, T>(
        &'life0 self,
        request: &'life1 Request,
        response_handle: R,
    ) -> Pin<Box<dyn Future<Output = ResponseInfo> + Send + 'async_trait>>
    where
        R: ResponseHandler + 'async_trait,
        T: Time + 'async_trait,
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(self.respond(request, response_handle))
    }
}

impl Handler {
    async fn respond<R: ResponseHandler>(&self, request: &Request, mut handle: R) -> ResponseInfo {
        let edns = request.edns.as_ref().map(|req| {
            let mut e = Edns::new();
            e.set_max_payload(req.max_payload().max(512));
            e.set_version(0);
            e
        });
        let reply = match &request.edns {
            Some(req) if req.version() > 0 => Reply::code(ResponseCode::BADVERS),
            _ => self.reply(request),
        };
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = reply.code;
        metadata.authoritative = reply.authoritative;
        let soa = reply.negative().then(|| self.soa(self.zone.clone(), reply.view_id));
        let response = MessageResponseBuilder::new(&request.queries, edns.as_ref()).build(
            metadata,
            reply.answers.iter(),
            std::iter::empty(),
            soa.iter(),
            reply.additionals.iter(),
        );
        match handle.send_response(response).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, src = %request.src(), "dns response not sent");
                let mut metadata = Metadata::response_from_request(&request.metadata);
                metadata.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header { metadata, counts: HeaderCounts::default() })
            }
        }
    }

    fn reply(&self, request: &Request) -> Reply {
        if request.metadata.op_code != OpCode::Query {
            return Reply::code(ResponseCode::NotImp);
        }
        let [query] = request.queries.queries() else {
            return Reply::code(ResponseCode::FormErr);
        };
        if query.query_class() != DNSClass::IN {
            return Reply::code(ResponseCode::Refused);
        }
        let name: &Name = query.name();
        if !self.zone.zone_of(name) {
            return Reply::code(ResponseCode::Refused);
        }
        let labels: Vec<&[u8]> = name.iter().collect();
        let prefix = &labels[..labels.len().saturating_sub(self.zone.iter().count())];
        // Answer with the name as asked (its case too, for resolvers that check it).
        let owner = query.original().name().clone();
        let snapshot = self.views.load();
        let qtype = query.query_type();
        // No zone transfers: the zone is made per query.
        if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            return Reply::code(ResponseCode::Refused);
        }
        let mut reply = self.answer(&snapshot, prefix, owner, qtype);
        reply.view_id = snapshot.view.id;
        reply
    }

    /// The answer for a name under the zone (`prefix`: its labels above the zone's).
    fn answer(
        &self,
        snapshot: &Snapshot,
        prefix: &[&[u8]],
        owner: Name,
        qtype: RecordType,
    ) -> Reply {
        match *prefix {
            // The zone's apex: its SOA, and nothing else.
            [] => {
                let mut reply = Reply::nodata();
                if matches!(qtype, RecordType::SOA | RecordType::ANY) {
                    // Owned by the name as asked (its case too).
                    reply.answers.push(self.soa(owner, snapshot.view.id));
                }
                reply
            }
            [service] => match find_cluster(snapshot, service) {
                Some((service, _)) => self.service(snapshot, service, owner, qtype, false),
                None => Reply::nxdomain(),
            },
            // `_tcp.<service>`: an empty non-terminal above the SRV names.
            [b"_tcp", service] => match find_cluster(snapshot, service) {
                Some(_) => Reply::nodata(),
                None => Reply::nxdomain(),
            },
            [member, service] => match find_cluster(snapshot, service) {
                Some((_, rt)) => member_host(rt, member, owner, qtype),
                None => Reply::nxdomain(),
            },
            [srv_name, b"_tcp", service] if srv_name.first() == Some(&b'_') => {
                match find_cluster(snapshot, service) {
                    Some((service, _)) => self.service(snapshot, service, owner, qtype, true),
                    None => Reply::nxdomain(),
                }
            }
            _ => Reply::nxdomain(),
        }
    }

    /// The zone's SOA record at view `view_id`, owned by `owner` (the apex; see the module
    /// docs).
    fn soa(&self, owner: Name, view_id: u64) -> Record {
        let rname = Name::from_labels([b"hostmaster".as_slice()])
            .and_then(|n| n.append_domain(&self.zone))
            .unwrap_or_else(|_| self.zone.clone());
        // The serial is the view id's low 32 bits (RFC 1982 arithmetic wraps anyway).
        let serial = view_id as u32;
        let soa = SOA::new(self.zone.clone(), rname, serial, 60, 60, 3600, 0);
        Record::from_rdata(owner, TTL, RData::SOA(soa))
    }

    /// The answer for a service name: A, AAAA or SRV records as asked (ANY: the addresses),
    /// or, for an `_x._tcp` name (`srv_only`), SRV records only (ANY: those).
    fn service(
        &self,
        snapshot: &Snapshot,
        service: &str,
        owner: Name,
        qtype: RecordType,
        srv_only: bool,
    ) -> Reply {
        let wants_srv = qtype == RecordType::SRV || (srv_only && qtype == RecordType::ANY);
        let wants_v4 = !srv_only && matches!(qtype, RecordType::A | RecordType::ANY);
        let wants_v6 = !srv_only && matches!(qtype, RecordType::AAAA | RecordType::ANY);
        if !(wants_srv || wants_v4 || wants_v6) {
            return Reply::nodata();
        }
        let group = self.group.as_deref();
        let Some(members) = eligible(snapshot, service, group) else { return Reply::nxdomain() };
        let mut reply = Reply::nodata();
        for m in &members {
            let Some((host, port)) = parse_address(&m.address) else {
                tracing::debug!(service, member = m.name, address = m.address, "not host:port");
                continue;
            };
            if wants_srv {
                let weight = u16::try_from(m.weight).unwrap_or(u16::MAX);
                let target = match &host {
                    Host::Ip(ip) => match member_name(&m.name, service, &self.zone) {
                        Some(target) => {
                            reply.additionals.push(address(target.clone(), *ip));
                            target
                        }
                        None => continue,
                    },
                    Host::Name(name) => name.clone(),
                };
                let srv = RData::SRV(SRV::new(0, weight, port, target));
                reply.answers.push(Record::from_rdata(owner.clone(), TTL, srv));
            }
            match host {
                Host::Ip(ip @ IpAddr::V4(_)) if wants_v4 => {
                    reply.answers.push(address(owner.clone(), ip));
                }
                Host::Ip(ip @ IpAddr::V6(_)) if wants_v6 => {
                    reply.answers.push(address(owner.clone(), ip));
                }
                _ => {}
            }
        }
        reply
    }
}

/// The members of `service` that may take new work, the one its policy picks now (for this
/// router's locality `group`, as a lookup without `?group=` does) first, the rest in
/// configuration order; `None` for an unknown service.
fn eligible(snapshot: &Snapshot, service: &str, group: Option<&str>) -> Option<Vec<Member>> {
    let mut members = match answer::answer(snapshot, service) {
        Ok(a) => a.members,
        Err(AnswerError::UnknownService { .. }) => return None,
        Err(AnswerError::NoMember(_)) => Vec::new(),
    };
    members.retain(|m| m.state != AdminState::Draining);
    if members.len() > 1
        && let Ok(pick) =
            answer::lookup(snapshot, service, LookupFacts { group, key: None, exclude: &[] })
        && let Some(at) = members.iter().position(|m| m.name == pick.member.name)
    {
        // The pick first, the rest in configuration order.
        members[..=at].rotate_right(1);
    }
    Some(members)
}

/// The cluster named by `label` (case-insensitive), with its canonical name.
fn find_cluster<'s>(snapshot: &'s Snapshot, label: &[u8]) -> Option<(&'s str, &'s ClusterRt)> {
    let exact = std::str::from_utf8(label).ok().and_then(|l| snapshot.clusters.get_key_value(l));
    exact
        .or_else(|| {
            snapshot.clusters.iter().find(|(name, _)| name.as_bytes().eq_ignore_ascii_case(label))
        })
        .map(|(name, rt)| (name.as_str(), &**rt))
}

/// `<member>.<service>.<zone>`: the address of member `label` (case-insensitive) of the
/// cluster, whatever its state.
fn member_host(rt: &ClusterRt, label: &[u8], owner: Name, qtype: RecordType) -> Reply {
    let Some(m) = rt.spec.members.iter().find(|m| m.name.as_bytes().eq_ignore_ascii_case(label))
    else {
        return Reply::nxdomain();
    };
    let mut reply = Reply::nodata();
    if let Some((Host::Ip(ip), _)) = parse_address(&m.address) {
        let wanted = match ip {
            IpAddr::V4(_) => matches!(qtype, RecordType::A | RecordType::ANY),
            IpAddr::V6(_) => matches!(qtype, RecordType::AAAA | RecordType::ANY),
        };
        if wanted {
            reply.answers.push(address(owner, ip));
        }
    }
    reply
}

/// `<member>.<service>.<zone>`, or `None` when a label is too long for DNS.
fn member_name(member: &str, service: &str, zone: &Name) -> Option<Name> {
    Name::from_labels([member.as_bytes(), service.as_bytes()]).ok()?.append_domain(zone).ok()
}

/// An A or AAAA record.
fn address(owner: Name, ip: IpAddr) -> Record {
    let rdata = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Record::from_rdata(owner, TTL, rdata)
}

/// A member's host.
enum Host {
    Ip(IpAddr),
    Name(Name),
}

/// `a.b.c.d:port`, `[v6]:port` or `host.name:port`.
fn parse_address(address: &str) -> Option<(Host, u16)> {
    if let Ok(sa) = address.parse::<SocketAddr>() {
        return Some((Host::Ip(sa.ip()), sa.port()));
    }
    let (host, port) = address.rsplit_once(':')?;
    let port = port.parse().ok()?;
    let mut name = Name::from_ascii(host.trim_end_matches('.')).ok()?;
    if name.is_root() {
        return None;
    }
    name.set_fqdn(true);
    Some((Host::Name(name), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zone_names_are_lower_case_and_fully_qualified() {
        assert_eq!(zone_name("Svc.Example").unwrap().to_string(), "svc.example.");
        assert_eq!(zone_name("rondo.").unwrap().to_string(), "rondo.");
        assert!(zone_name(".").is_err());
        assert!(zone_name("").is_err());
    }

    #[test]
    fn addresses_parse() {
        assert!(matches!(parse_address("127.0.0.1:80"), Some((Host::Ip(IpAddr::V4(_)), 80))));
        assert!(matches!(parse_address("[::1]:81"), Some((Host::Ip(IpAddr::V6(_)), 81))));
        match parse_address("db.internal:5432") {
            Some((Host::Name(n), 5432)) => assert_eq!(n.to_string(), "db.internal."),
            _ => panic!("host name not parsed"),
        }
        assert!(parse_address("no-port").is_none());
        assert!(parse_address("host:99999").is_none());
    }

    #[test]
    fn member_names_are_under_the_service() {
        let zone = zone_name("rondo.").unwrap();
        assert_eq!(member_name("a1", "web", &zone).unwrap().to_string(), "a1.web.rondo.");
        assert!(member_name(&"x".repeat(64), "web", &zone).is_none());
    }
}
