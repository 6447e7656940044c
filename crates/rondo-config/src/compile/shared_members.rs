//! `[member.NAME]`: members defined once and listed by name in several clusters' `members`
//! (SGD's application server in several load-balancing groups). Each table is checked here,
//! at its own field paths; a cluster's entry naming one is checked where the cluster's members
//! are (duplicates within the cluster, an unknown name). A member's own fields are checked
//! here for both kinds ([`member_spec`]).

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
        let spec = member_spec(c, &p, name, &m.address, m.weight, &m.group, &m.state);
        out.insert(name.clone(), spec);
    }
    out
}

/// A member's `weight`, `group` and `state` at `p` (a cluster's `members[i]` or a
/// `[member.NAME]`), with its name and address as written.
pub(super) fn member_spec(
    c: &mut Compiler<'_>,
    p: &FieldPath,
    name: &str,
    address: &str,
    weight: Option<u64>,
    group: &Option<String>,
    state: &Option<String>,
) -> MemberSpec {
    let weight = c.int(p.key("weight"), weight, DEFAULT_WEIGHT, 1, MAX_WEIGHT);
    if let Some(g) = group
        && g.is_empty()
    {
        c.err(p.key("group"), "group must not be empty");
    }
    let admin = match state.as_deref() {
        None => AdminState::default(),
        Some(s) => AdminState::parse(s).unwrap_or_else(|| {
            let all = ADMIN_STATES.map(AdminState::as_str);
            c.err(p.key("state"), format!("unknown state `{s}`, expected {}", one_of(all)));
            AdminState::default()
        }),
    };
    MemberSpec {
        name: name.to_owned(),
        address: address.to_owned(),
        weight: u32::try_from(weight).unwrap_or(1),
        group: group.clone(),
        admin,
    }
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

/// Default `[tier] interval_ms`: the load view's publication period.
const DEFAULT_TIER_INTERVAL: Duration = Duration::from_millis(100);

/// `[tier]`: the NATS server, the subject, the period.
pub(super) fn compile_tier(c: &mut Compiler<'_>, t: &crate::raw::RawTier) -> crate::TierSpec {
    let p = FieldPath::root().key("tier");
    let authority = t.nats.strip_prefix("nats://").unwrap_or("");
    if authority.is_empty() {
        c.err(p.key("nats"), format!("`{}` is not a NATS URL, expected nats://HOST:PORT", t.nats));
    } else if let Err(msg) = check_host_port(authority) {
        c.err(p.key("nats"), msg);
    }
    let name = t.name.as_deref().unwrap_or("default");
    let token = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if name.is_empty() || !token(name) {
        c.err(p.key("name"), format!("tier name `{name}` must be letters, digits, `-` or `_`"));
    }
    let default = DEFAULT_TIER_INTERVAL.as_millis() as u64;
    let ms = c.int(p.key("interval_ms"), t.interval_ms, default, 10, 10_000);
    crate::TierSpec {
        nats: t.nats.clone(),
        subject: format!("rondo.tier.{name}.load"),
        interval: Duration::from_millis(ms),
    }
}
