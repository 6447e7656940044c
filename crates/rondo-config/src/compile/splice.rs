//! A `tcp` or `http` listener's `splice`: whether bytes that need no reading move through a
//! kernel pipe (splice(2), `auto`, the default) or through a userspace buffer (`off`): a tcp
//! session's, or an HTTP/1 body's of known length on the own path. `queue` and `udp` listeners
//! read what they carry (or carry datagrams), so it is refused there.

use super::*;
use crate::spec::Splice;

/// The listener's `splice`: its setting on a `tcp` or `http` listener (default `auto`), `off`
/// elsewhere.
pub(super) fn compile_splice(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    l: &RawListener,
    protocol: ListenerProtocol,
) -> Splice {
    let splices = matches!(protocol, ListenerProtocol::Tcp | ListenerProtocol::Http);
    let Some(s) = l.splice.as_deref() else {
        return if splices { Splice::default() } else { Splice::Off };
    };
    let Some(splice) = Splice::ALL.into_iter().find(|m| m.as_str() == s) else {
        let all = Splice::ALL.map(Splice::as_str);
        c.err(path.key("splice"), format!("unknown splice `{s}`, expected {}", one_of(all)));
        return Splice::Off;
    };
    if !splices {
        c.err(
            path.key("splice"),
            "only tcp and http listeners splice (the others read what they forward)",
        );
        return Splice::Off;
    }
    splice
}
