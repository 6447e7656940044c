//! A `tcp` listener's `splice`: whether its sessions move bytes through a kernel pipe
//! (splice(2), `auto`, the default) or through a userspace buffer (`off`). Other listeners
//! parse HTTP or datagrams and have no use for it, so it is refused there.

use super::*;
use crate::spec::Splice;

/// The listener's `splice`: its setting on a `tcp` listener (default `auto`), `off` elsewhere.
pub(super) fn compile_splice(
    c: &mut Compiler<'_>,
    path: &FieldPath,
    l: &RawListener,
    protocol: ListenerProtocol,
) -> Splice {
    let Some(s) = l.splice.as_deref() else {
        return if protocol == ListenerProtocol::Tcp { Splice::default() } else { Splice::Off };
    };
    let Some(splice) = Splice::ALL.into_iter().find(|m| m.as_str() == s) else {
        let all = Splice::ALL.map(Splice::as_str);
        c.err(path.key("splice"), format!("unknown splice `{s}`, expected {}", one_of(all)));
        return Splice::Off;
    };
    if protocol != ListenerProtocol::Tcp {
        c.err(path.key("splice"), "only tcp listeners splice (the others read what they forward)");
        return Splice::Off;
    }
    splice
}
