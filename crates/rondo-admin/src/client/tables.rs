//! How `rondo ctl` prints the admin API's answers: the status, shadow, queue and dead-letter
//! tables, and one dead letter in full.

use std::fmt::Write as _;

use serde_json::Value;

/// The HEALTH cell: what the health checks say (`up`, `unchecked` when nothing checks the
/// member, `down(<last probe failure>)`, or `down(<who>)` when the registry or an operator set it).
fn health_cell(m: &Value) -> String {
    match m["health"].as_str() {
        Some("down") => match m["last_probe_failure"].as_str() {
            Some(why) if m["health_by"] == "health-check" => format!("down({why})"),
            _ => format!("down({})", m["health_by"].as_str().unwrap_or("?")),
        },
        Some(word) => word.to_owned(),
        // An older router's answer.
        None if m["healthy"].as_bool() == Some(true) => "up".to_owned(),
        None => "down".to_owned(),
    }
}

/// The TRAFFIC cell: `yes`, `no(<reason>)`, or `yes(panic:<reason>)` for an unhealthy member
/// that panic mode keeps in rotation.
fn traffic_cell(m: &Value) -> String {
    let reason = m["reason"].as_str();
    let reason = match (reason, m["ejected_until_ms"].as_u64()) {
        (Some("ejected"), Some(ms)) => Some(format!("ejected {ms}ms")),
        (r, _) => r.map(str::to_owned),
    };
    match (m["eligible"].as_bool(), reason) {
        (Some(true), None) => "yes".to_owned(),
        (Some(true), Some(r)) => format!("yes(panic:{r})"),
        (Some(false), Some(r)) => format!("no({r})"),
        (Some(false), None) => "no".to_owned(),
        (None, _) => "-".to_owned(),
    }
}

/// `n` of `of` as a percentage with one decimal (`-` of nothing).
fn percent(n: u64, of: u64) -> String {
    if of == 0 { "-".to_owned() } else { format!("{:.1}%", n as f64 * 100.0 / of as f64) }
}

/// Rows as aligned columns (two spaces apart, no trailing blanks).
fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| rows.iter().filter_map(|r| r.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> =
            r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// A shadow report (`GET /api/v1/clusters/{cluster}/shadow`) as text: what was compared, the
/// picks that would have gone to failed and to slow members on each side, and a row per member.
pub fn shadow_table(v: &Value) -> String {
    let n = |x: &Value| x.as_u64().unwrap_or(0);
    let decisions = n(&v["decisions"]);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let age = now_ms.saturating_sub(n(&v["since_unix_ms"])) as f64 / 1000.0;
    let mut out = format!(
        "cluster {}: shadow {} beside live {} for {age:.1} s: {decisions} picks compared, {} \
         differed ({})\n",
        v["cluster"].as_str().unwrap_or("?"),
        v["shadow"].as_str().unwrap_or("?"),
        v["live"].as_str().unwrap_or("?"),
        n(&v["differed"]),
        percent(n(&v["differed"]), decisions),
    );
    let (live, shadow) = (&v["live_total"], &v["shadow_total"]);
    for (what, key) in [("failed", "failed"), ("slow", "slow")] {
        let _ = writeln!(
            out,
            "would have gone to {what} members: shadow {} ({}), live {} ({})",
            n(&shadow[key]),
            percent(n(&shadow[key]), decisions),
            n(&live[key]),
            percent(n(&live[key]), decisions),
        );
    }
    if n(&v["no_pick"]) > 0 {
        let _ = writeln!(out, "the shadow found no member for {} picks", n(&v["no_pick"]));
    }
    let head = [
        "MEMBER",
        "LIVE",
        "LIVE-%",
        "SHADOW",
        "SHADOW-%",
        "AGREED",
        "FAILED(L/S)",
        "SLOW(L/S)",
        "P90-MS",
        "SLOW",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for m in v["members"].as_array().into_iter().flatten() {
        let name = match m["name"].as_str() {
            Some("") | None => "(departed)".to_owned(),
            Some(name) => name.to_owned(),
        };
        let (l, s) = (&m["live"], &m["shadow"]);
        rows.push(vec![
            name,
            n(&l["picks"]).to_string(),
            percent(n(&l["picks"]), decisions),
            n(&s["picks"]).to_string(),
            percent(n(&s["picks"]), decisions),
            n(&m["agreed"]).to_string(),
            format!("{}/{}", n(&l["failed"]), n(&s["failed"])),
            format!("{}/{}", n(&l["slow"]), n(&s["slow"])),
            m["window_p90_us"]
                .as_u64()
                .map_or("-".into(), |us| format!("{:.1}", us as f64 / 1000.0)),
            if m["slow"].as_bool() == Some(true) { "yes" } else { "no" }.to_owned(),
        ]);
    }
    out.push_str(&aligned(&rows));
    let _ = writeln!(
        out,
        "failed: the member's next request to end failed; slow: picked while the member's p90 over \
         a {} s window was above {}x the median of the members' p90s (P90-MS: this window's)",
        n(&v["window_ms"]) / 1000,
        v["slow_factor"].as_f64().unwrap_or(0.0),
    );
    out
}

/// The status answer as an aligned table, one row per member.
pub fn status_table(v: &Value) -> String {
    let head = [
        "CLUSTER",
        "MEMBER",
        "ADDRESS",
        "WEIGHT",
        "GROUP",
        "STATE(BY)",
        "HEALTH",
        "TRAFFIC",
        "IN-FLIGHT",
        "SESSIONS",
        "EWMA-MS",
        "RANK",
        "CPU",
        "MEM-MIB",
    ];
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    let text = |x: &Value| match x {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for c in v["clusters"].as_array().into_iter().flatten() {
        for m in c["members"].as_array().into_iter().flatten() {
            let health = health_cell(m);
            let traffic = traffic_cell(m);
            let agent = &m["agent"];
            rows.push(vec![
                text(&c["name"]),
                text(&m["name"]),
                text(&m["address"]),
                text(&m["weight"]),
                text(&m["group"]),
                format!("{}({})", text(&m["admin"]), text(&m["admin_by"])),
                health,
                traffic,
                text(&m["in_flight"]),
                text(&m["sessions"]),
                m["ewma_us"].as_u64().map_or("-".into(), |us| format!("{:.1}", us as f64 / 1000.0)),
                text(&m["rank"]),
                agent["cpu_percent"].as_f64().map_or("-".into(), |p| format!("{p:.0}%")),
                text(&agent["free_mib"]),
            ]);
        }
    }
    let mut out = format!("view {}\n", v["view"]);
    out.push_str(&aligned(&rows));
    for c in v["clusters"].as_array().into_iter().flatten() {
        if let (Some(name), Some(shadow)) = (c["name"].as_str(), c["shadow"].as_str()) {
            let _ = writeln!(
                out,
                "shadow: {name} evaluates {shadow} beside {} (rondo ctl shadow {name})",
                c["algorithm"].as_str().unwrap_or("?")
            );
        }
    }
    out
}

fn cell(x: &Value) -> String {
    match x {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `rondo ctl queue status`: one row per queue.
pub fn queue_table(v: &Value) -> String {
    let list = v["queues"].as_array().map(Vec::as_slice).unwrap_or_default();
    if list.is_empty() {
        return "no queues\n".to_owned();
    }
    let head = [
        "QUEUE",
        "BACKEND",
        "DEPTH",
        "OLDEST-MS",
        "IN-DELIVERY",
        "DEAD",
        "BYTES",
        "ACCEPTED",
        "DELIVERED",
        "RETRIED",
        "REJECTED",
    ];
    let mut rows = vec![head.iter().map(|s| s.to_string()).collect::<Vec<_>>()];
    for q in list {
        let rejected = q["rejected_full"].as_u64().unwrap_or(0)
            + q["rejected_too_large"].as_u64().unwrap_or(0);
        rows.push(vec![
            cell(&q["name"]),
            cell(&q["backend"]),
            cell(&q["depth"]),
            cell(&q["oldest_age_ms"]),
            cell(&q["in_delivery"]),
            cell(&q["dead_letters"]),
            cell(&q["bytes"]),
            cell(&q["accepted"]),
            cell(&q["delivered"]),
            cell(&q["retried"]),
            rejected.to_string(),
        ]);
    }
    aligned(&rows)
}

/// `rondo ctl queue dead`: one row per dead letter.
pub fn dead_table(v: &Value) -> String {
    let list = v["dead_letters"].as_array().map(Vec::as_slice).unwrap_or_default();
    if list.is_empty() {
        return format!("{}: no dead letters\n", cell(&v["queue"]));
    }
    let mut rows =
        vec![["ID", "ATTEMPTS", "BYTES", "SESSION", "LAST-REASON"].map(str::to_owned).to_vec()];
    for d in list {
        rows.push(vec![
            cell(&d["id"]),
            cell(&d["attempts"]),
            cell(&d["bytes"]),
            cell(&d["session"]),
            cell(&d["last_reason"]),
        ]);
    }
    aligned(&rows)
}

/// `rondo ctl queue show`: a dead letter's facts, its tries, header fields and body.
pub fn dead_letter_text(v: &Value) -> String {
    let mut out = format!(
        "{} {}: {} attempt(s), {} bytes, posted to {}\n",
        cell(&v["queue"]),
        cell(&v["id"]),
        cell(&v["attempts"]),
        cell(&v["bytes"]),
        cell(&v["path"])
    );
    if let Some(s) = v["session"].as_str() {
        let _ = writeln!(out, "session {s}");
    }
    out.push_str("tries:\n");
    for t in v["tries"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "  {}. {}", cell(&t["attempt"]), cell(&t["reason"]));
    }
    out.push_str("header fields:\n");
    for h in v["headers"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "  {}: {}", cell(&h[0]), cell(&h[1]));
    }
    let _ = writeln!(out, "body:\n{}", v["body"].as_str().unwrap_or(""));
    out
}
