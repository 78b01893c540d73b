//! The crate's layers (CONVENTIONS.md, "rdma-nfs"): a module's code names
//! no module above it (`crate::<module>`), and each file of `src/` keeps to
//! about 800 lines (issue 43). Doc comments may name any module.

use std::path::{Path, PathBuf};

/// The layers, lowest first.
const LAYERS: &[&str] = &[
    "xdr",
    "rpc",
    "rpcrdma",
    "error",
    "stats",
    "chunks",
    "transport",
    "status",
    "mount",
    "nfs3",
    "fuzzing",
];

const MAX_LINES: usize = 800;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The layer a file of `src/` belongs to (`transport/conn.rs`: `transport`);
/// `None` for the crate root and the binary.
fn layer_of(src: &Path, file: &Path) -> Option<usize> {
    let rel = file.strip_prefix(src).expect("a file under src/");
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    if name == "lib" || name == "main" {
        return None;
    }
    let at = LAYERS.iter().position(|l| *l == name);
    Some(at.unwrap_or_else(|| panic!("{}: a module missing from LAYERS", rel.display())))
}

/// The modules that `crate::` paths in `line` name (`{` for a grouped
/// import, which the check refuses: it reads one module a path).
fn named(line: &str) -> Vec<&str> {
    line.match_indices("crate::")
        .filter(|(at, _)| {
            // Not a part of a longer name (`rdma_nfs_crate::`).
            !line[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, m)| {
            let rest = &line[at + m.len()..];
            if rest.starts_with('{') {
                return "{";
            }
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

#[test]
fn a_lower_layer_never_names_a_higher_one_and_no_file_is_too_long() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut wrong = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a source file");
        let rel = file.strip_prefix(&src).expect("under src/").display();
        let lines = text.lines().count();
        if lines > MAX_LINES {
            wrong.push(format!("{rel}: {lines} lines, more than {MAX_LINES}"));
        }
        let Some(own) = layer_of(&src, file) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for module in named(line) {
                if module == "{" {
                    wrong.push(format!(
                        "{rel}:{}: a grouped `crate::{{...}}` path: name one module a path",
                        n + 1
                    ));
                    continue;
                }
                let Some(other) = LAYERS.iter().position(|l| *l == module) else {
                    continue;
                };
                if other > own {
                    wrong.push(format!(
                        "{rel}:{}: `{}` names `crate::{module}`, a higher layer",
                        n + 1,
                        LAYERS[own]
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_check_sees_a_path_into_a_higher_layer() {
    assert_eq!(named("use crate::nfs3::status_name;"), ["nfs3"]);
    assert_eq!(named("use crate::{transport::Error, xdr};"), ["{"]);
    assert_eq!(
        named("x(crate::error::Error, crate::stats::Stats)"),
        ["error", "stats"]
    );
    assert!(named("use super::Call;").is_empty());
}
