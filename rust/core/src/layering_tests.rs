//! The modules' layering (ARCHITECTURE.md, "Layering"): no module names one in a level above
//! its own, and no modules use each other in a circle, in the core or in the binding.
//! Checked on the sources, so a new upward or circular `use crate::...` fails here rather
//! than in a review.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Top to bottom. A module may use those of its own level and the levels below.
const LEVELS: &[&[&str]] = &[
    &["store"],
    &[
        "view", "entries", "journal", "snapshot", "entry", "sign", "blob", "lock",
    ],
    &[
        "dir",
        "layout",
        "stored_budget",
        "bounds",
        "publish",
        "fsinfo",
        "lru",
        "stats",
        "forksafe",
        "hash",
        "clock",
        "error",
        "owndir",
        "record_place",
        "testhook",
        "verified",
        "build_id",
    ],
];

fn level(module: &str) -> Option<usize> {
    LEVELS.iter().position(|t| t.contains(&module))
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
        let Some(own) = level(module) else {
            unplaced.push(path.clone());
            continue;
        };
        for (i, line) in text.lines().enumerate() {
            for used in line.split("crate::").skip(1) {
                let name: String = used
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if level(&name).is_some_and(|t| t < own) {
                    upward.push(format!("{path}:{}: {module} uses {name}", i + 1));
                }
            }
        }
    }
    assert!(unplaced.is_empty(), "modules in no level: {unplaced:?}");
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
    assert!(files.len() > 20, "found only {} sources", files.len());
}

/// Each module of the crate at `src` (a top-level file or directory), with the modules of the
/// crate it names (`crate::<module>` in a line of code, not of a comment). The crate root
/// and test modules are left out.
fn uses(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, None, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, _path, text) in &files {
        if module == "lib" || module.ends_with("tests") {
            continue;
        }
        let used = graph.entry(module.clone()).or_default();
        for line in text.lines() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for rest in line.split("crate::").skip(1) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != *module && !name.ends_with("tests") {
                    used.insert(name);
                }
            }
        }
    }
    graph
}

/// The circles of `graph`: each set of two or more modules that reach one another through
/// their uses (a strongly connected component), sorted.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(m) = stack.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    for (m, from_m) in &reached {
        let circle: Vec<String> = from_m
            .iter()
            .filter(|other| reached.get(other).is_some_and(|r| r.contains(*m)))
            .cloned()
            .collect();
        if circle.len() > 1 {
            out.insert(circle);
        }
    }
    out.into_iter().collect()
}

#[test]
fn no_modules_use_each_other_in_a_circle() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed: Vec<Vec<String>> = Vec::new();
    for (crate_name, src) in [
        ("core", here.join("src")),
        ("binding", here.join("../python/src")),
    ] {
        let graph = uses(&src);
        assert!(
            graph.len() > 5,
            "{crate_name}: found only {} modules",
            graph.len()
        );
        let found: Vec<Vec<String>> = circles(&graph)
            .into_iter()
            .filter(|c| crate_name != "core" || !allowed.contains(c))
            .collect();
        assert!(
            found.is_empty(),
            "{crate_name}: modules that use each other in a circle: {found:?}"
        );
    }
}

#[test]
fn the_circle_check_sees_a_circle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a", "d"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(m, used)| (m.to_string(), used.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
}

/// Every module outside the tests names what it takes from its parent (`use super::{...}`),
/// never all of it (`use super::*`), so that a reader of a file sees where each name comes
/// from: the store's parts, in the core, are followed by their names.
#[test]
fn no_module_takes_all_of_its_parent() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    let mut files = Vec::new();
    for src in [here.join("src"), here.join("../python/src")] {
        sources(&src, None, &mut files);
    }
    for (_module, path, text) in &files {
        if path.ends_with("tests.rs") {
            continue;
        }
        // A test module inside a file is indented: only the file's own imports count.
        if text.lines().any(|l| l.trim_end() == "use super::*;") {
            found.push(path.clone());
        }
    }
    assert!(files.len() > 40, "found only {} sources", files.len());
    assert!(found.is_empty(), "`use super::*` outside tests: {found:?}");
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
