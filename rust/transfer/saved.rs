//! Saved states on disk: the rules of the file format (safetensors framing: an 8-byte
//! little-endian header length, a JSON header, then the tensors' bytes back to back) and the
//! per-request checksum. The package writes and frames the file; the core decides whether a
//! file's header describes exactly the states of its fingerprint, and whether each request's
//! bytes are the ones that were written.
//!
//! Tensors: one per (layer, persistent state), layer-major, named `layer<L>.<state>`, shape
//! `[num_requests, *state shape]`, in the safetensors dtype of the state. Metadata (strings):
//! `format` ([`FORMAT`]), `fingerprint` (the source pool's text form, its rank included),
//! `num_layers`, `num_requests`, `source_blocks` (the blocks the requests were offloaded from,
//! comma-separated), `checksums` (per request, hex, of its bytes in every tensor in order),
//! `entry` (the host tier entry a spill file belongs to, empty otherwise), `record` (hex: a digest
//! of every other metadata entry -- which covers the tensor table, derived from them -- and of the
//! whole data section) and `seal` (hex, spill files only: a keyed digest of the same, with keys
//! that only the writing tier holds; empty otherwise). A file whose block map, counts or entry
//! were edited fails `record`; a spill file swapped with another entry's, or rewritten by anyone
//! but its tier, fails the entry or `seal` check and is refused naming the key.

use super::fingerprint::{add_bytes, mul_bytes, Fingerprint, StateKind};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::ConvLayout;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// The `format` metadata value of a saved-states file.
pub const FORMAT: &str = "recoverssm-saved-states 2";
/// The largest JSON header a file may have (bytes).
pub const MAX_HEADER: u64 = 64 << 20;
/// The deepest nesting a file's JSON header may have: the header object, a tensor entry, its
/// shape list.
pub const MAX_DEPTH: usize = 3;

/// The safetensors dtype name of `d` (`F32`, `BF16`, ...).
pub fn safetensors_dtype(d: DType) -> &'static str {
    match d {
        DType::Float64 => "F64",
        DType::Float32 => "F32",
        DType::Float16 => "F16",
        DType::BFloat16 => "BF16",
        DType::Float8E4M3Fn => "F8_E4M3",
        DType::Float8E5M2 => "F8_E5M2",
        DType::Int32 => "I32",
        DType::Int8 => "I8",
        DType::UInt8 => "U8",
    }
}

/// A 64-bit checksum of `data` (four multiply-xor lanes over little-endian words, then the tail):
/// any change of a byte, and any change of length, changes it with overwhelming probability. It
/// guards against corruption and truncation, not a forger.
pub fn checksum(data: &[u8]) -> u64 {
    const P: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut lanes = [P, P ^ 1, P ^ 2, P ^ 3];
    let chunks = data.chunks_exact(32);
    let rest = chunks.remainder();
    for c in chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&c[i * 8..i * 8 + 8]);
            *lane = (*lane ^ u64::from_le_bytes(w)).wrapping_mul(P).rotate_left(31);
        }
    }
    let mut h = (data.len() as u64).wrapping_mul(P);
    for l in lanes {
        h = (h ^ l).wrapping_mul(P).rotate_left(29);
    }
    for &b in rest {
        h = (h ^ u64::from(b)).wrapping_mul(P);
    }
    h ^ (h >> 32)
}

/// One tensor entry of a file's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub begin: u64,
    pub end: u64,
}

/// A file's header, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedHeader {
    pub fingerprint: Fingerprint,
    pub num_layers: u64,
    pub num_requests: u64,
    pub source_blocks: Vec<u64>,
    pub checksums: Vec<u64>,
    /// The host tier entry the file belongs to (empty for a file saved on its own).
    pub entry: String,
    /// The digest of the whole record ([`record_digest`]).
    pub record: u64,
    /// The tier's keyed digest ([`Sealer::seal`]), spill files only.
    pub seal: Option<u64>,
}

impl SavedHeader {
    /// A header of `num_requests` requests saved from `source_blocks`, its digests still unset
    /// ([`seal_header`] sets them).
    pub fn new(fingerprint: Fingerprint, num_layers: u64, num_requests: u64, source_blocks: Vec<u64>) -> SavedHeader {
        SavedHeader { fingerprint, num_layers, num_requests, source_blocks, checksums: vec![], entry: String::new(), record: 0, seal: None }
    }
}

fn bad(m: impl std::fmt::Display) -> Error {
    Error::layout(format!("saved states file: {m}"))
}

/// The local shape of a persistent state, from its fingerprint.
fn state_shape(kind: &StateKind) -> Vec<u64> {
    match kind {
        StateKind::Conv { layout: ConvLayout::SD, width, dim, .. } => vec![*width, *dim],
        StateKind::Conv { layout: ConvLayout::DS, width, dim, .. } => vec![*dim, *width],
        StateKind::Heads { shape, .. } => shape.clone(),
    }
}

/// A header's metadata: `(key, value)` pairs.
pub type Metadata = Vec<(&'static str, String)>;

/// The metadata entries of a header.
pub fn header_metadata(h: &SavedHeader) -> Metadata {
    let mut m = signed_metadata(h);
    m.push(("record", format!("{:016x}", h.record)));
    m.push(("seal", h.seal.map(|s| format!("{s:016x}")).unwrap_or_default()));
    m
}

/// The metadata entries the digests cover: all but `record` and `seal`.
fn signed_metadata(h: &SavedHeader) -> Metadata {
    let join = |v: &[u64], hex: bool| v.iter().map(|x| if hex { format!("{x:016x}") } else { x.to_string() }).collect::<Vec<_>>().join(",");
    vec![
        ("format", FORMAT.to_string()),
        ("fingerprint", h.fingerprint.encode()),
        ("num_layers", h.num_layers.to_string()),
        ("num_requests", h.num_requests.to_string()),
        ("source_blocks", join(&h.source_blocks, false)),
        ("checksums", join(&h.checksums, true)),
        ("entry", h.entry.clone()),
    ]
}

/// The bytes the digests cover before the data section: each signed metadata entry as
/// `key=value` on its own line (the tensor table follows from them).
fn signed_text(h: &SavedHeader) -> String {
    signed_metadata(h).iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

/// The digest of a whole record: its signed metadata and its data section. Like [`checksum`],
/// it finds corruption and edits, not a forger (a spill file's [`Sealer::seal`] does).
pub fn record_digest(h: &SavedHeader, data: &[u8]) -> u64 {
    const P: u64 = 0xD6E8_FEB8_6659_FD93;
    let (a, b) = (checksum(signed_text(h).as_bytes()), checksum(data));
    (a.wrapping_mul(P) ^ b).rotate_left(23).wrapping_mul(P)
}

/// The keys of one host tier's spill files: a keyed digest (SipHash, with random keys drawn when
/// the tier is made and never written anywhere) of each file's signed metadata and data, and the
/// tier's random tag that names its entries. A file another tier or another user wrote, or one
/// swapped with another entry's, does not pass [`verify_entry`].
#[derive(Clone, Debug)]
pub struct Sealer {
    keys: RandomState,
    tag: u64,
}

impl Default for Sealer {
    fn default() -> Self {
        Sealer { keys: RandomState::new(), tag: super::files::random_u64() }
    }
}

impl Sealer {
    /// The `entry` value of entry `id`'s spill file.
    pub fn entry(&self, id: u64) -> String {
        format!("host tier {:016x} entry {id}", self.tag)
    }
    /// The keyed digest of a record.
    pub fn seal(&self, h: &SavedHeader, data: &[u8]) -> u64 {
        let mut s = self.keys.build_hasher();
        s.write(signed_text(h).as_bytes());
        s.write(data);
        s.finish()
    }
}

/// A header's counts, as written and as read: at least one layer and one request, one source
/// block per request, and `checksums` (the number of checksums) per request.
fn check_counts(h: &SavedHeader, checksums: u64) -> Result<()> {
    if h.num_layers == 0 || h.num_requests == 0 {
        return Err(bad(format!("{} layers and {} requests: a file holds at least one of each", h.num_layers, h.num_requests)));
    }
    for (k, n) in [("source_blocks", h.source_blocks.len() as u64), ("checksums", checksums)] {
        if n != h.num_requests {
            return Err(bad(format!("{k} has {n} entries for {} requests", h.num_requests)));
        }
    }
    Ok(())
}

/// Fills a header's checksums and digests for the data section `data`; with `sealer`, binds the
/// file to entry `id` of that tier and seals it.
pub fn seal_header(h: &mut SavedHeader, data: &[u8], sealer: Option<(&Sealer, u64)>) -> Result<()> {
    check_counts(h, h.num_requests)?;
    h.checksums = request_checksums(h, data)?;
    h.entry = sealer.map(|(s, id)| s.entry(id)).unwrap_or_default();
    h.record = record_digest(h, data);
    h.seal = sealer.map(|(s, _)| s.seal(h, data));
    Ok(())
}

/// The byte range of the JSON header in a file's bytes `raw`, after checking the framing: the
/// 8-byte length fits the file and [`MAX_HEADER`], and the JSON nests no deeper than
/// [`MAX_DEPTH`] (so that no parser recurses on a hostile file).
pub fn header_span(raw: &[u8]) -> Result<std::ops::Range<usize>> {
    if raw.len() < 8 {
        return Err(bad(format!("{} bytes: too short for a header (truncated)", raw.len())));
    }
    let n = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
    if n > raw.len() as u64 - 8 {
        return Err(bad(format!("the header length {n} runs past the file's {} bytes (truncated)", raw.len())));
    }
    if n > MAX_HEADER {
        return Err(bad(format!("the header length {n} is more than the {MAX_HEADER} bytes a header may have")));
    }
    let span = 8..8 + n as usize;
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for &c in &raw[span.clone()] {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(bad(format!("the header nests deeper than {MAX_DEPTH} levels; it is not a saved-states header")));
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(span)
}

/// The tensor entries a file of `h` holds, with their byte ranges in the data section.
pub fn header_tensors(h: &SavedHeader) -> Result<Vec<SavedTensor>> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for layer in 0..h.num_layers {
        for s in &h.fingerprint.states {
            let n = mul_bytes(s.nbytes()?, h.num_requests).ok_or_else(|| bad("the file's size overflows"))?;
            let end = add_bytes(at, n).ok_or_else(|| bad("the file's size overflows"))?;
            let mut shape = vec![h.num_requests];
            shape.extend(state_shape(&s.kind));
            out.push(SavedTensor { name: format!("layer{layer}.{}", s.name), dtype: safetensors_dtype(s.dtype).into(), shape, begin: at, end });
            at = end;
        }
    }
    Ok(out)
}

/// Decodes and checks a file's header: its metadata (`get(key)`) and tensor entries against the
/// fingerprint it names, and the data section's length `data_len`. Every defect -- a missing or
/// malformed entry, another format, a tensor missing, extra, misnamed, of another dtype or shape,
/// a byte range that is not the next one, a data section of another length (truncated or
/// extended) -- is a layout error.
pub fn decode_header(get: &dyn Fn(&str) -> Option<String>, tensors: &[SavedTensor], data_len: u64) -> Result<SavedHeader> {
    let entry = |k: &str| get(k).ok_or_else(|| bad(format!("no '{k}' metadata entry")));
    let format = entry("format")?;
    if format != FORMAT {
        return Err(bad(format!("format '{format}' is not '{FORMAT}'")));
    }
    let num = |k: &str, t: &str| t.parse::<u64>().map_err(|_| bad(format!("{k}: '{t}' is not a non-negative integer")));
    let list = |k: &str, t: &str, hex: bool| -> Result<Vec<u64>> {
        t.split(',')
            .filter(|x| !x.is_empty())
            .map(|x| if hex { u64::from_str_radix(x, 16).map_err(|_| bad(format!("{k}: '{x}' is not hex"))) } else { num(k, x) })
            .collect()
    };
    let fingerprint = Fingerprint::decode(&entry("fingerprint")?).map_err(|e| bad(e.message))?;
    let hex = |k: &str, t: &str| u64::from_str_radix(t, 16).map_err(|_| bad(format!("{k}: '{t}' is not hex")));
    let seal = entry("seal")?;
    let h = SavedHeader {
        num_layers: num("num_layers", &entry("num_layers")?)?,
        num_requests: num("num_requests", &entry("num_requests")?)?,
        source_blocks: list("source_blocks", &entry("source_blocks")?, false)?,
        checksums: list("checksums", &entry("checksums")?, true)?,
        entry: entry("entry")?,
        record: hex("record", &entry("record")?)?,
        seal: if seal.is_empty() { None } else { Some(hex("seal", &seal)?) },
        fingerprint,
    };
    check_counts(&h, h.checksums.len() as u64)?;
    let ns = h.fingerprint.states.len() as u64;
    if h.num_layers.checked_mul(ns) != Some(tensors.len() as u64) {
        return Err(bad(format!("{} tensors for {} layers x {ns} persistent states", tensors.len(), h.num_layers)));
    }
    let want = header_tensors(&h)?;
    for (got, w) in tensors.iter().zip(&want) {
        if got != w {
            return Err(bad(format!(
                "tensor {:?} ({} {:?}, {} bytes at {}) is not {:?} ({} {:?}, {} bytes at {})",
                got.name,
                got.dtype,
                got.shape,
                got.end.saturating_sub(got.begin),
                got.begin,
                w.name,
                w.dtype,
                w.shape,
                w.end.saturating_sub(w.begin),
                w.begin
            )));
        }
    }
    let total = want.last().map_or(0, |t| t.end);
    if total != data_len {
        return Err(bad(format!("the data section has {data_len} bytes but the header describes {total} (truncated or extended)")));
    }
    Ok(h)
}

/// Per request, the checksum of its bytes in every tensor of a data section laid out as
/// [`header_tensors`] says (the header's own `checksums` are ignored). `data` must be exactly
/// the data section.
pub fn request_checksums(h: &SavedHeader, data: &[u8]) -> Result<Vec<u64>> {
    const P: u64 = 0xC2B2_AE3D_27D4_EB4F;
    let tensors = header_tensors(h)?;
    let total = tensors.last().map_or(0, |t| t.end);
    if total != data.len() as u64 {
        return Err(bad(format!("the data section has {} bytes but the header describes {total}", data.len())));
    }
    let n = h.num_requests;
    let mut out = vec![0u64; n as usize];
    for t in &tensors {
        let per = (t.end - t.begin) / n;
        for (i, acc) in out.iter_mut().enumerate() {
            let a = (t.begin + i as u64 * per) as usize;
            *acc = (*acc ^ checksum(&data[a..a + per as usize])).wrapping_mul(P).rotate_left(27);
        }
    }
    Ok(out)
}

/// Checks every request's bytes against the header's checksums (the error names the first
/// request that differs and the block it was saved from), then the whole record's digest (the
/// block map, counts and entry as well as the bytes).
pub fn verify(h: &SavedHeader, data: &[u8]) -> Result<()> {
    for (i, (got, want)) in request_checksums(h, data)?.iter().zip(&h.checksums).enumerate() {
        if got != want {
            return Err(bad(format!(
                "request {i} (saved from block {}): checksum {got:016x} differs from the recorded {want:016x}; the file was changed or damaged",
                h.source_blocks[i]
            )));
        }
    }
    let got = record_digest(h, data);
    if got != h.record {
        return Err(bad(format!(
            "the record digest {got:016x} differs from the recorded {:016x}: its metadata (block map, counts, entry) was changed",
            h.record
        )));
    }
    Ok(())
}

/// Checks that a spill file (already [`verify`]-ed) is entry `id` of the tier of `sealer`, named
/// `key` in errors: its `entry` names that entry, and its seal is the tier's.
pub fn verify_entry(h: &SavedHeader, data: &[u8], sealer: &Sealer, id: u64, key: &str) -> Result<()> {
    let want = sealer.entry(id);
    if h.entry != want {
        let held = if h.entry.is_empty() { "no entry".to_string() } else { format!("'{}'", h.entry) };
        return Err(bad(format!(
            "key {key}: the spill file holds {held}, not '{want}' (a file swapped with another entry's, or not this tier's); nothing was restored"
        )));
    }
    if h.seal != Some(sealer.seal(h, data)) {
        return Err(bad(format!("key {key}: the spill file's seal does not match: it was rewritten after this tier wrote it; nothing was restored")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> SavedHeader {
        let fingerprint = crate::transfer::test_gdn(2, 1, 1, ConvLayout::DS);
        SavedHeader { checksums: vec![1, 2, u64::MAX], ..SavedHeader::new(fingerprint, 2, 3, vec![4, 1, 7]) }
    }

    type Edit<'a> = &'a dyn Fn(&mut Metadata, &mut Vec<SavedTensor>);

    fn decode(h: &SavedHeader, edit: Edit<'_>) -> Result<SavedHeader> {
        let (mut meta, mut tensors) = (header_metadata(h), header_tensors(h).unwrap());
        edit(&mut meta, &mut tensors);
        let len = tensors.last().map_or(0, |t| t.end);
        decode_header(&|k| meta.iter().find(|(m, _)| *m == k).map(|(_, v)| v.clone()), &tensors, len)
    }

    #[test]
    fn header_round_trip_and_defects() {
        let h = header();
        assert_eq!(decode(&h, &|_, _| {}).unwrap(), h);
        let t = header_tensors(&h).unwrap();
        assert_eq!((t[0].name.as_str(), t[0].dtype.as_str(), t[0].shape.clone()), ("layer0.conv", "BF16", vec![3, 24, 4]));
        let e = |f: Edit<'_>| decode(&h, f).unwrap_err().message;
        assert!(e(&|m, _| m.retain(|(k, _)| *k != "checksums")).contains("no 'checksums' metadata entry"));
        assert!(e(&|m, _| m[0].1 = "other 2".into()).contains("format 'other 2'"));
        assert!(e(&|m, _| m[5].1 = "1,2".into()).contains("checksums has 2 entries for 3 requests"));
        assert!(e(&|_, t| t[1].dtype = "F16".into()).contains("tensor \"layer0.temporal\" (F16"));
        assert!(e(&|_, t| t.swap(0, 1)).contains("is not \"layer0.conv\""));
        assert!(e(&|_, t| {
            t.pop();
        })
        .contains("3 tensors for 2 layers x 2"));
        let m = decode_header(&|k| header_metadata(&h).into_iter().find(|(m, _)| *m == k).map(|(_, v)| v), &t, 10).unwrap_err().message;
        assert!(m.contains("truncated or extended"), "{m}");
    }

    #[test]
    fn verify_names_the_damaged_request() {
        let mut h = header();
        let len = header_tensors(&h).unwrap().last().unwrap().end as usize;
        let mut data: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        seal_header(&mut h, &data, None).unwrap();
        verify(&h, &data).unwrap();
        let t = &header_tensors(&h).unwrap()[3];
        data[(t.begin + (t.end - t.begin) / 3 * 2) as usize] ^= 0x10;
        let m = verify(&h, &data).unwrap_err().message;
        assert!(m.contains("request 2 (saved from block 7): checksum"), "{m}");
        assert!(verify(&h, &data[1..]).unwrap_err().message.contains("data section has"));
    }

    #[test]
    fn checksum_sees_every_byte_and_the_length() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
        let base = checksum(&a);
        for i in [0, 31, 32, 500, 999] {
            let mut b = a.clone();
            b[i] ^= 1;
            assert_ne!(checksum(&b), base, "byte {i}");
        }
        assert_ne!(checksum(&a[..999]), base);
        assert_ne!(checksum(&[0u8; 64]), checksum(&[0u8; 65]));
    }
}

#[cfg(test)]
mod record_tests {
    use super::*;

    fn sealed(sealer: Option<(&Sealer, u64)>) -> (SavedHeader, Vec<u8>) {
        let mut h = SavedHeader::new(crate::transfer::test_gdn(1, 0, 0, ConvLayout::SD), 1, 2, vec![5, 9]);
        let len = header_tensors(&h).unwrap().last().unwrap().end as usize;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        seal_header(&mut h, &data, sealer).unwrap();
        (h, data)
    }

    #[test]
    fn the_record_covers_the_block_map_and_the_entry() {
        let (h, data) = sealed(None);
        verify(&h, &data).unwrap();
        let mut moved = h.clone();
        moved.source_blocks = vec![9, 5];
        assert!(verify(&moved, &data).unwrap_err().message.contains("record digest"));
        let mut renamed = h.clone();
        renamed.entry = "host tier 0 entry 1".into();
        assert!(verify(&renamed, &data).unwrap_err().message.contains("record digest"));
    }

    #[test]
    fn a_spill_file_is_bound_to_its_entry_and_tier() {
        let (tier, other) = (Sealer::default(), Sealer::default());
        let (h, data) = sealed(Some((&tier, 3)));
        verify(&h, &data).unwrap();
        verify_entry(&h, &data, &tier, 3, "'a'").unwrap();
        let m = verify_entry(&h, &data, &tier, 4, "'b'").unwrap_err().message;
        assert!(m.contains("key 'b': the spill file holds 'host tier") && m.contains("swapped"), "{m}");
        assert!(verify_entry(&h, &data, &other, 3, "'a'").unwrap_err().message.contains("not 'host tier"));
        // Re-digested by someone without the keys: the record passes, the seal does not.
        let mut forged = h.clone();
        forged.source_blocks = vec![9, 5];
        forged.record = record_digest(&forged, &data);
        verify(&forged, &data).unwrap();
        assert!(verify_entry(&forged, &data, &tier, 3, "'a'").unwrap_err().message.contains("seal does not match"));
        let (plain, data) = sealed(None);
        assert!(verify_entry(&plain, &data, &tier, 0, "'a'").unwrap_err().message.contains("holds no entry"));
    }

    #[test]
    fn the_framing_is_checked_before_any_parse() {
        let frame = |json: &str| {
            let mut v = (json.len() as u64).to_le_bytes().to_vec();
            v.extend_from_slice(json.as_bytes());
            v
        };
        let ok = r#"{"a":{"shape":[1,2]},"s":"[[[[\"["}"#;
        assert_eq!(header_span(&frame(ok)).unwrap(), 8..8 + ok.len());
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(header_span(&frame(&deep)).unwrap_err().message.contains("nests deeper than 3"));
        assert!(header_span(&[1, 2]).unwrap_err().message.contains("too short"));
        let mut long = frame("{}");
        long[..8].copy_from_slice(&100u64.to_le_bytes());
        assert!(header_span(&long).unwrap_err().message.contains("runs past"));
        let mut big = vec![b' '; (MAX_HEADER + 16) as usize];
        big[..8].copy_from_slice(&(MAX_HEADER + 1).to_le_bytes());
        assert!(header_span(&big).unwrap_err().message.contains("more than the"));
    }
}
