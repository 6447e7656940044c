//! `[member.NAME]`: members defined once and listed by name in several clusters' `members`
//! (SGD's application server in several load-balancing groups). Each table is checked here,
//! at its own field paths; a cluster's entry naming one is checked where the cluster's members
//! are (duplicates within the cluster, an unknown name).

use super::*;
use crate::raw::RawMemberEntry;

/// Every `[member.NAME]` as the member spec a cluster listing it gets (its name is `NAME`).
pub(super) fn compile_shared_members(
    c: &mut Compiler<'_>,
    raw: &RawConfig,
) -> BTreeMap<String, MemberSpec> {
    let mut out = BTreeMap::new();
    for (name, m) in &raw.member {
        let p = FieldPath::root().key("member").key(name);
        c.name(p.clone(), "member", name);
        if let Err(msg) = check_host_port(&m.address) {
            c.err(p.key("address"), msg);
        }
        let spec = clusters::member_spec(c, &p, name, &m.address, m.weight, &m.group, &m.state);
        out.insert(name.clone(), spec);
    }
    out
}

/// The error of a cluster's `members` entry naming no `[member.NAME]`.
pub(super) fn unknown(name: &str, shared: &BTreeMap<String, MemberSpec>) -> String {
    let expected = if shared.is_empty() {
        format!("a [member.{name}] table, or a member table ({{ name = ..., address = ... }})")
    } else {
        format!("one of {}", one_of(shared.keys().map(String::as_str)))
    };
    format!("unknown member `{name}`, expected {expected}")
}

/// The `[member.NAME]` members two clusters or more list, with those clusters (in name
/// order). A member listed by one cluster is an ordinary member of it.
pub(super) fn listed_by(raw: &RawConfig) -> BTreeMap<String, Vec<String>> {
    let mut by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (cluster, rc) in &raw.cluster {
        for entry in &rc.members {
            if let RawMemberEntry::Shared(name) = entry
                && raw.member.contains_key(name)
            {
                let clusters = by.entry(name.clone()).or_default();
                if clusters.last() != Some(cluster) {
                    clusters.push(cluster.clone());
                }
            }
        }
    }
    by.retain(|_, clusters| clusters.len() > 1);
    by
}
