//! The modules' layering (ARCHITECTURE.md, "Layering"): no module names one in a tier above
//! its own. Checked on the sources, so a new upward `use crate::...` fails here rather than
//! in a review.

use std::fs;
use std::path::Path;

/// Top to bottom. A module may use those of its own tier and the tiers below.
const TIERS: &[&[&str]] = &[
    &["store"],
    &["index", "journal", "snapshot", "entry", "blob", "lock"],
    &[
        "dir", "layout", "publish", "fsinfo", "lru", "stats", "forksafe", "hash", "clock", "error",
    ],
];

fn tier(module: &str) -> Option<usize> {
    TIERS.iter().position(|t| t.contains(&module))
}

/// Every `.rs` file under `dir`, with the top-level module it belongs to.
fn sources(dir: &Path, module: Option<&str>, out: &mut Vec<(String, String, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir).unwrap().flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let path = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            sources(&path, Some(module.unwrap_or(&name)), out);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let m = module.unwrap_or(stem).to_string();
            out.push((
                m,
                path.display().to_string(),
                fs::read_to_string(&path).unwrap(),
            ));
        }
    }
}

#[test]
fn no_module_imports_one_above_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, None, &mut files);
    let mut upward = Vec::new();
    let mut unplaced = Vec::new();
    for (module, path, text) in &files {
        if module == "lib" || module.ends_with("tests") {
            continue;
        }
        let Some(own) = tier(module) else {
            unplaced.push(path.clone());
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            for used in line.split("crate::").skip(1) {
                let name: String = used
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if tier(&name).is_some_and(|t| t < own) {
                    upward.push(format!("{path}:{}: {module} uses {name}", i + 1));
                }
            }
        }
    }
    assert!(unplaced.is_empty(), "modules in no tier: {unplaced:?}");
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
    assert!(files.len() > 20, "found only {} sources", files.len());
}
