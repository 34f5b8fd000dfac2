//! The import graph between the files of one crate, read with syn: each file is given its
//! module path by the `mod` declarations from the crate's root (`#[path]` honoured); the
//! references of each file (`use` trees, paths in code, paths in macro arguments) that start
//! with `crate::`, `super::`, `self::`, a child module or a name a `use` brought in are
//! resolved to the file that defines what they name, through re-exports (`pub use`). A
//! parent's `mod child;` is not an import; its `use child::X` is.

use std::collections::{BTreeMap, BTreeSet};

use syn::visit::Visit;

/// Files of one crate and which imports which: `(from, to)` with the names `from` takes.
#[derive(Debug, Default)]
pub struct Graph {
    pub files: Vec<String>,
    pub edges: BTreeMap<(String, String), BTreeSet<String>>,
}

/// A strongly connected set of 2+ files, and the edges among them.
#[derive(Debug)]
pub struct Circle {
    pub files: BTreeSet<String>,
    pub ties: Vec<(String, String, BTreeSet<String>)>,
}

impl std::fmt::Display for Circle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let files: Vec<&str> = self.files.iter().map(String::as_str).collect();
        write!(f, "{} files: {}", files.len(), files.join(", "))?;
        for (from, to, names) in &self.ties {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            write!(f, "\n      {from} -> {to}: {}", names.join(", "))?;
        }
        Ok(())
    }
}

/// The import graph of the crate whose root file is `root`, every file read from `files`
/// (path -> text, `/`-separated paths). An error names a `mod` whose file is missing or a
/// file syn cannot parse.
pub fn graph(files: &BTreeMap<String, String>, root: &str) -> Result<Graph, String> {
    let mut tree = Tree {
        files,
        paths: Vec::new(),
        modules: BTreeMap::new(),
        refs: Vec::new(),
        exported_macros: BTreeMap::new(),
    };
    tree.load(root, Vec::new(), true)?;
    Ok(tree.edges())
}

/// The circles of `graph`: its strongly connected components of two files or more.
pub fn circles(graph: &Graph) -> Vec<Circle> {
    let index: BTreeMap<&str, usize> = graph
        .files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.as_str(), i))
        .collect();
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); graph.files.len()];
    for (from, to) in graph.edges.keys() {
        next[index[from.as_str()]].push(index[to.as_str()]);
    }
    strongly_connected(&next)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|component| {
            let files: BTreeSet<String> =
                component.iter().map(|&i| graph.files[i].clone()).collect();
            let ties = graph
                .edges
                .iter()
                .filter(|((a, b), _)| files.contains(a) && files.contains(b))
                .map(|((a, b), names)| (a.clone(), b.clone(), names.clone()))
                .collect();
            Circle { files, ties }
        })
        .collect()
}

/// Tarjan's algorithm, iterative: the components of the graph `next` (node -> successors).
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = next.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let (mut on_stack, mut stack, mut out) = (vec![false; n], Vec::new(), Vec::new());
    let mut counter = 0;
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        // (node, position in its successor list)
        let mut work = vec![(start, 0)];
        while let Some(&mut (v, ref mut pos)) = work.last_mut() {
            if *pos == 0 && index[v] == usize::MAX {
                index[v] = counter;
                low[v] = counter;
                counter += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = next[v].get(*pos) {
                *pos += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(component);
            }
        }
    }
    out
}

#[derive(Debug, Default)]
struct Module {
    file: usize,
    /// Names of the items defined here (child modules included).
    defs: BTreeSet<String>,
    /// `use` bindings: local name (None: a glob) -> the path as written.
    uses: Vec<(Option<String>, Vec<String>)>,
}

struct Tree<'a> {
    files: &'a BTreeMap<String, String>,
    paths: Vec<String>,
    modules: BTreeMap<Vec<String>, Module>,
    /// Every path each file names, as written, with the module it is written in.
    refs: Vec<(usize, Vec<String>, Vec<String>)>,
    /// `#[macro_export]` macros: at the crate's root, defined in a file.
    exported_macros: BTreeMap<String, usize>,
}

/// `a/b/../c.rs` -> `a/c.rs`.
fn normalize(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            p => out.push(p),
        }
    }
    out.join("/")
}

fn dir_of(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

/// `#[path = "x.rs"]`'s value.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The name an item defines in its module, if any.
fn defined_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Mod(i) => &i.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// A `use` tree flattened: (local name, None for a glob; the path as written).
fn flatten(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut Vec<(Option<String>, Vec<String>)>,
) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            let name = n.ident.to_string();
            // `use a::b::{self}` binds `b`.
            if name != "self" {
                path.push(name.clone());
            }
            let local = path.last().cloned();
            out.push((local, path));
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push((Some(r.rename.to_string()), path));
        }
        syn::UseTree::Glob(_) => out.push((None, prefix.clone())),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix, out);
            }
        }
    }
}

impl Tree<'_> {
    /// Read the file `path` as the module `module`, and the files its `mod`s declare. A
    /// root, a mod.rs or a file named by `#[path]` (`mod_rs`) holds its children beside
    /// it; `a/b.rs` holds them in `a/b/`.
    fn load(&mut self, path: &str, module: Vec<String>, mod_rs: bool) -> Result<(), String> {
        let text = self
            .files
            .get(path)
            .ok_or_else(|| format!("{path}: no such file"))?;
        let file = syn::parse_file(text).map_err(|e| {
            let at = e.span().start();
            format!("{path}:{}:{}: {e}", at.line, at.column + 1)
        })?;
        let index = self.paths.len();
        self.paths.push(path.to_string());
        let name = path.rsplit('/').next().unwrap_or(path);
        let dir = dir_of(path).to_string();
        let children = match mod_rs {
            true => dir.clone(),
            false => format!("{dir}/{}", name.trim_end_matches(".rs")),
        };
        let mut refs = References {
            file: index,
            module: module.clone(),
            found: Vec::new(),
        };
        refs.visit_file(&file);
        self.refs.extend(refs.found);
        self.items(&file.items, module, index, &dir, &children)
    }

    /// Register the items of `module` (in file `file`): its names, `use`s, macros and the
    /// modules it declares. `#[path]` is relative to `dir` (the file's directory, or the
    /// inline module's), a plain `mod x;` to `children`.
    fn items(
        &mut self,
        items: &[syn::Item],
        module: Vec<String>,
        file: usize,
        dir: &str,
        children: &str,
    ) -> Result<(), String> {
        let mut this = Module {
            file,
            ..Module::default()
        };
        let mut declared = Vec::new();
        for item in items {
            if let Some(name) = defined_name(item) {
                this.defs.insert(name);
            }
            match item {
                syn::Item::Use(u) => {
                    let mut flat = Vec::new();
                    flatten(&u.tree, &mut Vec::new(), &mut flat);
                    this.uses.extend(flat);
                }
                syn::Item::Macro(m)
                    if m.ident.is_some()
                        && m.attrs.iter().any(|a| a.path().is_ident("macro_export")) =>
                {
                    let name = m.ident.as_ref().map(|i| i.to_string()).unwrap_or_default();
                    self.exported_macros.insert(name, file);
                }
                syn::Item::Mod(m) => declared.push(m),
                _ => {}
            }
        }
        self.modules.insert(module.clone(), this);
        for m in declared {
            let mut child = module.clone();
            child.push(m.ident.to_string());
            match (&m.content, path_attr(&m.attrs)) {
                (Some((_, inner)), _) => {
                    let sub = format!("{children}/{}", m.ident);
                    self.items(inner, child, file, &sub, &sub)?;
                }
                (None, Some(p)) => {
                    let path = normalize(&format!("{dir}/{p}"));
                    self.load(&path, child, true)?;
                }
                (None, None) => {
                    let flat = normalize(&format!("{children}/{}.rs", m.ident));
                    let nested = normalize(&format!("{children}/{}/mod.rs", m.ident));
                    let path = match (
                        self.files.contains_key(&flat),
                        self.files.contains_key(&nested),
                    ) {
                        (true, _) => flat,
                        (false, true) => nested,
                        (false, false) => {
                            return Err(format!(
                                "{}: `mod {};` but neither {flat} nor {nested} exists",
                                self.paths[file], m.ident
                            ));
                        }
                    };
                    let mod_rs = path.ends_with("/mod.rs");
                    self.load(&path, child, mod_rs)?;
                }
            }
        }
        Ok(())
    }

    /// The name `name` as seen in module `module`: a child module, a `use` binding, or a
    /// name a glob `use` brings in. Returns the path it stands for, from the root.
    fn lookup(&self, module: &[String], name: &str, depth: usize) -> Option<Vec<String>> {
        let m = self.modules.get(module)?;
        let mut child = module.to_vec();
        child.push(name.to_string());
        if self.modules.contains_key(&child) {
            return Some(child);
        }
        for (local, path) in &m.uses {
            if local.as_deref() == Some(name) {
                return self.absolute(module, path, depth + 1);
            }
        }
        if m.defs.contains(name) {
            return Some(child);
        }
        // A glob's module, when it has the name: `use super::*;` in an inline test module.
        m.uses
            .iter()
            .filter(|(local, _)| local.is_none())
            .filter_map(|(_, path)| self.absolute(module, path, depth + 1))
            .map(|base| [base, vec![name.to_string()]].concat())
            .find(|full| self.resolve(full, depth + 1).1)
    }

    /// `path` as written in `module`, from the crate's root; None when it leaves the
    /// crate (another crate, std) or names a local item.
    fn absolute(&self, module: &[String], path: &[String], depth: usize) -> Option<Vec<String>> {
        if depth > 8 || path.is_empty() {
            return None;
        }
        let first = path[0].as_str();
        match first {
            "crate" | "$crate" => Some(path[1..].to_vec()),
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                let base = module.get(..module.len().checked_sub(supers)?)?;
                Some([base, &path[supers..]].concat())
            }
            "self" => Some([module, &path[1..]].concat()),
            _ => {
                let base = self.lookup(module, first, depth)?;
                Some([base.as_slice(), &path[1..]].concat())
            }
        }
    }

    /// The module that defines what `path` (from the root) names, and whether the name was
    /// found defined there (false: the deepest module on the path).
    fn resolve(&self, path: &[String], depth: usize) -> (Vec<String>, bool) {
        let mut module: Vec<String> = Vec::new();
        let mut i = 0;
        while i < path.len() {
            let mut next = module.clone();
            next.push(path[i].clone());
            if !self.modules.contains_key(&next) {
                break;
            }
            module = next;
            i += 1;
        }
        let Some(name) = path.get(i) else {
            return (module, true);
        };
        let m = &self.modules[&module];
        if m.defs.contains(name) {
            return (module, true);
        }
        if depth < 8 {
            for (local, target) in &m.uses {
                if local.as_deref() == Some(name.as_str()) {
                    return match self.absolute(&module, target, depth + 1) {
                        Some(abs) => {
                            self.resolve(&[abs.as_slice(), &path[i + 1..]].concat(), depth + 1)
                        }
                        None => (module, true), // a re-export of another crate's item
                    };
                }
            }
            for (local, target) in &m.uses {
                if local.is_none()
                    && let Some(abs) = self.absolute(&module, target, depth + 1)
                {
                    let (found_in, found) =
                        self.resolve(&[abs.as_slice(), &path[i..]].concat(), depth + 1);
                    if found {
                        return (found_in, true);
                    }
                }
            }
        }
        if module.is_empty() && path.len() == 1 && self.exported_macros.contains_key(name) {
            return (vec![format!("#macro:{name}")], true);
        }
        (module, false)
    }

    fn file_of(&self, module: &[String]) -> Option<usize> {
        if let Some(name) = module.first().and_then(|m| m.strip_prefix("#macro:")) {
            return self.exported_macros.get(name).copied();
        }
        self.modules.get(module).map(|m| m.file)
    }

    fn edges(&self) -> Graph {
        let mut graph = Graph {
            files: self.paths.clone(),
            ..Graph::default()
        };
        for (file, module, path) in &self.refs {
            let Some(abs) = self.absolute(module, path, 0) else {
                continue;
            };
            let (target, _) = self.resolve(&abs, 0);
            let Some(to) = self.file_of(&target) else {
                continue;
            };
            if to == *file {
                continue;
            }
            let name = abs
                .get(target.len())
                .or(abs.last())
                .cloned()
                .unwrap_or_else(|| "crate".to_string());
            graph
                .edges
                .entry((self.paths[*file].clone(), self.paths[to].clone()))
                .or_default()
                .insert(name.trim_start_matches("#macro:").to_string());
        }
        graph
    }
}

/// Every path a file writes, with the module it is written in: `use` trees, paths in code
/// and types, and `a::b` sequences in macro arguments.
struct References {
    file: usize,
    module: Vec<String>,
    found: Vec<(usize, Vec<String>, Vec<String>)>,
}

impl References {
    fn add(&mut self, path: Vec<String>) {
        if !path.is_empty() {
            self.found.push((self.file, self.module.clone(), path));
        }
    }

    /// `a::b::c` sequences in a macro's tokens (`$crate::x` too).
    fn scan_tokens(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => {
                    self.scan_tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(first) => {
                    let dollar = i > 0
                        && matches!(&tokens[i - 1], TokenTree::Punct(p) if p.as_char() == '$');
                    let mut path = vec![match dollar {
                        true => format!("${first}"),
                        false => first.to_string(),
                    }];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(next.to_string());
                        j += 3;
                    }
                    if path.len() > 1 {
                        self.add(path);
                    }
                    i = j;
                }
                TokenTree::Punct(_) | TokenTree::Literal(_) => i += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for References {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.module.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.module.pop();
    }

    /// A private `use` imports; a `pub use` only hands names on (a crate's face): what
    /// names them through it is tied to where they are defined, and the file itself only
    /// where its own code uses them.
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if matches!(u.vis, syn::Visibility::Inherited) {
            let mut flat = Vec::new();
            flatten(&u.tree, &mut Vec::new(), &mut flat);
            for (_, path) in flat {
                self.add(path);
            }
        }
    }

    /// A path in code or a type; a single name too (what a `use` brought in).
    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() {
            self.add(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, p);
    }

    /// `pub(crate)`, `pub(super)`: not a reference.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.scan_tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}
