//! The process's own figures for `/metrics`: CPU seconds, resident and virtual memory, open and
//! allowed file descriptors, threads and start time, read from `/proc/self` when scraped (the
//! `prometheus-client` crate has no process collector). The names are the ones every Prometheus
//! client library uses (`process_cpu_seconds_total`...), without rondo's prefix, so existing
//! dashboards and alerts work unchanged.
//!
//! Linux only: elsewhere, or when a file cannot be read, the figure is left out rather than
//! shown as a wrong zero.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second of `/proc`'s CPU times. `USER_HZ` is 100 on every Linux architecture
/// (the kernel scales to it for user space); Prometheus' own procfs reader assumes the same.
const USER_HZ: f64 = 100.0;

/// The process's figures, each `None` when it could not be read.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size, bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory size, bytes.
    pub virtual_bytes: Option<u64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit on open file descriptors.
    pub max_fds: Option<u64>,
    /// Threads.
    pub threads: Option<u64>,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
}

impl ProcessStats {
    /// Reads `/proc/self` now.
    pub fn read() -> ProcessStats {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let stat = stat.as_deref().and_then(parse_stat);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kib = |key| status_value(&status, key).map(|k| k.saturating_mul(1024));
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| boot_time(&s));
        let limits = std::fs::read_to_string("/proc/self/limits").ok();
        ProcessStats {
            cpu_seconds: stat.map(|s| (s.utime + s.stime) as f64 / USER_HZ),
            resident_bytes: kib("VmRSS:"),
            virtual_bytes: kib("VmSize:"),
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64),
            max_fds: limits.as_deref().and_then(max_open_files),
            threads: status_value(&status, "Threads:"),
            start_time_seconds: match (stat, boot) {
                (Some(s), Some(b)) => Some(b as f64 + s.start_ticks as f64 / USER_HZ),
                _ => None,
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
}

/// `utime`, `stime` and `starttime` of `/proc/self/stat` (fields 14, 15 and 22; the command
/// name in field 2 may hold spaces and parentheses, so fields are counted after the last `)`).
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (the state).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat { utime: field(14)?, stime: field(15)?, start_ticks: field(22)? })
}

/// The number after `key` in `/proc/self/status` (`VmRSS:   1234 kB` gives 1234).
fn status_value(status: &str, key: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

/// `btime` of `/proc/stat`: the boot time, seconds since the Unix epoch.
fn boot_time(stat: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()
}

/// The soft limit of `Max open files` in `/proc/self/limits` (`None` when unlimited).
fn max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// Encodes [`ProcessStats::read`] at every scrape.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = ProcessStats::read();
        if let Some(v) = s.cpu_seconds {
            let c = ConstCounter::new(v);
            let help = "Total user and system CPU time spent in seconds";
            c.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                help,
                None,
                c.metric_type(),
            )?)?;
        }
        let int = |v: Option<u64>| v.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        let gauges: [(&str, &str, Option<i64>); 5] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                int(s.resident_bytes),
            ),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes", int(s.virtual_bytes)),
            ("process_open_fds", "Number of open file descriptors", int(s.open_fds)),
            ("process_max_fds", "Maximum number of open file descriptors", int(s.max_fds)),
            ("process_threads", "Number of OS threads in the process", int(s.threads)),
        ];
        for (name, help, value) in gauges {
            let Some(v) = value else { continue };
            let g = ConstGauge::new(v);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        if let Some(v) = s.start_time_seconds {
            let g = ConstGauge::new(v);
            let help = "Start time of the process since unix epoch in seconds";
            let d = encoder.encode_descriptor(
                "process_start_time_seconds",
                help,
                None,
                g.metric_type(),
            )?;
            g.encode(d)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis, as `/proc/self/stat` can show.
        let text = "4242 (ro (ndo) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 75 0 0 20 0 3 0 \
                    123456 1000000 300 18446744073709551615";
        let s = parse_stat(text).expect("parses");
        assert_eq!((s.utime, s.stime, s.start_ticks), (250, 75, 123456));
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn status_limits_and_boot_time_parse() {
        let status = "Name:\trondo\nVmSize:\t  20480 kB\nVmRSS:\t   5120 kB\nThreads:\t3\n";
        assert_eq!(status_value(status, "VmRSS:"), Some(5120));
        assert_eq!(status_value(status, "Threads:"), Some(3));
        assert_eq!(status_value(status, "VmSwap:"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(max_open_files(limits), Some(1024));
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1764480000\nprocesses 9\n"), Some(1_764_480_000));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_plausibly() {
        let s = ProcessStats::read();
        assert!(s.resident_bytes.is_some_and(|r| r > 1 << 20), "{s:?}");
        assert!(s.open_fds.is_some_and(|n| n >= 3), "{s:?}");
        assert!(s.cpu_seconds.is_some_and(|c| c >= 0.0), "{s:?}");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let start = s.start_time_seconds.expect("start time");
        assert!(start <= now + 1.0 && start > now - 86_400.0 * 365.0, "{start} vs {now}");
    }
}
