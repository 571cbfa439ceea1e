//! A trace's requests, checked: what the simulator replays.

use crate::error::{Error, Result};

/// One request of a trace, in arrival order.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRequest {
    pub id: String,
    pub arrival: f64,
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
}

impl TraceRequest {
    /// A request read from `line` (1-based, for messages) of a trace, checked on its own: a
    /// non-empty id, a finite arrival `>= 0`, a non-empty prompt.
    pub fn new(line: usize, id: String, arrival: f64, prompt: Vec<u32>, output: Vec<u32>) -> Result<Self> {
        if id.is_empty() {
            return Err(Error::plan(format!("trace line {line}: \"id\" must be a non-empty string")));
        }
        if !arrival.is_finite() || arrival < 0.0 {
            return Err(Error::plan(format!("trace line {line} (request '{id}'): \"arrival\" = {arrival} must be a finite number >= 0")));
        }
        if prompt.is_empty() {
            return Err(Error::plan(format!("trace line {line} (request '{id}'): \"prompt\" must hold at least one token id")));
        }
        Ok(Self { id, arrival, prompt, output })
    }
}

/// Checks a trace as a whole: at least one request, ids unique, arrivals non-decreasing
/// (requests in arrival order). `lines[i]` is request `i`'s line number, and `name` the trace
/// (`'path'`, or empty), for messages.
pub fn check_trace(reqs: &[TraceRequest], lines: &[usize], name: &str) -> Result<()> {
    if reqs.is_empty() {
        let name = if name.is_empty() { String::new() } else { format!(" {name}") };
        return Err(Error::plan(format!("trace{name} holds no request; a trace needs at least one")));
    }
    let line = |i: usize| lines.get(i).copied().unwrap_or(i + 1);
    let mut seen = std::collections::HashMap::with_capacity(reqs.len());
    for (i, r) in reqs.iter().enumerate() {
        if let Some(first) = seen.insert(r.id.as_str(), i) {
            return Err(Error::plan(format!("trace line {}: request id '{}' repeats line {}", line(i), r.id, line(first))));
        }
        if i > 0 && r.arrival < reqs[i - 1].arrival {
            return Err(Error::plan(format!(
                "trace line {} (request '{}'): arrival {} is before the previous request's {}; a trace lists requests in arrival order",
                line(i),
                r.id,
                r.arrival,
                reqs[i - 1].arrival
            )));
        }
    }
    Ok(())
}
