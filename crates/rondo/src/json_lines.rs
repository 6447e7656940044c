//! `--log-format json` for the lines `rondo serve` writes itself: its status lines on stdout
//! (`rondo: listener web on ...`) and its refusals on stderr, each turned into one JSON object of
//! the shape the log's JSON lines have (`timestamp`, `level`, `fields.message`, `target`), so a
//! pipeline reading both streams gets one format.

use std::io::{self, Write};

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

/// A writer that emits each complete line written to it as a JSON object on `inner`.
pub struct JsonLines<'a> {
    inner: &'a mut dyn Write,
    level: &'static str,
    target: &'static str,
    pending: Vec<u8>,
}

impl<'a> JsonLines<'a> {
    /// Lines at `level` (`INFO`, `ERROR`) from `target`, written to `inner`.
    pub fn new(inner: &'a mut dyn Write, level: &'static str, target: &'static str) -> Self {
        JsonLines { inner, level, target, pending: Vec::new() }
    }

    fn emit(&mut self, line: &[u8]) -> io::Result<()> {
        let mut timestamp = String::new();
        // The log's own clock and format, so both kinds of line sort together.
        let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
        let object = serde_json::json!({
            "timestamp": timestamp,
            "level": self.level,
            "fields": { "message": String::from_utf8_lossy(line) },
            "target": self.target,
        });
        let mut text = object.to_string();
        text.push('\n');
        self.inner.write_all(text.as_bytes())
    }
}

impl Write for JsonLines<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            self.emit(&line[..end])?;
        }
        Ok(buf.len())
    }

    /// Also writes out a partial line, so nothing written is held back.
    fn flush(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            self.emit(&line)?;
        }
        self.inner.flush()
    }
}

impl Drop for JsonLines<'_> {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_becomes_one_object_and_a_partial_line_waits_for_its_end() {
        let mut out = Vec::new();
        {
            let mut w = JsonLines::new(&mut out, "INFO", "rondo::status");
            write!(w, "rondo: listener web ").unwrap();
            writeln!(w, "on 127.0.0.1:8080\nrondo: \"quoted\"").unwrap();
            write!(w, "tail").unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["fields"]["message"], "rondo: listener web on 127.0.0.1:8080");
        assert_eq!(lines[1]["fields"]["message"], "rondo: \"quoted\"");
        assert_eq!(lines[2]["fields"]["message"], "tail");
        assert_eq!(lines[0]["level"], "INFO");
        assert_eq!(lines[0]["target"], "rondo::status");
        assert!(lines[0]["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{text}");
    }
}
