//! A cluster's `health`: the active check's kind (`http`, `tcp`, `grpc`, `udp`), what each kind
//! asks and expects, and how often and how many answers change a member's state.

use super::*;

/// Parses `200` or `200-399`.
pub(super) fn parse_status_range(s: &str) -> Result<(u16, u16), String> {
    let parse = |t: &str| match t.trim().parse::<u16>() {
        Ok(n) if (100..=599).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{s}` is not a status or status range between 100 and 599, like `200` or `200-399`"
        )),
    };
    let (lo, hi) = match s.split_once('-') {
        Some((a, b)) => (parse(a)?, parse(b)?),
        None => {
            let n = parse(s)?;
            (n, n)
        }
    };
    if lo > hi {
        return Err(format!("`{s}` is an empty range: {lo} is greater than {hi}"));
    }
    Ok((lo, hi))
}

pub(super) fn compile_health(c: &mut Compiler<'_>, path: &FieldPath, h: &RawHealth) -> HealthCheck {
    let hd = HealthCheck::default();
    let http_fields = h.path.is_some() || h.expect_status.is_some();
    let kind = match h.kind.as_deref() {
        None if h.grpc.is_some() => "grpc",
        None if h.udp.is_some() => "udp",
        None if http_fields => "http",
        None => "tcp",
        Some(k @ ("http" | "tcp" | "grpc" | "udp")) => k,
        Some(other) => {
            c.err(
                path.key("kind"),
                format!("unknown health check kind `{other}`, expected {}", one_of(HEALTH_KINDS)),
            );
            if http_fields { "http" } else { "tcp" }
        }
    };
    if kind != "http" {
        for (field, set) in
            [("path", h.path.is_some()), ("expect_status", h.expect_status.is_some())]
        {
            if set {
                c.err(path.key(field), "only applies to health checks of kind `http`");
            }
        }
    }
    if kind != "grpc" && h.grpc.is_some() {
        c.err(path.key("grpc"), "only applies to health checks of kind `grpc`");
    }
    if kind != "udp" && h.udp.is_some() {
        c.err(path.key("udp"), "only applies to health checks of kind `udp`");
    }
    let kind = match kind {
        "http" => {
            let p = h.path.clone().unwrap_or_else(|| DEFAULT_HEALTH_PATH.to_owned());
            if !p.starts_with('/') {
                c.err(path.key("path"), format!("`{p}` must start with `/`"));
            }
            let (expect_min, expect_max) = match h.expect_status.as_deref().map(parse_status_range)
            {
                None => DEFAULT_EXPECT_STATUS,
                Some(Ok(r)) => r,
                Some(Err(msg)) => {
                    c.err(path.key("expect_status"), msg);
                    DEFAULT_EXPECT_STATUS
                }
            };
            HealthCheckKind::Http { path: p, expect_min, expect_max }
        }
        "grpc" => {
            let service = h.grpc.as_ref().and_then(|g| g.service.clone()).unwrap_or_default();
            if service.chars().any(|ch| ch.is_control()) {
                c.err(path.key("grpc").key("service"), "must not contain control characters");
            }
            HealthCheckKind::Grpc { service }
        }
        "udp" => super::udp::health_udp(c, path, h.udp.as_ref()),
        _ => HealthCheckKind::Tcp,
    };
    HealthCheck {
        kind,
        interval: c.ms(path.key("interval_ms"), h.interval_ms, hd.interval, false),
        timeout: c.ms(path.key("timeout_ms"), h.timeout_ms, hd.timeout, false),
        rise: c.u32(path.key("rise"), h.rise, hd.rise, 1),
        fall: c.u32(path.key("fall"), h.fall, hd.fall, 1),
        port: super::udp::health_port(c, path, h.port),
    }
}
