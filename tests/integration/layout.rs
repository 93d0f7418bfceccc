//! The layout's dependency rule (docs/architecture.md): each room of `ecs/`
//! uses only the rooms below it. Every `crate::room` path in code (not in
//! comments) is checked against this order.

use std::path::Path;

/// The rooms from the bottom up; a room may use those before it.
const ORDER: [&str; 16] = [
    "error",
    "files",
    "stats",
    "hardware",
    "scenario",
    "shared",
    "engine",
    "transfer",
    "router",
    "metrics",
    "workload",
    "sim",
    "check",
    "replay",
    "experiment",
    "cli",
];

fn rank(room: &str) -> Option<usize> {
    ORDER.iter().position(|r| *r == room)
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The room a file of `ecs/` belongs to (None: lib.rs and main.rs, above all).
fn room_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix("ecs").unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy();
    let name = first.strip_suffix(".rs").unwrap_or(&first).to_string();
    (name != "lib" && name != "main").then_some(name)
}

#[test]
fn every_room_uses_only_the_rooms_below_it() {
    let mut files = Vec::new();
    rust_files(Path::new("ecs"), &mut files);
    files.sort();
    let mut upward = Vec::new();
    for f in &files {
        let Some(room) = room_of(f) else { continue };
        let mine =
            rank(&room).unwrap_or_else(|| panic!("{}: room `{room}` is not in ORDER", f.display()));
        let text = std::fs::read_to_string(f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap();
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let used: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if let Some(r) = rank(&used)
                    && r > mine
                {
                    upward.push(format!("{}:{}: `{room}` uses `{used}`", f.display(), n + 1));
                }
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports that point up:\n{}",
        upward.join("\n")
    );
}
