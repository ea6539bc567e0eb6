//! The architecture, checked: every import between files in `src/` must follow the layer table
//! in docs/DESIGN.md §1 ("Layers"), and the files must form no import cycle.
//!
//! The checker reads the sources: it strips comments, string literals and `#[cfg(test)]`
//! modules, expands every `use` tree, resolves every path that starts with `crate`, `super`,
//! `self`, a child module or a name a `use` brought in (and, in the CLI, `winefs`) to the file
//! that defines the item, following `pub use` re-exports. An edge A → B means "A names something
//! defined in B". Unit tests are left out, inside a module or in a file of their own beside it
//! (`#[cfg(test)] #[path = "..."] mod`): a test may build a whole file system to check one
//! layer, which says nothing about the layer's own dependencies.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// One source file of a crate.
struct SrcFile {
    /// Path relative to the repository root, e.g. `src/ops/file.rs`.
    rel: String,
    /// Module path inside its crate, e.g. ["ops", "file"]; empty for a crate root.
    module: Vec<String>,
    /// The code, with comments, strings and test modules removed.
    code: String,
}

/// A crate: the library (`src/lib.rs`) or the CLI binary (`src/cli/main.rs`).
struct Crate {
    files: Vec<SrcFile>,
    /// Module path → index into `files`.
    by_module: HashMap<Vec<String>, usize>,
}

/// Remove comments, and replace string and char literals by empty ones.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let word_before = |i: usize| i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#')) && !word_before(i) {
            // A raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < b.len()
                && !(b[j] == b'"' && (1..=hashes).all(|k| b.get(j + k) == Some(&b'#')))
            {
                j += 1;
            }
            out.extend_from_slice(b"\"\"");
            i = j + 1 + hashes;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            out.extend_from_slice(b"\"\"");
            i += 1;
        } else if c == b'\''
            && (b.get(i + 2) == Some(&b'\'')
                || (b.get(i + 1) == Some(&b'\\')
                    && b[i + 2..].iter().take(10).any(|&x| x == b'\'')))
        {
            // A char literal ('a', '\n', '\u{..}'); a lifetime ('a) has no closing quote.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            out.extend_from_slice(b"' '");
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).expect("stripping keeps UTF-8 boundaries")
}

/// Remove `#[cfg(test)] mod name { ... }` blocks.
fn drop_test_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = rest[at + "#[cfg(test)]".len()..].trim_start();
        let is_mod = after.starts_with("mod ") || after.starts_with("pub mod ");
        match after.find(['{', ';']) {
            Some(open) if is_mod && after.as_bytes()[open] == b'{' => {
                let mut depth = 0;
                let mut end = after.len();
                for (k, ch) in after.bytes().enumerate().skip(open) {
                    depth += i32::from(ch == b'{') - i32::from(ch == b'}');
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                rest = &after[end..];
            }
            Some(semi) if is_mod => rest = &after[semi + 1..],
            _ => rest = after,
        }
    }
    out.push_str(rest);
    out
}

/// The files of `#[cfg(test)] #[path = "file.rs"] mod name;` declarations in `src`: unit tests
/// a module keeps beside it.
fn test_module_files(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find("#[cfg(test)]") {
        rest = rest[at + "#[cfg(test)]".len()..].trim_start();
        if let Some(attr) = rest.strip_prefix("#[path") {
            let quoted = attr.split('"').nth(1);
            let closes = attr.find(']');
            if let (Some(file), Some(end)) = (quoted, closes) {
                let after = attr[end + 1..].trim_start();
                if after.starts_with("mod ") || after.starts_with("pub mod ") {
                    out.push(file.to_string());
                }
            }
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// One path a `use` tree names, with the name it binds (its alias or last segment).
struct UsePath {
    path: Vec<String>,
    binds: String,
}

/// Expand a `use` tree (`a::b::{c, d::{e, self}, f as g}`) into its paths.
fn expand_use_tree(tree: &str) -> Vec<UsePath> {
    fn go(prefix: &[String], tree: &str, out: &mut Vec<UsePath>) {
        let tree = tree.trim();
        if tree.is_empty() {
            return;
        }
        if let Some(brace) = tree.find('{') {
            let mut p = prefix.to_vec();
            p.extend(
                tree[..brace]
                    .split("::")
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from),
            );
            let inner = &tree[brace + 1..tree.rfind('}').unwrap_or(tree.len())];
            let mut depth = 0;
            let mut start = 0;
            for (i, ch) in inner.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&p, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&p, &inner[start..], out);
            return;
        }
        let mut words = tree.split_whitespace();
        let path_text = words.next().unwrap_or("");
        let alias = match (words.next(), words.next()) {
            (Some("as"), Some(a)) => Some(a.to_string()),
            _ => None,
        };
        let mut p = prefix.to_vec();
        for seg in path_text.split("::").filter(|s| !s.is_empty()) {
            if seg != "self" || p.is_empty() {
                p.push(seg.to_string());
            }
        }
        if p.last().is_some_and(|s| s == "*") {
            p.pop();
        }
        let binds = alias.unwrap_or_else(|| p.last().cloned().unwrap_or_default());
        out.push(UsePath { path: p, binds });
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

/// What a file names: its `use` paths (and whether each is a `pub` re-export) and every other
/// path written with `::`.
struct Names {
    uses: Vec<(UsePath, bool)>,
    /// Paths outside `use` items, each as its segments (at least two).
    inline: Vec<Vec<String>>,
}

fn names(code: &str) -> Names {
    let b = code.as_bytes();
    let mut uses = Vec::new();
    let mut rest = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !is_ident(b[i - 1]);
        if at_word && code[i..].starts_with("use ") {
            let start = code[..i].rfind(['\n', ';', '{', '}']).map_or(0, |p| p + 1);
            let reexport = code[start..i].trim().starts_with("pub");
            let end = code[i..].find(';').map_or(b.len(), |e| i + e);
            for u in expand_use_tree(&code[i + 4..end]) {
                uses.push((u, reexport));
            }
            i = end + 1;
            continue;
        }
        rest.push(b[i]);
        i += 1;
    }
    let rest = String::from_utf8(rest).expect("UTF-8");
    let r = rest.as_bytes();
    let mut inline = Vec::new();
    let mut k = 0;
    while k < r.len() {
        let at_word = is_ident(r[k]) && (k == 0 || !(is_ident(r[k - 1]) || r[k - 1] == b':'));
        if !at_word {
            k += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = k;
        loop {
            let s = j;
            while j < r.len() && is_ident(r[j]) {
                j += 1;
            }
            if j == s {
                break;
            }
            segs.push(rest[s..j].to_string());
            if rest[j..].starts_with("::") {
                j += 2;
            } else {
                break;
            }
        }
        if segs.len() > 1 {
            inline.push(segs);
        }
        k = j.max(k + 1);
    }
    Names { uses, inline }
}

impl Crate {
    /// A crate from its files: (path relative to the repository, module path, source).
    fn from_sources(sources: Vec<(String, Vec<String>, String)>) -> Crate {
        let files: Vec<SrcFile> = sources
            .into_iter()
            .map(|(rel, module, src)| SrcFile {
                rel,
                module,
                code: drop_test_modules(&strip(&src)),
            })
            .collect();
        let by_module = files
            .iter()
            .enumerate()
            .map(|(i, f)| (f.module.clone(), i))
            .collect();
        Crate { files, by_module }
    }

    /// Read a crate: `root_file` is its root, `dir` the folder its modules live in.
    fn load(repo: &Path, root_file: &str, dir: &str, skip: &[&str]) -> Crate {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
                .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
                .map(|e| e.expect("directory entry").path())
                .collect();
            entries.sort();
            for p in entries {
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut paths = Vec::new();
        walk(&repo.join(dir), &mut paths);
        // Unit tests kept in a file of their own beside their module are test code too.
        let test_files: BTreeSet<PathBuf> = paths
            .iter()
            .flat_map(|p| {
                let src = std::fs::read_to_string(p).expect("read a source file");
                let folder = p.parent().expect("in a folder").to_path_buf();
                test_module_files(&src).into_iter().map(move |f| folder.join(f))
            })
            .collect();
        let mut sources = Vec::new();
        for p in paths {
            if test_files.contains(&p) {
                continue;
            }
            let rel = p.strip_prefix(repo).expect("in the repository");
            let in_dir = p.strip_prefix(repo.join(dir)).expect("in the crate folder");
            if skip.iter().any(|s| in_dir.starts_with(s)) {
                continue;
            }
            let module: Vec<String> = if rel == Path::new(root_file) {
                Vec::new()
            } else {
                let mut m: Vec<String> = in_dir
                    .iter()
                    .map(|c| c.to_string_lossy().into_owned())
                    .collect();
                let last = m.pop().expect("a file name");
                if last != "mod.rs" {
                    m.push(last.trim_end_matches(".rs").to_string());
                }
                m
            };
            let src = std::fs::read_to_string(&p).expect("read a source file");
            sources.push((rel.to_string_lossy().into_owned(), module, src));
        }
        Crate::from_sources(sources)
    }

    /// The file defining the item at absolute `path`, following re-exports.
    fn resolve(&self, path: &[String], depth: u32) -> Option<usize> {
        let k = (0..=path.len())
            .rev()
            .find(|&k| self.by_module.contains_key(&path[..k]))?;
        let file = self.by_module[&path[..k]];
        if depth < 8
            && let Some(item) = path.get(k)
        {
            for (u, reexport) in names(&self.files[file].code).uses {
                if reexport && &u.binds == item {
                    let mut target = self.absolute(file, &u.path, &[])?;
                    target.extend_from_slice(&path[k + 1..]);
                    if target.as_slice() != path {
                        return self.resolve(&target, depth + 1);
                    }
                }
            }
        }
        Some(file)
    }

    /// A path as written in file `from`, made absolute inside this crate; None for paths into
    /// other crates (std, libc, ...). `bound` holds the names the file's `use` items bring in.
    fn absolute(
        &self,
        from: usize,
        p: &[String],
        bound: &[(String, Vec<String>)],
    ) -> Option<Vec<String>> {
        let here = &self.files[from].module;
        let first = p.first()?;
        let mut a: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => here.clone(),
            "super" => {
                let mut a = here.clone();
                let mut rest = p;
                while rest.first().is_some_and(|s| s == "super") {
                    a.pop()?;
                    rest = &rest[1..];
                }
                a.extend_from_slice(rest);
                return Some(a);
            }
            name => {
                if let Some((_, target)) = bound.iter().find(|(b, _)| b == name) {
                    let mut a = target.clone();
                    a.extend_from_slice(&p[1..]);
                    return Some(a);
                }
                let mut child = here.clone();
                child.push(name.to_string());
                if !self.by_module.contains_key(&child) {
                    return None;
                }
                child.extend_from_slice(&p[1..]);
                return Some(child);
            }
        };
        a.extend_from_slice(&p[1..]);
        Some(a)
    }

    /// Every edge (from file, to file) of this crate; paths starting with `extern_name` are
    /// resolved in `extern_crate` (the CLI's `winefs::`).
    fn edges(&self, extern_crate: Option<(&str, &Crate)>) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for (i, f) in self.files.iter().enumerate() {
            let n = names(&f.code);
            // Names bound by `use` items that point into this crate (or the extern one).
            let mut bound: Vec<(String, Vec<String>)> = Vec::new();
            for (u, _) in &n.uses {
                if let Some(a) = self.absolute(i, &u.path, &[]) {
                    bound.push((u.binds.clone(), a));
                } else if let Some((name, _)) = extern_crate
                    && u.path.first().is_some_and(|s| s == name)
                {
                    bound.push((u.binds.clone(), u.path.clone()));
                }
            }
            let paths = n.uses.iter().map(|(u, _)| u.path.clone()).chain(n.inline);
            for p in paths {
                let target = match extern_crate {
                    Some((name, krate)) if p.first().is_some_and(|s| s == name) => {
                        krate.resolve(&p[1..], 0).map(|t| &krate.files[t])
                    }
                    _ => match self.absolute(i, &p, &bound) {
                        Some(a)
                            if extern_crate
                                .is_some_and(|(name, _)| a.first().is_some_and(|s| s == name)) =>
                        {
                            let (_, krate) = extern_crate.expect("checked");
                            krate.resolve(&a[1..], 0).map(|t| &krate.files[t])
                        }
                        Some(a) => self.resolve(&a, 0).map(|t| &self.files[t]),
                        None => None,
                    },
                };
                if let Some(t) = target
                    && t.rel != f.rel
                {
                    out.insert((f.rel.clone(), t.rel.clone()));
                }
            }
        }
        out
    }
}

/// The layer of each top-level module, from docs/DESIGN.md §1's "Layers" table: rows whose
/// first cell starts with the layer number and whose second cell lists `module` names.
fn layer_table(design: &str) -> BTreeMap<String, (u32, String)> {
    let start = design
        .find("### Layers")
        .expect("docs/DESIGN.md has a \"### Layers\" section");
    let mut table = BTreeMap::new();
    for line in design[start..].lines().skip(1) {
        let line = line.trim();
        if line.starts_with("###") || line.starts_with("## ") {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if !line.starts_with('|') || cells.len() < 2 {
            continue;
        }
        let Some(n) = cells[0]
            .split_whitespace()
            .next()
            .and_then(|w| w.parse::<u32>().ok())
        else {
            continue;
        };
        for m in cells[1].split('`').skip(1).step_by(2) {
            let prev = table.insert(m.to_string(), (n, cells[0].to_string()));
            assert!(
                prev.is_none(),
                "module `{m}` is listed twice in the Layers table"
            );
        }
    }
    table
}

/// The top-level module a file belongs to (`lib` for the crate root, `cli` for the CLI).
fn top_module(rel: &str) -> String {
    let p = rel.trim_start_matches("src/");
    if p == "lib.rs" {
        return "lib".into();
    }
    p.split('/')
        .next()
        .expect("a path")
        .trim_end_matches(".rs")
        .to_string()
}

/// Files in import cycles: each strongly connected component of more than one file.
fn cycles(edges: &BTreeSet<(String, String)>) -> Vec<Vec<String>> {
    let mut adj: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        adj.entry(a).or_default().push(b);
        adj.entry(b).or_default();
    }
    // Tarjan's algorithm, iterative.
    let nodes: Vec<&str> = adj.keys().copied().collect();
    let idx: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut next, mut out) = (Vec::new(), 0, Vec::new());
    for s in 0..n {
        if index[s] != usize::MAX {
            continue;
        }
        let mut work = vec![(s, 0usize)];
        while let Some(&mut (v, ref mut ei)) = work.last_mut() {
            if *ei == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            let succ = &adj[nodes[v]];
            if *ei < succ.len() {
                let w = idx[succ[*ei]];
                *ei += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(u, _)) = work.last() {
                low[u] = low[u].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                loop {
                    let w = stack.pop().expect("on the stack");
                    on[w] = false;
                    comp.push(nodes[w].to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    out.push(comp);
                }
            }
        }
    }
    out
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every edge between files of the library and the CLI.
fn project_edges() -> BTreeSet<(String, String)> {
    let repo = repo();
    let lib = Crate::load(&repo, "src/lib.rs", "src", &["cli"]);
    let cli = Crate::load(&repo, "src/cli/main.rs", "src/cli", &[]);
    let mut e = lib.edges(None);
    e.extend(cli.edges(Some(("winefs", &lib))));
    e
}

#[test]
fn imports_follow_the_layers_and_form_no_cycle() {
    let design = std::fs::read_to_string(repo().join("docs/DESIGN.md")).expect("read DESIGN.md");
    let layers = layer_table(&design);
    let edges = project_edges();
    // The checker must see the code: a few edges that exist by construction.
    assert!(edges.len() > 150, "only {} edges found", edges.len());
    for (a, b) in [
        ("src/ops/file.rs", "src/state/mount_state.rs"),
        ("src/fs/api.rs", "src/ops/namespace.rs"),
        ("src/cli/main.rs", "src/cli/fresh.rs"),
        ("src/cli/mount.rs", "src/fuse.rs"),
    ] {
        assert!(
            edges.contains(&(a.to_string(), b.to_string())),
            "the checker lost the edge {a} -> {b}"
        );
    }
    let files: BTreeSet<&str> = edges
        .iter()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    let unplaced: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(f))
        .filter(|m| !layers.contains_key(m))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules missing from the Layers table of docs/DESIGN.md §1: {unplaced:?}"
    );
    let up: Vec<String> = edges
        .iter()
        .filter_map(|(a, b)| {
            let (la, na) = &layers[&top_module(a)];
            let (lb, nb) = &layers[&top_module(b)];
            (lb > la).then(|| format!("{a} (layer {na}) imports {b} (layer {nb})"))
        })
        .collect();
    assert!(
        up.is_empty(),
        "imports that run up a layer:\n{}",
        up.join("\n")
    );
    let cyc = cycles(&edges);
    assert!(cyc.is_empty(), "import cycles among files: {cyc:#?}");
}

#[test]
fn use_trees_expand_with_aliases_and_self() {
    let got: Vec<(String, String)> = expand_use_tree("crate::a::{self, b::{c, d as e}, f::*}")
        .into_iter()
        .map(|u| (u.path.join("::"), u.binds))
        .collect();
    let want = [
        ("crate::a", "a"),
        ("crate::a::b::c", "c"),
        ("crate::a::b::d", "e"),
        ("crate::a::f", "f"),
    ];
    assert_eq!(
        got,
        want.map(|(p, b)| (p.to_string(), b.to_string())).to_vec()
    );
}

#[test]
fn comments_strings_and_test_modules_name_nothing() {
    let code = strip(
        "// crate::x::y\n/* crate::z */ let s = \"crate::w\"; let c = ':'; fn f<'a>() {}\n\
         #[cfg(test)]\nmod tests { use crate::t; }\nuse crate::kept;",
    );
    let code = drop_test_modules(&code);
    let n = names(&code);
    let used: Vec<String> = n.uses.iter().map(|(u, _)| u.path.join("::")).collect();
    assert_eq!(used, ["crate::kept"]);
    assert!(n.inline.is_empty(), "{:?}", n.inline);
}

#[test]
fn files_of_test_modules_are_found_and_nothing_else() {
    let src = "#[cfg(test)]\n#[path = \"a_tests.rs\"]\nmod tests;\n\
               #[cfg(test)] #[path = \"b_tests.rs\"] pub mod b;\n\
               #[path = \"c.rs\"]\nmod c;\n\
               #[cfg(test)]\nmod inline { }\n\
               #[cfg(test)]\n#[path = \"d.rs\"]\nfn not_a_module() {}";
    assert_eq!(test_module_files(src), ["a_tests.rs", "b_tests.rs"]);
}

/// The checker on a made-up crate: an upward import and a cycle through a re-export are found.
#[test]
fn a_made_up_cycle_and_upward_import_are_found() {
    let src = |rel: &str, module: &[&str], code: &str| {
        (
            rel.to_string(),
            module.iter().map(|s| s.to_string()).collect(),
            code.to_string(),
        )
    };
    let krate = Crate::from_sources(vec![
        src("src/lib.rs", &[], "mod low; mod high;"),
        src(
            "src/low/mod.rs",
            &["low"],
            "mod a; mod b; pub use a::Thing;",
        ),
        src(
            "src/low/a.rs",
            &["low", "a"],
            "pub struct Thing; fn f() { super::b::g(); }",
        ),
        src(
            "src/low/b.rs",
            &["low", "b"],
            "use crate::low::Thing; pub fn g() { crate::high::h(); }",
        ),
        src("src/high.rs", &["high"], "pub fn h() {}"),
    ]);
    let edges = krate.edges(None);
    let has = |a: &str, b: &str| edges.contains(&(a.to_string(), b.to_string()));
    // `crate::low::Thing` is a re-export: the edge goes to the file defining it.
    assert!(has("src/low/b.rs", "src/low/a.rs"));
    assert!(has("src/low/a.rs", "src/low/b.rs"));
    assert!(has("src/low/b.rs", "src/high.rs"));
    assert_eq!(
        cycles(&edges),
        vec![vec!["src/low/a.rs".to_string(), "src/low/b.rs".to_string()]]
    );
    let table = layer_table(
        "### Layers\n| layer | modules |\n|---|---|\n| 0 low | `low` |\n| 1 high | `high` |\n",
    );
    let up = edges
        .iter()
        .filter(|(a, b)| table[&top_module(b)].0 > table[&top_module(a)].0)
        .count();
    assert_eq!(up, 1);
}

/// Files stay small enough to read as one concept: none in `src/` over 1,000 lines.
#[test]
fn no_source_file_over_1000_lines() {
    fn walk(dir: &Path, out: &mut Vec<(String, usize)>) {
        for e in std::fs::read_dir(dir).expect("read src") {
            let p = e.expect("directory entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let n = std::fs::read_to_string(&p).expect("read").lines().count();
                out.push((p.display().to_string(), n));
            }
        }
    }
    let mut files = Vec::new();
    walk(&repo().join("src"), &mut files);
    assert!(files.len() > 40, "only {} source files found", files.len());
    let long: Vec<_> = files.into_iter().filter(|(_, n)| *n > 1000).collect();
    assert!(long.is_empty(), "files over 1,000 lines: {long:?}");
}
