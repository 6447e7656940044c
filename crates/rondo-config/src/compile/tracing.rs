//! `[tracing]`: where spans are exported (an OTLP/HTTP collector), under which service name,
//! how many new traces are sampled, the export requests' header fields and timeout, and how many
//! finished spans may wait for export.

use super::*;

use crate::raw::RawTracing;
use crate::spec::TracingSpec;

/// The path every OTLP/HTTP trace export is posted to, below the endpoint.
const TRACES_PATH: &str = "/v1/traces";

/// Compiles `[tracing]`; `None` after an error.
pub(super) fn compile_tracing(c: &mut Compiler<'_>, raw: &RawTracing) -> Option<TracingSpec> {
    let before = c.problems.len();
    let path = FieldPath::root().key("tracing");
    let endpoint = endpoint(c, path.key("otlp_endpoint"), &raw.otlp_endpoint);
    let service_name = raw.service_name.as_deref().unwrap_or(TracingSpec::DEFAULT_SERVICE_NAME);
    if service_name.is_empty()
        || service_name.len() > 255
        || service_name.chars().any(char::is_control)
    {
        c.err(
            path.key("service_name"),
            "service_name must be 1 to 255 characters, none of them a control character",
        );
    }
    let sample_ratio = raw.sample_ratio.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&sample_ratio) {
        c.err(
            path.key("sample_ratio"),
            format!("sample_ratio must be between 0.0 and 1.0, got {sample_ratio}"),
        );
    }
    let mut headers = Vec::new();
    for (name, value) in raw.headers.iter().flatten() {
        let at = path.key("headers").key(name);
        if let Some(why) = bad_header(name, value) {
            c.err(at, why);
        } else {
            headers.push((name.to_ascii_lowercase(), value.clone()));
        }
    }
    let export_timeout = c.ms(
        path.key("export_timeout_ms"),
        raw.export_timeout_ms,
        TracingSpec::DEFAULT_EXPORT_TIMEOUT,
        false,
    );
    if export_timeout > Duration::from_secs(300) {
        c.err(path.key("export_timeout_ms"), "export_timeout_ms must be at most 300000 (5m)");
    }
    let max_queue = c.int(
        path.key("max_queue"),
        raw.max_queue,
        TracingSpec::DEFAULT_MAX_QUEUE as u64,
        1,
        TracingSpec::MAX_MAX_QUEUE as u64,
    ) as usize;
    (c.problems.len() == before).then(|| TracingSpec {
        endpoint: endpoint.unwrap_or_default(),
        service_name: service_name.to_owned(),
        sample_ratio,
        headers,
        export_timeout,
        max_queue,
    })
}

/// The URL exports are posted to: `otlp_endpoint` with `/v1/traces` (unless it ends so already).
/// Plain `http://` only: the exporter's client has no TLS of its own (docs/tracing.md).
fn endpoint(c: &mut Compiler<'_>, path: FieldPath, raw: &str) -> Option<String> {
    let Some(rest) = raw.strip_prefix("http://") else {
        let why = if raw.starts_with("https://") {
            "otlp_endpoint must be an http:// URL: the exporter speaks no TLS (send to a \
             collector or agent on the host or in the pod)"
        } else {
            "otlp_endpoint must be an http:// URL, e.g. \"http://127.0.0.1:4318\""
        };
        c.err(path, why);
        return None;
    };
    let authority = rest.split('/').next().unwrap_or("");
    let fine = !authority.is_empty()
        && !rest.contains(['?', '#', ' ', '@'])
        && rest.bytes().all(|b| b.is_ascii_graphic());
    if !fine {
        c.err(
            path,
            format!(
                "`{}` is not an http:// URL with a host (and no user, query or fragment)",
                raw.escape_debug()
            ),
        );
        return None;
    }
    let base = raw.trim_end_matches('/');
    Some(if base.ends_with(TRACES_PATH) { base.to_owned() } else { format!("{base}{TRACES_PATH}") })
}

/// Why a header field of `headers` cannot be sent, if it cannot.
fn bad_header(name: &str, value: &str) -> Option<String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Some(format!("`{}` is not a header field name", name.escape_debug()));
    }
    let own = ["content-type", "content-length", "content-encoding", "host", "transfer-encoding"];
    if own.iter().any(|o| name.eq_ignore_ascii_case(o)) {
        return Some(format!("`{name}` is the exporter's own to set"));
    }
    if !value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
        return Some(format!("the value of `{name}` must be visible ASCII, spaces and tabs"));
    }
    None
}
