//! The handshake message one rank sends a peer: its transport agent's name and metadata, its
//! layout fingerprint, its pool geometry and the address of block 0 of each (layer, state) tensor.
//! A small text form (UTF-8, one entry a line, the metadata in hex); [`PeerInfo::decode`] checks
//! every field of a peer's message -- framing, numbers, the geometry against the fingerprint, the
//! address ranges -- with checked arithmetic, so a malformed or hostile message is a layout error
//! before anything is registered or read.

use super::fingerprint::{add_bytes, mul_bytes, Fingerprint};
use super::plan::{check_pool, PoolGeometry};
use crate::error::{Error, Result};
use std::fmt::Write;

const MAGIC: &str = "recoverssm-transfer-peer 1";
/// The line after which the fingerprint's own text form follows.
const FINGERPRINT: &str = "fingerprint";
/// The last line: a message without it was truncated.
const END: &str = "end";

/// One rank's handshake message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub name: String,
    pub metadata: Vec<u8>,
    pub fingerprint: Fingerprint,
    pub geometry: PoolGeometry,
    pub addresses: Vec<u64>,
}

fn bad(m: impl std::fmt::Display) -> Error {
    Error::layout(format!("peer handshake: {m}"))
}

/// Checks an agent's name: not blank, no control characters (line breaks would break the
/// message's framing). The error text names the rule, without a prefix.
pub(crate) fn check_agent_name(name: &str) -> std::result::Result<(), String> {
    if name.trim().is_empty() || name.chars().any(char::is_control) {
        return Err(format!("agent name {name:?} must be non-empty and free of control characters (line breaks)"));
    }
    Ok(())
}

impl PeerInfo {
    /// A checked message: see [`PeerInfo::check`].
    pub fn new(name: String, metadata: Vec<u8>, fingerprint: Fingerprint, geometry: PoolGeometry, addresses: Vec<u64>) -> Result<PeerInfo> {
        let p = PeerInfo { name, metadata, fingerprint, geometry, addresses };
        p.check()?;
        Ok(p)
    }

    /// Checks the name (not blank, no control characters), the fingerprint, the geometry against the
    /// fingerprint, and that each (layer, state) tensor has one non-null address whose span
    /// (`(num_blocks - 1) * stride + state bytes`) does not overflow.
    pub fn check(&self) -> Result<()> {
        check_agent_name(&self.name).map_err(bad)?;
        self.fingerprint.check()?;
        check_pool("peer", &self.fingerprint, &self.geometry).map_err(|e| bad(e.message))?;
        let g = &self.geometry;
        if self.addresses.len() != g.block_strides.len() {
            return Err(bad(format!("{} addresses for {} (layer, state) tensors", self.addresses.len(), g.block_strides.len())));
        }
        let ns = self.fingerprint.states.len();
        for (t, (&a, &stride)) in self.addresses.iter().zip(&g.block_strides).enumerate() {
            let st = &self.fingerprint.states[t % ns];
            let span = mul_bytes(g.num_blocks - 1, stride).and_then(|x| add_bytes(x, st.nbytes().ok()?));
            if a == 0 || span.and_then(|n| a.checked_add(n)).is_none() {
                return Err(bad(format!("layer {}, state '{}': address {a:#x} with a span of {span:?} bytes is not a valid range", t / ns, st.name)));
            }
        }
        Ok(())
    }

    /// The text form ([`PeerInfo::decode`] reads it back).
    pub fn encode(&self) -> Vec<u8> {
        let mut o = format!("{MAGIC}\nname {}\nmetadata ", self.name);
        for b in &self.metadata {
            let _ = write!(o, "{b:02x}");
        }
        let join = |v: &[u64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
        let g = &self.geometry;
        let _ = write!(
            o,
            "\ngeometry {} {} {}\naddresses {}\n{FINGERPRINT}\n{}{END}\n",
            g.num_layers,
            g.num_blocks,
            join(&g.block_strides),
            join(&self.addresses),
            self.fingerprint.encode()
        );
        o.into_bytes()
    }

    /// Parses and checks a peer's message; every defect (not UTF-8, a missing or repeated entry,
    /// a malformed number, a truncated message, sizes that overflow) is a layout error.
    pub fn decode(data: &[u8]) -> Result<PeerInfo> {
        let text = std::str::from_utf8(data).map_err(|e| bad(format!("not UTF-8 text ({e})")))?;
        if text.lines().next().map(str::trim) != Some(MAGIC) {
            return Err(bad(format!("not a peer handshake: expected the first line '{MAGIC}'")));
        }
        let text =
            text.strip_suffix(&format!("\n{END}\n")).ok_or_else(|| bad(format!("the message does not end with the line '{END}' (truncated?)")))?;
        let (head, fp) = text.split_once(&format!("\n{FINGERPRINT}\n")).ok_or_else(|| bad(format!("no '{FINGERPRINT}' section (truncated?)")))?;
        let lines = head.lines().skip(1);
        let num = |what: &str, t: &str| t.parse::<u64>().map_err(|_| bad(format!("{what}: '{t}' is not a non-negative integer")));
        let list = |what: &str, t: &str| t.split(',').filter(|x| !x.is_empty()).map(|x| num(what, x)).collect::<Result<Vec<u64>>>();
        let (mut name, mut metadata, mut geometry, mut addresses) = (None, None, None, None);
        for line in lines {
            let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
            let slot_taken = match key {
                "name" => name.replace(rest.to_string()).is_some(),
                "metadata" => metadata.replace(unhex(rest)?).is_some(),
                "geometry" => {
                    let t: Vec<&str> = rest.split(' ').collect();
                    let [l, b, s] = t.as_slice() else {
                        return Err(bad(format!("geometry '{rest}' is not '<layers> <blocks> <strides>'")));
                    };
                    let g = PoolGeometry {
                        num_layers: num("num_layers", l)?,
                        num_blocks: num("num_blocks", b)?,
                        block_strides: list("block stride", s)?,
                    };
                    geometry.replace(g).is_some()
                }
                "addresses" => addresses.replace(list("address", rest)?).is_some(),
                _ => return Err(bad(format!("unrecognised entry '{key}'"))),
            };
            if slot_taken {
                return Err(bad(format!("entry '{key}' is repeated")));
            }
        }
        let missing = |what: &str| bad(format!("no '{what}' entry"));
        PeerInfo::new(
            name.ok_or_else(|| missing("name"))?,
            metadata.ok_or_else(|| missing("metadata"))?,
            Fingerprint::decode(fp).map_err(|e| bad(e.message))?,
            geometry.ok_or_else(|| missing("geometry"))?,
            addresses.ok_or_else(|| missing("addresses"))?,
        )
    }
}

fn unhex(t: &str) -> Result<Vec<u8>> {
    if t.len() % 2 != 0 {
        return Err(bad(format!("metadata has an odd number ({}) of hex digits", t.len())));
    }
    (0..t.len())
        .step_by(2)
        .map(|i| t.get(i..i + 2).and_then(|d| u8::from_str_radix(d, 16).ok()).ok_or_else(|| bad(format!("metadata: not hex at digit {i}"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::ConvLayout;

    fn peer() -> PeerInfo {
        let fp = crate::transfer::test_gdn(2, 1, 1, ConvLayout::SD);
        let strides: Vec<u64> = (0..2).flat_map(|_| fp.states.iter().map(|s| s.nbytes().unwrap() + 8)).collect();
        let g = PoolGeometry { num_layers: 2, num_blocks: 5, block_strides: strides };
        PeerInfo::new("src tp1->tp1 DS-1".into(), vec![0, 1, 254, 255], fp, g, vec![4096, 8192, 12288, 16384]).unwrap()
    }

    #[test]
    fn round_trip() {
        let p = peer();
        assert_eq!(PeerInfo::decode(&p.encode()).unwrap(), p);
    }

    #[test]
    fn malformed_messages_are_layout_errors() {
        let text = String::from_utf8(peer().encode()).unwrap();
        let e = |t: &[u8]| PeerInfo::decode(t).unwrap_err().message;
        assert!(e(&[0xff, 0xfe, 0x00]).contains("not UTF-8"));
        assert!(e(&text.as_bytes()[..text.len() / 2]).contains("truncated"));
        assert!(e(text.replace("name src tp1->tp1 DS-1\n", "").as_bytes()).contains("no 'name' entry"));
        assert!(e(text.replace("name src tp1->tp1 DS-1", "name  ").as_bytes()).contains("must be non-empty"));
        assert!(e(text.replace("metadata 0001feff", "metadata 0001fefg").as_bytes()).contains("not hex"));
        assert!(e(text.replace("addresses 4096,", "addresses -4096,").as_bytes()).contains("'-4096' is not a non-negative integer"));
        assert!(e(text.replace("addresses 4096,8192,", "addresses ").as_bytes()).contains("2 addresses for 4"));
        assert!(e(text.replace("addresses 4096", "addresses 18446744073709551000").as_bytes()).contains("not a valid range"));
        assert!(e(text.replace("geometry 2 5", "geometry 2 4611686018427387904").as_bytes()).contains("overflow"));
        assert!(e(text.replace("name src tp1->tp1 DS-1", "name a\nname x").as_bytes()).contains("'name' is repeated"));
        assert!(e(text.replace("tp 2 1", "tp 2 2").as_bytes()).contains("out of range"));
    }
}
