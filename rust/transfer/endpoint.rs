//! The arguments of a transport endpoint (the Python package's NIXL endpoint), checked before an
//! agent is created or anything moves: the agent's name (the handshake's rule), the backends to
//! create, the network interfaces the transport may use, and a pull's timeout.

use super::handshake::check_agent_name;
use crate::error::{Error, Result};

/// The longest pull timeout, in seconds (a week): a larger value is a unit mistake.
pub const MAX_TIMEOUT_S: f64 = 7.0 * 24.0 * 3600.0;

/// The interface list meaning "every interface" (the transport's own choice); only alone.
pub const ALL_INTERFACES: &str = "all";

fn bad(m: impl Into<String>) -> Error {
    Error::binding(m)
}

/// Checks an endpoint's `name` (as a peer's handshake checks it: not blank, no control
/// characters), `backends` (at least one, each a non-blank name without control characters, none
/// twice) and `interfaces` (interface names or addresses, blank items dropped: at least one, none
/// with control characters or a comma, [`ALL_INTERFACES`] only alone). Returns the interfaces
/// without the blank items. Errors name the argument.
pub fn check_endpoint(name: &str, backends: &[String], interfaces: &[String]) -> Result<Vec<String>> {
    check_agent_name(name).map_err(|m| bad(format!("name: {m}")))?;
    if backends.is_empty() {
        return Err(bad("backends: give at least one NIXL backend (\"UCX\" moves CPU and CUDA memory)"));
    }
    for (i, b) in backends.iter().enumerate() {
        if b.trim().is_empty() || b.chars().any(char::is_control) {
            return Err(bad(format!("backends[{i}] = {b:?} must be a backend name (not blank, no control characters)")));
        }
        if backends[..i].contains(b) {
            return Err(bad(format!("backends[{i}] = {b:?} is named twice")));
        }
    }
    let items: Vec<String> = interfaces.iter().map(|x| x.trim().to_string()).filter(|x| !x.is_empty()).collect();
    if items.is_empty() {
        return Err(bad(format!("interfaces: give at least one interface name or address (or '{ALL_INTERFACES}')")));
    }
    for (i, x) in items.iter().enumerate() {
        if x.chars().any(|c| c.is_control() || c == ',') {
            return Err(bad(format!("interfaces[{i}] = {x:?} must be one interface name or address (no commas, no control characters)")));
        }
        if x == ALL_INTERFACES && items.len() > 1 {
            return Err(bad(format!("interfaces: '{ALL_INTERFACES}' (every interface) cannot be listed with others, got {items:?}")));
        }
    }
    Ok(items)
}

/// Checks a pull's `timeout`: a finite number of seconds, more than 0 and at most
/// [`MAX_TIMEOUT_S`].
pub fn check_timeout(timeout: f64) -> Result<()> {
    if !timeout.is_finite() || timeout <= 0.0 || timeout > MAX_TIMEOUT_S {
        return Err(Error::plan(format!("timeout = {timeout} must be a number of seconds > 0 and <= {MAX_TIMEOUT_S} (a week)")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn good_arguments_pass_and_blank_interfaces_are_dropped() {
        assert_eq!(check_endpoint("dst-0", &s(&["UCX"]), &s(&["lo", " ", "eth0"])).unwrap(), s(&["lo", "eth0"]));
        assert_eq!(check_endpoint("a", &s(&["UCX", "GDS"]), &s(&["all"])).unwrap(), s(&["all"]));
    }

    #[test]
    fn each_bad_argument_is_named() {
        let e = |n: &str, b: &[&str], i: &[&str]| check_endpoint(n, &s(b), &s(i)).unwrap_err().message;
        assert!(e(" ", &["UCX"], &["lo"]).starts_with("name: "));
        assert!(e("a\nb", &["UCX"], &["lo"]).contains("control characters"));
        assert!(e("a", &[], &["lo"]).starts_with("backends: "));
        assert!(e("a", &["UCX", "UCX"], &["lo"]).contains("backends[1] = \"UCX\" is named twice"));
        assert!(e("a", &[""], &["lo"]).starts_with("backends[0]"));
        assert!(e("a", &["UCX"], &[" "]).starts_with("interfaces: give at least one"));
        assert!(e("a", &["UCX"], &["lo,eth0"]).starts_with("interfaces[0]"));
        assert!(e("a", &["UCX"], &["lo", "all"]).contains("cannot be listed with others"));
    }

    #[test]
    fn a_timeout_is_finite_positive_and_at_most_a_week() {
        assert!(check_timeout(0.05).is_ok() && check_timeout(MAX_TIMEOUT_S).is_ok());
        for t in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_TIMEOUT_S * 2.0] {
            assert!(check_timeout(t).unwrap_err().message.starts_with("timeout = "), "{t}");
        }
    }
}
