//! The modules' layering (ARCHITECTURE.md, "Layering"): no module names one in a tier above
//! its own. Checked on the sources, so a new upward `use crate::...` fails here rather than
//! in a review.

use std::fs;
use std::path::Path;

/// Top to bottom. A module may use those of its own tier and the tiers below.
const TIERS: &[&[&str]] = &[
    &["store"],
    &[
        "index", "overlay", "journal", "snapshot", "entry", "sign", "blob", "lock",
    ],
    &[
        "dir", "layout", "settings", "publish", "fsinfo", "lru", "stats", "forksafe", "hash",
        "clock", "error", "verified",
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

/// ARCHITECTURE.md's file tree names every file of the core, the binding and the Python
/// package (one line each, the path relative to its directory, as the tree writes it).
#[test]
fn the_architecture_file_tree_lists_every_source_file() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let Ok(doc) = fs::read_to_string(repo.join("ARCHITECTURE.md")) else {
        panic!("no ARCHITECTURE.md at {}", repo.display());
    };
    let listed: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let mut missing = Vec::new();
    for dir in ["rust/core/src", "rust/python/src", "python/xla_pcache"] {
        let base = repo.join(dir);
        let mut stack = vec![base.clone()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if p.is_dir() {
                    if name != "__pycache__" {
                        stack.push(p);
                    }
                    continue;
                }
                // Built files next to the sources (the extension copied in for tests).
                if name.ends_with(".so") || name.ends_with(".pyc") {
                    continue;
                }
                let rel = p.strip_prefix(&base).unwrap().display().to_string();
                if !listed.contains(&rel.as_str()) {
                    missing.push(format!("{dir}/{rel}"));
                }
            }
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "not in ARCHITECTURE.md's file tree: {missing:?}"
    );
}
