//! The client side of `rondo ctl`: one call to the admin API per command, answers printed as
//! text (the status table, or one line).

mod tables;

use std::fmt::Write as _;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

pub use self::tables::{dead_letter_text, dead_table, queue_table, shadow_table, status_table};

/// A `rondo ctl` command.
#[derive(Debug, Clone)]
pub enum CtlCommand {
    /// Print the status table.
    Status,
    /// Set a member's admin state: `drain`, `undrain`, `disable` or `enable`.
    Admin {
        /// `drain`, `undrain`, `disable` or `enable`.
        action: &'static str,
        /// Cluster name.
        cluster: String,
        /// Member name.
        member: String,
    },
    /// Set a member's admin state (`drain` or `undrain`) in every cluster it serves.
    AdminEverywhere {
        /// `drain` or `undrain`.
        action: &'static str,
        /// Member name.
        member: String,
    },
    /// Drain a member, then wait until it has no request in flight and no session.
    DrainWait {
        /// Cluster name.
        cluster: String,
        /// Member name.
        member: String,
        /// How long to wait.
        timeout: std::time::Duration,
    },
    /// Change a member's weight.
    Weight {
        /// Cluster name.
        cluster: String,
        /// Member name.
        member: String,
        /// New weight.
        weight: u64,
    },
    /// Change a cluster's algorithm.
    Algorithm {
        /// Cluster name.
        cluster: String,
        /// Algorithm name.
        name: String,
    },
    /// Start evaluating a shadow algorithm beside a cluster's live one (no traffic moves).
    ShadowStart {
        /// Cluster name.
        cluster: String,
        /// The candidate algorithm.
        name: String,
    },
    /// Print a cluster's shadow report.
    ShadowReport {
        /// Cluster name.
        cluster: String,
    },
    /// Stop a cluster's shadow; prints its last report.
    ShadowStop {
        /// Cluster name.
        cluster: String,
    },
    /// Revoke sign-on tokens by id or subject (one of the two).
    Revoke {
        /// A token id (`jti`).
        token_id: Option<String>,
        /// A subject (`sub`).
        subject: Option<String>,
        /// How long it holds, milliseconds (the API's default when `None`).
        ttl_ms: Option<u64>,
    },
    /// List the revocations in force.
    Revocations,
    /// Start a hitless upgrade.
    Upgrade,
    /// Every queue's figures.
    QueueStatus,
    /// A queue's dead letters.
    QueueDead {
        /// The queue.
        queue: String,
        /// Most listed.
        limit: usize,
    },
    /// One dead letter with its tries.
    QueueShow {
        /// The queue.
        queue: String,
        /// The message id.
        id: String,
    },
    /// Requeue (`requeue`) or purge one dead letter, or every one (`id: None`).
    QueueChange {
        /// The queue.
        queue: String,
        /// The message id; `None`: all.
        id: Option<String>,
        /// Requeue rather than purge.
        requeue: bool,
    },
    /// Validate and apply a configuration file's text.
    Apply {
        /// The file's name (for messages).
        file: String,
        /// Its content.
        text: String,
    },
}

/// Why a `rondo ctl` command failed; the display is the message to print.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// No connection.
    #[error("cannot reach the admin API at {addr}: {reason}")]
    Unreachable {
        /// The address tried.
        addr: String,
        /// Why, lower case.
        reason: String,
    },
    /// 401.
    #[error("the admin API refused the token (401)")]
    Unauthorized,
    /// Any other non-success answer.
    #[error("the admin API answered {status}: {message}")]
    Refused {
        /// The status.
        status: StatusCode,
        /// The error text (and a config's error list).
        message: String,
    },
    /// The answer was not JSON (or not what was asked for).
    #[error("the admin API's answer is not JSON: {0}")]
    BadAnswer(String),
    /// `drain --wait` ran out of time; what remains.
    #[error("{0}")]
    NotDrained(String),
}

/// Where and as whom `rondo ctl` calls.
#[derive(Debug, Clone)]
pub struct CtlTarget {
    /// `HOST:PORT` of the admin API.
    pub addr: String,
    /// The bearer token.
    pub token: String,
    /// Recorded as `operator:NAME` on state changes (`X-Rondo-Operator`).
    pub operator: Option<String>,
    /// Sent as `If-Match` with every change: the change is made only while this view is in
    /// effect (else 409 naming the current one).
    pub if_match: Option<u64>,
    /// TLS to the admin API (`[admin] tls`), when set.
    pub tls: Option<rondo_runtime::tls::client::ClientTls>,
}

/// Runs `cmd` against `target`; returns the text to print.
pub async fn run(target: &CtlTarget, cmd: CtlCommand) -> Result<String, CtlError> {
    let member_path = |c: &str, m: &str| format!("/api/v1/clusters/{c}/members/{m}");
    match cmd {
        CtlCommand::Status => {
            let v = call(target, Method::GET, "/api/v1/status", None).await?;
            Ok(status_table(&v))
        }
        CtlCommand::Admin { action, cluster, member } => {
            let path = format!("{}/{action}", member_path(&cluster, &member));
            let v = call(target, Method::POST, &path, None).await?;
            Ok(format!(
                "{cluster}/{member}: {} (by {})\n",
                v["admin"].as_str().unwrap_or("?"),
                v["admin_by"].as_str().unwrap_or("?")
            ))
        }
        CtlCommand::AdminEverywhere { action, member } => {
            admin_everywhere(target, action, &member).await
        }
        CtlCommand::DrainWait { cluster, member, timeout } => {
            let path = format!("{}/drain", member_path(&cluster, &member));
            call(target, Method::POST, &path, None).await?;
            wait_drained(target, &cluster, &member, timeout).await
        }
        CtlCommand::Weight { cluster, member, weight } => {
            let path = format!("{}/weight", member_path(&cluster, &member));
            let body = json!({ "weight": weight }).to_string();
            let v = call(target, Method::PUT, &path, Some(body)).await?;
            Ok(format!("{cluster}/{member}: weight {weight}, view {}\n", v["view"]))
        }
        CtlCommand::Algorithm { cluster, name } => {
            let path = format!("/api/v1/clusters/{cluster}/algorithm");
            let body = json!({ "algorithm": name }).to_string();
            let v = call(target, Method::PUT, &path, Some(body)).await?;
            Ok(format!("{cluster}: algorithm {name}, view {}\n", v["view"]))
        }
        CtlCommand::ShadowStart { cluster, name } => shadow_start(target, &cluster, &name).await,
        CtlCommand::ShadowReport { cluster } => {
            let path = format!("/api/v1/clusters/{cluster}/shadow");
            let v = call(target, Method::GET, &path, None).await?;
            Ok(shadow_table(&v))
        }
        CtlCommand::ShadowStop { cluster } => {
            let path = format!("/api/v1/clusters/{cluster}/shadow");
            let v = call(target, Method::DELETE, &path, None).await?;
            Ok(format!(
                "{cluster}: shadow {} stopped; its last report:\n{}",
                v["shadow"].as_str().unwrap_or("?"),
                shadow_table(&v)
            ))
        }
        CtlCommand::Revoke { token_id, subject, ttl_ms } => {
            revoke(target, token_id, subject, ttl_ms).await
        }
        CtlCommand::Revocations => revocations(target).await,
        CtlCommand::Upgrade => {
            let v = call(target, Method::POST, "/api/v1/upgrade", None).await?;
            Ok(format!(
                "upgrade started: the new process is pid {}; this one drains once it is ready\n",
                v["pid"]
            ))
        }
        CtlCommand::QueueStatus => {
            let v = call(target, Method::GET, "/api/v1/queues", None).await?;
            Ok(queue_table(&v))
        }
        CtlCommand::QueueDead { queue, limit } => {
            let path = format!("/api/v1/queues/{queue}/dead?limit={limit}");
            let v = call(target, Method::GET, &path, None).await?;
            Ok(dead_table(&v))
        }
        CtlCommand::QueueShow { queue, id } => {
            let path = format!("/api/v1/queues/{queue}/dead/{id}");
            let v = call(target, Method::GET, &path, None).await?;
            Ok(dead_letter_text(&v))
        }
        CtlCommand::QueueChange { queue, id, requeue } => {
            queue_change(target, &queue, id.as_deref(), requeue).await
        }
        CtlCommand::Apply { file, text } => {
            let v =
                call_as(target, Method::POST, "/api/v1/config", Some(text), Some(&file)).await?;
            Ok(format!("applied {file}: view {}\n", v["view"]))
        }
    }
}

/// `rondo ctl drain|undrain MEMBER` without a cluster: the member in every cluster it serves.
async fn admin_everywhere(
    target: &CtlTarget,
    action: &str,
    member: &str,
) -> Result<String, CtlError> {
    let path = format!("/api/v1/members/{member}/{action}");
    let v = call(target, Method::POST, &path, None).await?;
    let clusters: Vec<&str> =
        v["clusters"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    Ok(format!(
        "{member}: {} in {} (by {})\n",
        v["admin"].as_str().unwrap_or("?"),
        clusters.join(", "),
        v["admin_by"].as_str().unwrap_or("?")
    ))
}

/// Polls the status until the drained member has no request in flight and no session, or
/// `timeout` passed.
async fn wait_drained(
    target: &CtlTarget,
    cluster: &str,
    member: &str,
    timeout: std::time::Duration,
) -> Result<String, CtlError> {
    let started = std::time::Instant::now();
    loop {
        let v = call(target, Method::GET, "/api/v1/status", None).await?;
        let (in_flight, sessions) = member_load(&v, cluster, member).ok_or_else(|| {
            CtlError::NotDrained(format!("the status no longer lists {cluster}/{member}"))
        })?;
        let waited = started.elapsed().as_millis();
        if in_flight == 0 && sessions == 0 {
            return Ok(format!("{cluster}/{member}: drained after {waited} ms\n"));
        }
        if started.elapsed() >= timeout {
            return Err(CtlError::NotDrained(format!(
                "{cluster}/{member}: not drained after {waited} ms: {in_flight} requests \
                 in flight, {sessions} sessions"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// `rondo ctl shadow CLUSTER ALGORITHM`: starts a shadow evaluation.
async fn shadow_start(target: &CtlTarget, cluster: &str, name: &str) -> Result<String, CtlError> {
    let path = format!("/api/v1/clusters/{cluster}/shadow");
    let body = json!({ "algorithm": name }).to_string();
    let v = call(target, Method::PUT, &path, Some(body)).await?;
    let replaced = match v["replaced"].as_str() {
        Some(old) => format!(", replacing {old}"),
        None => String::new(),
    };
    Ok(format!(
        "{cluster}: shadow {name} beside {}{replaced}: asked at every pick, no traffic \
         moves; `rondo ctl shadow {cluster}` reports, `--off` stops\n",
        v["live"].as_str().unwrap_or("?")
    ))
}

/// `rondo ctl revoke`: a sign-on token id or subject revoked for `ttl_ms`.
async fn revoke(
    target: &CtlTarget,
    token_id: Option<String>,
    subject: Option<String>,
    ttl_ms: Option<u64>,
) -> Result<String, CtlError> {
    let mut body = serde_json::Map::new();
    if let Some(t) = token_id {
        body.insert("token_id".into(), Value::String(t));
    }
    if let Some(s) = subject {
        body.insert("subject".into(), Value::String(s));
    }
    if let Some(ms) = ttl_ms {
        body.insert("ttl_ms".into(), Value::from(ms));
    }
    let body = Value::Object(body).to_string();
    let v = call(target, Method::POST, "/api/v1/revocations", Some(body)).await?;
    Ok(format!("revoked {}\n", revocation_line(&v)))
}

/// `rondo ctl revocations`: the revocations in force, one a line.
async fn revocations(target: &CtlTarget) -> Result<String, CtlError> {
    let v = call(target, Method::GET, "/api/v1/revocations", None).await?;
    let list = v["revocations"].as_array().map(Vec::as_slice).unwrap_or_default();
    if list.is_empty() {
        return Ok("no revocations in force\n".to_owned());
    }
    Ok(list.iter().map(|r| format!("{}\n", revocation_line(r))).collect())
}

/// `rondo ctl queue requeue|purge QUEUE [ID]`: one dead letter, or every one (`id: None`).
async fn queue_change(
    target: &CtlTarget,
    queue: &str,
    id: Option<&str>,
    requeue: bool,
) -> Result<String, CtlError> {
    let verb = if requeue { "requeue" } else { "purge" };
    let path = match id {
        Some(id) => format!("/api/v1/queues/{queue}/dead/{id}/{verb}"),
        None => format!("/api/v1/queues/{queue}/dead/{verb}"),
    };
    let v = call(target, Method::POST, &path, None).await?;
    let what = if requeue { "requeued" } else { "purged" };
    Ok(format!("{queue}: {} dead letter(s) {what}\n", v[what]))
}

/// `subject alice until 1796125906 (unix seconds)` from an answer's `kind`, `value`, `until`.
fn revocation_line(v: &Value) -> String {
    let kind = match v["kind"].as_str() {
        Some("token_id") => "token id",
        Some(k) => k,
        None => "?",
    };
    format!(
        "{kind} {} until {} (unix seconds)",
        v["value"].as_str().unwrap_or("?"),
        v["until"].as_u64().map_or_else(|| "?".to_owned(), |u| u.to_string())
    )
}

/// A member's `in_flight` and `sessions` in a status answer.
fn member_load(status: &Value, cluster: &str, member: &str) -> Option<(u64, u64)> {
    let c = status["clusters"].as_array()?.iter().find(|c| c["name"] == cluster)?;
    let m = c["members"].as_array()?.iter().find(|m| m["name"] == member)?;
    Some((m["in_flight"].as_u64()?, m["sessions"].as_u64()?))
}

/// One call; the JSON answer of a 2xx, or the error.
pub async fn call(
    target: &CtlTarget,
    method: Method,
    path: &str,
    body: Option<String>,
) -> Result<Value, CtlError> {
    call_as(target, method, path, body, None).await
}

/// [`call`] sending a configuration file's text: the server's errors about it are shown at
/// `config_file` (the server only knows the text, and calls it `admin-api`).
async fn call_as(
    target: &CtlTarget,
    method: Method,
    path: &str,
    body: Option<String>,
    config_file: Option<&str>,
) -> Result<Value, CtlError> {
    let scheme = if target.tls.is_some() { "https" } else { "http" };
    let mut req = Request::builder()
        .method(method.clone())
        .uri(format!("{scheme}://{}{}", target.addr, path))
        .header(header::AUTHORIZATION, format!("Bearer {}", target.token));
    if let Some(op) = &target.operator {
        req = req.header(crate::server::OPERATOR_HEADER, op);
    }
    if let Some(view) = target.if_match
        && method != Method::GET
    {
        req = req.header(header::IF_MATCH, format!("\"{view}\""));
    }
    if body.is_some() {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .map_err(|e| CtlError::Unreachable { addr: target.addr.clone(), reason: e.to_string() })?;
    let resp = match &target.tls {
        None => Client::builder(TokioExecutor::new())
            .build_http::<Full<Bytes>>()
            .request(req)
            .await
            .map_err(|e| CtlError::Unreachable {
                addr: target.addr.clone(),
                reason: io_reason(&e),
            })?,
        Some(tls) => send_tls(target, tls, req).await?,
    };
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| CtlError::Unreachable { addr: target.addr.clone(), reason: e.to_string() })?
        .to_bytes();
    if status == StatusCode::UNAUTHORIZED {
        return Err(CtlError::Unauthorized);
    }
    let v: Value =
        serde_json::from_slice(&bytes).map_err(|e| CtlError::BadAnswer(e.to_string()))?;
    if !status.is_success() {
        let mut message = v["error"].as_str().unwrap_or("no error text").to_owned();
        if let Some(list) = v["errors"].as_array() {
            for e in list {
                let _ = write!(message, "\n  {}", config_error_text(e, config_file));
            }
        }
        return Err(CtlError::Refused { status, message });
    }
    Ok(v)
}

/// One request over a new TLS connection to the admin API; a failed handshake is reported with
/// the host and the reason (`tls to 127.0.0.1:9900: certificate not valid for 127.0.0.1 ...`).
async fn send_tls(
    target: &CtlTarget,
    tls: &rondo_runtime::tls::client::ClientTls,
    req: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, CtlError> {
    let unreachable = |reason: String| CtlError::Unreachable { addr: target.addr.clone(), reason };
    let tcp = tokio::net::TcpStream::connect(&target.addr)
        .await
        .map_err(|e| unreachable(e.kind().to_string()))?;
    let _ = tcp.set_nodelay(true);
    let stream = tls.connect(tcp, &target.addr).await.map_err(unreachable)?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(io_reason(&e)))?;
    tokio::spawn(conn);
    sender.send_request(req).await.map_err(|e| {
        // With TLS 1.3 a refused client certificate shows on the first read.
        let reason = rondo_runtime::tls::client::rustls_in(&e).map_or_else(
            || io_reason(&e),
            |t| {
                let host = rondo_runtime::tls::client::host_of(&target.addr);
                format!(
                    "tls to {}: {}",
                    target.addr,
                    rondo_runtime::tls::client::describe_rustls(t, tls.name_for(host), tls.roots())
                )
            },
        );
        unreachable(reason)
    })
}

/// One of a config answer's `errors` as `FILE:LINE:COLUMN: field `FIELD`: MESSAGE`, naming
/// `file` when given (the file `rondo ctl apply` read), else the server's own text.
fn config_error_text(e: &Value, file: Option<&str>) -> String {
    let server_text = || e["text"].as_str().unwrap_or("").to_owned();
    let (Some(file), Some(line), Some(column), Some(message)) =
        (file, e["line"].as_u64(), e["column"].as_u64(), e["message"].as_str())
    else {
        return server_text();
    };
    let mut out = if line == 0 { format!("{file}: ") } else { format!("{file}:{line}:{column}: ") };
    if let Some(field) = e["field"].as_str().filter(|f| !f.is_empty()) {
        let _ = write!(out, "field `{field}`: ");
    }
    out.push_str(message);
    out
}

/// The innermost I/O error's kind in words ("connection refused"), else the error's text.
fn io_reason(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut last = e.to_string();
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.kind().to_string();
        }
        last = err.to_string();
        cur = err.source();
    }
    last
}
