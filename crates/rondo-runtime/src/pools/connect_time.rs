//! How long hyper's pools took to open a member connection ([`ConnectTime`]), carried as the
//! connection's extra so that the access log's `connect_ms` can name it on the answer of the
//! try that waited for it ([`ConnectTime::opened_during`]).

use std::time::{Duration, Instant};

/// The time a new member connection took to open (TCP, the PROXY header, TLS) and when it was
/// ready, attached by the pools' connectors to the connection and, by hyper-util, to every
/// answer it carries.
#[derive(Debug, Clone, Copy)]
pub struct ConnectTime {
    took: Duration,
    ready: Instant,
}

impl ConnectTime {
    /// A connection opened in `took`, ready now.
    pub(crate) fn new(took: Duration) -> ConnectTime {
        ConnectTime { took, ready: Instant::now() }
    }

    /// How long the connection an answer came on (`extensions` of the response) took to open,
    /// when it became ready after the try `began`: the try waited for it. `None` for a
    /// connection the pool had already.
    pub fn opened_during(extensions: &http::Extensions, began: Instant) -> Option<Duration> {
        let c = extensions.get::<ConnectTime>()?;
        (c.ready >= began).then_some(c.took)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_try_begun_before_the_connection_was_ready_waited_for_it() {
        let mut ext = http::Extensions::new();
        let before = Instant::now();
        assert_eq!(ConnectTime::opened_during(&ext, before), None);
        ext.insert(ConnectTime::new(Duration::from_millis(3)));
        assert_eq!(ConnectTime::opened_during(&ext, before), Some(Duration::from_millis(3)));
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(ConnectTime::opened_during(&ext, Instant::now()), None);
    }
}
