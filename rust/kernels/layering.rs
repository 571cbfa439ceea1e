//! The core's layering, checked on its sources: `kernels/` (records, calling conventions, shared
//! constants, launch builders) is the bottom layer. The engine-facing modules (plan, commit, vllm,
//! sglang, transfer, ...) build on it; nothing under `rust/kernels/` may name one of them, so the
//! kernels' records and ABI never depend on the code that fills them.

use std::path::Path;

/// The modules `kernels/` may use besides itself: the foundations every layer shares.
pub const KERNELS_MAY_USE: [&str; 3] = ["error", "tensor", "dtype"];

/// The `crate::<module>` paths of `source` (comments skipped) that name a top-level module other
/// than `kernels` and [`KERNELS_MAY_USE`], with their line numbers. Grouped imports
/// (`use crate::{a, b::C}`) count each member.
pub fn upward_paths(source: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                let inner = group.split('}').next().unwrap_or("");
                inner.split(',').map(|m| m.trim().split("::").next().unwrap_or("").trim()).collect()
            } else {
                vec![rest.split(|c: char| !(c.is_alphanumeric() || c == '_')).next().unwrap_or("")]
            };
            for name in names.into_iter().filter(|n| !n.is_empty()) {
                if name != "kernels" && !KERNELS_MAY_USE.contains(&name) {
                    out.push((i + 1, name.to_string()));
                }
            }
        }
    }
    out
}

/// Every upward path of every Rust file under `dir`, as `"file:line: crate::module"`.
pub fn upward_paths_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            out.extend(upward_paths_under(&path));
        } else if path.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.extend(upward_paths(&text).into_iter().map(|(n, m)| format!("{}:{n}: {}{m}", path.display(), "crate::")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_import_no_module_above_them() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("rust/kernels");
        let found = upward_paths_under(&dir);
        assert!(
            found.is_empty(),
            "rust/kernels/ is the bottom layer; move what it needs down into kernels/ (records: kernels/records/) \
             and have the upper module use it:\n  {}",
            found.join("\n  ")
        );
    }

    #[test]
    fn the_check_sees_paths_groups_and_skips_comments() {
        // Written with `CRATE` so that this file holds no upward path itself.
        let src = "use CRATE::error::Result;\nuse CRATE::plan::segment::Mode; // CRATE::vllm in a comment\n\
                   use CRATE::{tensor::Device, commit::CommitMeta};\n// use CRATE::sglang::kernel::SlotCopy;\n\
                   let x = CRATE::transfer::STAGING;\nuse $CRATE::kernels::records::Record;\n"
            .replace("CRATE", "crate");
        let found = upward_paths(&src);
        assert_eq!(found, vec![(2, "plan".to_string()), (3, "commit".to_string()), (5, "transfer".to_string())]);
    }
}
