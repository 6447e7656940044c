//! The naming endpoints from the environment (GlassFish's `com.sun.appserv.iiop.endpoints`):
//! [`NAMING_ENDPOINTS_ENV`] holds `host:port,host:port`, read by [`crate::Builder::connect`]
//! when the builder was given no endpoint, and by `rondo ctl` and `rondo agent` when their
//! `--naming` flag is absent. One parser for all of them, so a list that one accepts the others
//! accept too.

/// The variable: a comma-separated list of naming endpoints, each `host:port`,
/// `http://host:port` or `https://host:port`.
pub const NAMING_ENDPOINTS_ENV: &str = "RONDO_NAMING_ENDPOINTS";

/// Most endpoints one list may hold (a list longer than this is a mistake, not a tier).
pub const MAX_ENDPOINTS: usize = 64;

/// Splits and checks an endpoint list (`host:port,host:port`; blanks around commas ignored):
/// the endpoints in order, or why the list is malformed (an empty entry, a scheme other than
/// `http` or `https`, no port, more than 64).
pub fn parse_endpoints(list: &str) -> Result<Vec<String>, String> {
    if list.trim().is_empty() {
        return Err("the list is empty".to_owned());
    }
    let mut out = Vec::new();
    for (i, item) in list.split(',').enumerate() {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!("entry {} is empty", i + 1));
        }
        if out.len() == MAX_ENDPOINTS {
            return Err(format!("more than {MAX_ENDPOINTS} endpoints"));
        }
        check_endpoint(item).map_err(|why| format!("entry {} `{item}`: {why}", i + 1))?;
        out.push(item.to_owned());
    }
    Ok(out)
}

/// Whether `item` is `host:port`, `http://host:port` or `https://host:port` (a trailing `/`
/// allowed), the forms [`crate::NamingClient`] takes.
fn check_endpoint(item: &str) -> Result<(), String> {
    let rest = item.trim_end_matches('/');
    let rest = match (rest.strip_prefix("http://"), rest.strip_prefix("https://")) {
        (Some(r), _) | (None, Some(r)) => r,
        (None, None) if rest.contains("://") => {
            return Err("the scheme must be http or https".to_owned());
        }
        (None, None) => rest,
    };
    let authority: http::uri::Authority = rest.parse().map_err(|_| "not host:port".to_owned())?;
    if authority.host().is_empty() {
        return Err("no host".to_owned());
    }
    match authority.port_u16() {
        Some(0) => Err("port 0".to_owned()),
        Some(_) => Ok(()),
        None if rest.rsplit_once(':').is_some_and(|(_, p)| p.parse::<u64>().is_ok()) => {
            Err("the port is not 1 to 65535".to_owned())
        }
        None => Err("no port (write host:port)".to_owned()),
    }
}

/// The endpoints of [`NAMING_ENDPOINTS_ENV`]: `Ok(None)` when it is unset or empty, the list
/// when it parses, else the error naming the variable and its value.
pub fn endpoints_from_env() -> Result<Option<Vec<String>>, String> {
    match std::env::var(NAMING_ENDPOINTS_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("{NAMING_ENDPOINTS_ENV} is not valid UTF-8"))
        }
        Ok(v) if v.trim().is_empty() => Ok(None),
        Ok(v) => parse_endpoints(&v)
            .map(Some)
            .map_err(|why| format!("{NAMING_ENDPOINTS_ENV}=`{v}`: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_keeps_its_order_and_takes_every_form() {
        assert_eq!(
            parse_endpoints(" 127.0.0.1:7070, http://n2:80/ ,https://[::1]:443").unwrap(),
            ["127.0.0.1:7070", "http://n2:80/", "https://[::1]:443"]
        );
    }

    #[test]
    fn a_malformed_list_says_which_entry() {
        for (list, why) in [
            ("", "the list is empty"),
            ("a:1,,b:2", "entry 2 is empty"),
            ("a:1,b", "entry 2 `b`: no port"),
            ("ftp://a:1", "entry 1 `ftp://a:1`: the scheme must be http or https"),
            ("a:0", "entry 1 `a:0`: port 0"),
            ("a b:1", "entry 1 `a b:1`: not host:port"),
            ("a:99999", "entry 1 `a:99999`: the port is not 1 to 65535"),
        ] {
            let e = parse_endpoints(list).unwrap_err();
            assert!(e.starts_with(why), "{list:?}: {e}");
        }
        let long = vec!["a:1"; MAX_ENDPOINTS + 1].join(",");
        assert!(parse_endpoints(&long).unwrap_err().contains("more than 64"));
    }
}
