//! A cluster's `retry`: attempts, backoff, the per-try timeout and the retry budget, and
//! `retry_on` with `grpc_failure_codes`, which say which HTTP statuses and gRPC codes count.

use rondo_core::grpc::{Code, Codes, GrpcPolicy};
use rondo_core::{Backoff, StatusSet};

use super::*;
use crate::raw::RawRetry;

/// `retry`: attempts, the per-try timeout and the retry budget.
pub(super) fn retry(c: &mut Compiler<'_>, path: &FieldPath, r: &RawRetry) -> RetryPolicy {
    let p = path.key("retry");
    let rd = RetryPolicy::default();
    let statuses = r.retry_on.as_deref().map_or(StatusSet::EMPTY, |names| {
        let (_, statuses, problems) = retry_on(names);
        for (i, message) in problems {
            c.err(p.key("retry_on").index(i), message);
        }
        statuses
    });
    let backoff = r.backoff.as_ref().map(|b| {
        let bp = p.key("backoff");
        let base = c.ms(bp.key("base_ms"), b.base_ms, Duration::from_millis(25), false);
        let max = c.ms(bp.key("max_ms"), b.max_ms, base * 10, false);
        if max < base {
            c.err(bp.key("max_ms"), "backoff max must be at least its base");
        }
        Backoff { base, max }
    });
    let buffer_bytes = c.int(
        p.key("retry_buffer_bytes"),
        r.retry_buffer_bytes,
        u64::from(RetryPolicy::DEFAULT_BUFFER_BYTES),
        0,
        16 << 20,
    );
    let hedge = r.hedge.as_ref().map(|h| super::hedge::hedge(c, &p, h, r));
    RetryPolicy {
        hedge,
        statuses,
        backoff,
        non_idempotent: r.retry_non_idempotent.unwrap_or(false),
        buffer_bytes: u32::try_from(buffer_bytes).unwrap_or(RetryPolicy::DEFAULT_BUFFER_BYTES),
        attempts: c.u32(p.key("attempts"), r.attempts, rd.attempts, 1),
        per_try_timeout: r
            .per_try_timeout_ms
            .map(|ms| c.ms(p.key("per_try_timeout_ms"), Some(ms), Duration::ZERO, false))
            .or(rd.per_try_timeout),
        budget_percent: c.percent(p.key("budget_percent"), r.budget_percent, rd.budget_percent, 0),
        budget_min_per_sec: c.u32(
            p.key("budget_min_per_sec"),
            r.budget_min_per_sec,
            rd.budget_min_per_sec,
            0,
        ),
    }
}

/// `grpc_failure_codes` and `retry.retry_on`: how the cluster's gRPC answers count.
pub(super) fn grpc_policy(c: &mut Compiler<'_>, path: &FieldPath, rc: &RawCluster) -> GrpcPolicy {
    let d = GrpcPolicy::default();
    let failure_codes = rc
        .grpc_failure_codes
        .as_deref()
        .map_or(d.failure_codes, |names| grpc_codes(c, &path.key("grpc_failure_codes"), names));
    let retry_on = match rc.retry.as_ref().and_then(|r| r.retry_on.as_deref()) {
        None => d.retry_on,
        Some(names) => retry_on(names).0,
    };
    GrpcPolicy { failure_codes, retry_on }
}

/// `retry.retry_on`: gRPC status names, and the HTTP conditions `5xx`, `gateway-error` and
/// `retriable-status:N`; and the problems, by index (reported once, by [`retry()`]).
fn retry_on(names: &[String]) -> (Codes, StatusSet, Vec<(usize, String)>) {
    let mut codes = Vec::with_capacity(names.len());
    let mut statuses = StatusSet::EMPTY;
    let mut problems = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match name.as_str() {
            "5xx" => statuses = (500..=599).fold(statuses, StatusSet::with),
            "gateway-error" => statuses = (502..=504).fold(statuses, StatusSet::with),
            "connect-failure" | "reset" => problems.push((
                i,
                format!(
                    "`{name}` is always retried when the request can be sent again: leave it out \
                     (retry_on adds the statuses and gRPC codes that are retried too)"
                ),
            )),
            _ => match (name.strip_prefix("retriable-status:"), Code::parse(name)) {
                (Some(n), _) => match n.parse::<u16>() {
                    Ok(s) if (100..=599).contains(&s) => statuses = statuses.with(s),
                    _ => problems.push((i, format!("`{n}` is not an HTTP status (100-599)"))),
                },
                (None, Some(code)) => codes.push(code),
                (None, None) => problems.push((
                    i,
                    format!(
                        "unknown retry_on `{name}`, expected `5xx`, `gateway-error`, \
                         `retriable-status:N` or a grpc status: {}",
                        one_of(Code::NAMES)
                    ),
                )),
            },
        }
    }
    (Codes::of(&codes), statuses, problems)
}

/// A list of gRPC status codes by name, each unknown name an error at its own index.
fn grpc_codes(c: &mut Compiler<'_>, path: &FieldPath, names: &[String]) -> Codes {
    let mut codes = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        match Code::parse(name) {
            Some(code) => codes.push(code),
            None => c.err(
                path.index(i),
                format!("unknown grpc status `{name}`, expected {}", one_of(Code::NAMES)),
            ),
        }
    }
    Codes::of(&codes)
}
