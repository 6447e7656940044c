//! `[[queue]]`: durable queues (backend, limits, retries, lease, sessions), and what `queue`
//! listeners and their routes may do.

use super::*;

/// The backends a queue may use.
const QUEUE_BACKENDS: [&str; 2] = ["embedded", "nats"];

pub(super) fn compile_queue(c: &mut Compiler<'_>, i: usize, q: &RawQueue) -> QueueSpec {
    let path = FieldPath::root().key("queue").index(i);
    check_queue_name(c, &path, &q.name);
    let backend = match q.backend.as_deref().unwrap_or("embedded") {
        "embedded" => embedded_backend(c, &path, q),
        "nats" => nats_backend(c, &path, q),
        other => {
            c.err(
                path.key("backend"),
                format!("unknown queue backend `{other}`, expected {}", one_of(QUEUE_BACKENDS)),
            );
            QueueBackend::Embedded { directory: Default::default() }
        }
    };
    let (max_messages, max_bytes, max_message_bytes) = compile_limits(c, &path, q);
    let (max_attempts, backoff_initial, backoff_max) = compile_retries(c, &path, q);
    let lease = c.ms(path.key("lease_ms"), q.lease_ms, QueueSpec::DEFAULT_LEASE, false);
    if lease < std::time::Duration::from_millis(100) {
        c.err(path.key("lease_ms"), format!("must be at least 100, got {}", lease.as_millis()));
    }
    let concurrency = c.int(
        path.key("concurrency"),
        q.concurrency,
        u64::from(QueueSpec::DEFAULT_CONCURRENCY),
        1,
        QueueSpec::MAX_CONCURRENCY,
    ) as u32;
    let session_header = q.session_header.as_ref().map(|h| {
        if !is_token(h) {
            c.err(path.key("session_header"), format!("`{h}` is not a header name"));
        }
        h.to_ascii_lowercase()
    });
    QueueSpec {
        name: q.name.clone(),
        backend,
        max_messages,
        max_bytes,
        max_message_bytes,
        max_attempts,
        backoff_initial,
        backoff_max,
        lease,
        concurrency,
        session_header,
    }
}

/// A queue's name is a URL path segment and a file name.
fn check_queue_name(c: &mut Compiler<'_>, path: &FieldPath, name: &str) {
    if name.is_empty() {
        c.err(path.key("name"), "queue name must not be empty");
    } else if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        c.err(
            path.key("name"),
            format!(
                "queue name `{name}` may hold only letters, digits, `-` and `_` (it is a URL path \
                 segment and a file name)"
            ),
        );
    }
}

/// `backend = "embedded"`: a `directory`, and none of the NATS fields.
fn embedded_backend(c: &mut Compiler<'_>, path: &FieldPath, q: &RawQueue) -> QueueBackend {
    if q.nats_url.is_some() {
        c.err(path.key("nats_url"), "`nats_url` is for `backend = \"nats\"`");
    }
    if q.session_partitions.is_some() {
        c.err(
            path.key("session_partitions"),
            "`session_partitions` is for `backend = \"nats\"` (the embedded store \
             orders each session key on its own)",
        );
    }
    let directory = match &q.directory {
        Some(d) => c.file_path(path.key("directory"), d).unwrap_or_default(),
        None => {
            c.err(
                path.key("directory"),
                "an embedded queue needs `directory`, where its store file lives",
            );
            Default::default()
        }
    };
    QueueBackend::Embedded { directory }
}

/// `backend = "nats"`: a `nats_url` and the session partitions, no `directory`.
fn nats_backend(c: &mut Compiler<'_>, path: &FieldPath, q: &RawQueue) -> QueueBackend {
    if q.directory.is_some() {
        c.err(
            path.key("directory"),
            "`directory` is for `backend = \"embedded\"` (NATS keeps the messages)",
        );
    }
    let url = match &q.nats_url {
        Some(u) => {
            if let Err(e) = check_host_port(u) {
                c.err(path.key("nats_url"), e);
            }
            u.clone()
        }
        None => {
            c.err(path.key("nats_url"), "a nats queue needs `nats_url` (host:port)");
            String::new()
        }
    };
    let session_partitions = c.int(
        path.key("session_partitions"),
        q.session_partitions,
        u64::from(QueueSpec::DEFAULT_SESSION_PARTITIONS),
        1,
        QueueSpec::MAX_SESSION_PARTITIONS,
    ) as u32;
    QueueBackend::Nats { url, session_partitions }
}

/// `max_messages`, `max_bytes` and `max_message_bytes` (at most `max_bytes`).
fn compile_limits(c: &mut Compiler<'_>, path: &FieldPath, q: &RawQueue) -> (u64, u64, u64) {
    let max_messages = c.int(
        path.key("max_messages"),
        q.max_messages,
        QueueSpec::DEFAULT_MAX_MESSAGES,
        1,
        u64::MAX,
    );
    let max_bytes =
        c.int(path.key("max_bytes"), q.max_bytes, QueueSpec::DEFAULT_MAX_BYTES, 1, u64::MAX);
    let max_message_bytes = c.int(
        path.key("max_message_bytes"),
        q.max_message_bytes,
        QueueSpec::DEFAULT_MAX_MESSAGE_BYTES.min(max_bytes),
        1,
        u64::from(u32::MAX),
    );
    if max_message_bytes > max_bytes {
        c.err(
            path.key("max_message_bytes"),
            format!("must be at most max_bytes ({max_bytes}), got {max_message_bytes}"),
        );
    }
    (max_messages, max_bytes, max_message_bytes)
}

/// `max_attempts` and the backoff between them (`backoff_max_ms` at least the initial one).
fn compile_retries(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    q: &RawQueue,
) -> (u32, Duration, Duration) {
    let max_attempts = c.int(
        path.key("max_attempts"),
        q.max_attempts,
        u64::from(QueueSpec::DEFAULT_MAX_ATTEMPTS),
        1,
        QueueSpec::MAX_ATTEMPTS,
    ) as u32;
    let backoff_initial = c.ms(
        path.key("backoff_initial_ms"),
        q.backoff_initial_ms,
        QueueSpec::DEFAULT_BACKOFF_INITIAL,
        true,
    );
    let backoff_max =
        c.ms(path.key("backoff_max_ms"), q.backoff_max_ms, QueueSpec::DEFAULT_BACKOFF_MAX, true);
    if backoff_max < backoff_initial {
        c.err(
            path.key("backoff_max_ms"),
            format!(
                "must be at least backoff_initial_ms ({}), got {}",
                backoff_initial.as_millis(),
                backoff_max.as_millis()
            ),
        );
    }
    (max_attempts, backoff_initial, backoff_max)
}

/// Two queues of one name; a `queue` listener without any queue.
pub(super) fn check_queues(c: &mut Compiler<'_>, raw: &RawConfig) {
    let root = FieldPath::root();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, q) in raw.queue.iter().enumerate() {
        match names.get(q.name.as_str()) {
            Some(first) => c.err(
                root.key("queue").index(i).key("name"),
                format!("duplicate queue name `{}`, first used by queue[{first}]", q.name),
            ),
            None => {
                names.insert(&q.name, i);
            }
        }
    }
    for (i, l) in raw.listener.iter().enumerate() {
        if l.protocol.as_deref() == Some("queue") && l.routing.as_deref() == Some("all-matches") {
            c.err(
                root.key("listener").index(i).key("routing"),
                format!(
                    "queue listener `{}` cannot use `all-matches`: a message is kept once per \
                     branch of its one route's `multicast` instead",
                    l.name
                ),
            );
        }
    }
    if raw.queue.is_empty() {
        for (i, l) in raw.listener.iter().enumerate() {
            if l.protocol.as_deref() == Some("queue") {
                c.err(
                    root.key("listener").index(i).key("protocol"),
                    format!(
                        "queue listener `{}` has no queue to accept messages into: add a [[queue]]",
                        l.name
                    ),
                );
            }
        }
    }
}

/// What a route on a `queue` listener may not do: match on `sni`, sign users on, split over
/// weighted clusters, or send to a
/// cluster whose members the queue cannot deliver to over HTTP.
pub(super) fn check_queue_route(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    r: &RawRoute,
    route: &Route,
    clusters: &BTreeMap<String, Arc<ClusterSpec>>,
) {
    if let Some(m) = &r.matcher
        && m.sni.is_some()
    {
        c.err(
            path.key("match").key("sni"),
            format!("route on queue listener `{}` cannot match on `sni`", r.listener),
        );
    }
    if r.login.is_some() {
        c.err(
            path.key("login"),
            format!("route on queue listener `{}` cannot sign users on", r.listener),
        );
    }
    if r.session_replay.is_some() {
        c.err(
            path.key("session_replay"),
            format!(
                "route on queue listener `{}` cannot replay sessions: a queued message is \
                 delivered on its own, with no connection whose member could change",
                r.listener
            ),
        );
    }
    if r.multicast_max_body_bytes.is_some() {
        c.err(
            path.key("multicast_max_body_bytes"),
            format!(
                "route on queue listener `{}` keeps a copy per branch in the queue: the \
                 queue's `max_message_bytes` bounds it",
                r.listener
            ),
        );
    }
    if r.clusters.is_some() {
        c.err(
            path.key("clusters"),
            format!(
                "route on queue listener `{}` delivers to one `cluster`, not a weighted split",
                r.listener
            ),
        );
    }
    let branches = route.multicast.iter().enumerate().flat_map(|(j, b)| {
        let at = path.key("multicast").index(j);
        std::iter::once((at.key("cluster"), &b.cluster))
            .chain(b.backups.iter().enumerate().map(move |(k, x)| (at.key("backups").index(k), x)))
    });
    let targets = std::iter::once((path.key("cluster"), &route.cluster))
        .chain(route.backups.iter().enumerate().map(|(j, b)| (path.key("backups").index(j), b)))
        .chain(branches);
    for (p, name) in targets {
        let Some(cluster) = clusters.get(name) else { continue };
        let up = cluster.upstream_protocol;
        if matches!(up, UpstreamProtocol::Tcp | UpstreamProtocol::Udp) {
            c.err(
                p,
                format!(
                    "queue listener `{}` cannot deliver to cluster `{name}` with upstream_protocol \
                     `{}`, it needs `http1` or `http2`",
                    r.listener,
                    upstream_protocol_str(up)
                ),
            );
        }
    }
}
