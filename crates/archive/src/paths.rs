//! The archive's paths as a tree of components. Checking an entry's parents, finding a hard
//! link's target and following a symlink through the other links then cost each path's
//! length once, not its square: a 1.2 KB archive holding one path of many components ran
//! for hours when every parent was looked up by its whole path.

use std::collections::{HashMap, VecDeque};

/// A path of the archive (an entry's, or a directory its entries imply).
pub(crate) type Node = u32;
/// The archive's root (the destination itself).
pub(crate) const ROOT: Node = 0;

/// What an entry of the archive made its path (a later entry of the path replaces it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Dir(u32),
    File,
    /// Written after every file and directory; the target as the archive gives it.
    Symlink(Vec<u8>),
    /// Linked after every file; the node of its target.
    HardLink(Node),
}

/// Why a path cannot be entered: the component at this index is not a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Blocked {
    /// A symlink: writing through it could leave the destination.
    BySymlink(usize),
    /// A file or hard link.
    ByFile(usize),
}

#[derive(Debug)]
pub(crate) struct Paths {
    parent: Vec<Node>,
    /// `None` for the root and for directories only implied by the paths under them.
    kind: Vec<Option<Kind>>,
    has_children: Vec<bool>,
    /// Component names, interned: a lookup hashes a component without allocating.
    names: HashMap<Box<[u8]>, u32>,
    children: HashMap<(Node, u32), Node>,
}

impl Paths {
    pub fn new() -> Paths {
        Paths {
            parent: vec![ROOT],
            kind: vec![None],
            has_children: vec![false],
            names: HashMap::new(),
            children: HashMap::new(),
        }
    }

    /// Paths known, the root not counted.
    pub fn len(&self) -> u64 {
        self.parent.len() as u64 - 1
    }

    pub fn kind(&self, node: Node) -> Option<&Kind> {
        self.kind[node as usize].as_ref()
    }

    pub fn set_kind(&mut self, node: Node, kind: Kind) {
        self.kind[node as usize] = Some(kind);
    }

    pub fn has_children(&self, node: Node) -> bool {
        self.has_children[node as usize]
    }

    pub fn parent(&self, node: Node) -> Node {
        self.parent[node as usize]
    }

    pub fn child(&self, node: Node, name: &[u8]) -> Option<Node> {
        let id = self.names.get(name)?;
        self.children.get(&(node, *id)).copied()
    }

    /// The node of `components` (created with its parents where new), and how many nodes
    /// were new. Every parent must be a directory (or only implied).
    pub fn insert(&mut self, components: &[&[u8]]) -> Result<(Node, usize), Blocked> {
        let mut node = ROOT;
        let mut created = 0;
        for (i, name) in components.iter().enumerate() {
            if i > 0 {
                match self.kind(node) {
                    None | Some(Kind::Dir(_)) => {}
                    Some(Kind::Symlink(_)) => return Err(Blocked::BySymlink(i - 1)),
                    Some(Kind::File | Kind::HardLink(_)) => return Err(Blocked::ByFile(i - 1)),
                }
            }
            node = match self.child(node, name) {
                Some(next) => next,
                None => {
                    created += 1;
                    self.add(node, name)
                }
            };
        }
        Ok((node, created))
    }

    /// The node of `components`, if the archive has that path.
    pub fn find(&self, components: &[&[u8]]) -> Option<Node> {
        components
            .iter()
            .try_fold(ROOT, |node, name| self.child(node, name))
    }

    fn add(&mut self, parent: Node, name: &[u8]) -> Node {
        let id = match self.names.get(name) {
            Some(id) => *id,
            None => {
                let id = self.names.len() as u32;
                self.names.insert(name.into(), id);
                id
            }
        };
        let node = self.parent.len() as Node;
        self.parent.push(parent);
        self.kind.push(None);
        self.has_children.push(false);
        self.has_children[parent as usize] = true;
        self.children.insert((parent, id), node);
        node
    }

    /// Whether the symlink `link`'s `target`, followed from the link's directory, stays
    /// under `root` (the destination: the archive's root or its stripped top directory),
    /// going through the archive's other symlinks as the kernel would. Lexical: a
    /// component the archive does not have counts as a directory, which can only refuse
    /// more than the kernel would follow.
    pub fn resolve_inside(
        &self,
        root: Node,
        link: Node,
        target: &[u8],
    ) -> std::result::Result<(), &'static str> {
        // As Linux's MAXSYMLINKS.
        const MAX_HOPS: u32 = 40;
        // Directories from below `root` down to the link's own; `None` past the archive's
        // paths.
        let mut stack: Vec<Option<Node>> = Vec::new();
        let mut at = self.parent(link);
        while at != root {
            if at == ROOT {
                return Err("lies outside the destination");
            }
            stack.push(Some(at));
            at = self.parent(at);
        }
        stack.reverse();
        if target.starts_with(b"/") {
            return Err("leaves the destination (an absolute target)");
        }
        let mut pending: VecDeque<&[u8]> = target.split(|&b| b == b'/').collect();
        let mut hops = 0;
        while let Some(part) = pending.pop_front() {
            match part {
                b"" | b"." => {}
                b".." => {
                    if stack.pop().is_none() {
                        return Err("leaves the destination");
                    }
                }
                name => {
                    let here = stack.last().copied().unwrap_or(Some(root));
                    let next = here.and_then(|n| self.child(n, name));
                    let Some(Kind::Symlink(to)) = next.and_then(|n| self.kind(n)) else {
                        stack.push(next);
                        continue;
                    };
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err("runs through too many links (a loop?)");
                    }
                    if to.starts_with(b"/") {
                        return Err("leaves the destination (through an absolute link)");
                    }
                    for p in to.rsplit(|&b| b == b'/') {
                        pending.push_front(p);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comps(path: &str) -> Vec<&[u8]> {
        path.split('/').map(str::as_bytes).collect()
    }

    fn links(pairs: &[(&str, &str)]) -> Paths {
        let mut p = Paths::new();
        for (at, to) in pairs {
            let (n, _) = p.insert(&comps(at)).unwrap();
            p.set_kind(n, Kind::Symlink(to.as_bytes().to_vec()));
        }
        p
    }

    /// A link at `at` (added as a file when the archive has no such path) to `target`.
    fn check(p: &mut Paths, at: &str, target: &str) -> bool {
        let node = match p.find(&comps(at)) {
            Some(n) => n,
            None => {
                let (n, _) = p.insert(&comps(at)).unwrap();
                p.set_kind(n, Kind::File);
                n
            }
        };
        p.resolve_inside(ROOT, node, target.as_bytes()).is_ok()
    }

    #[test]
    fn links_resolve_through_other_links() {
        let mut l = links(&[("a", "."), ("b", "a/.."), ("lib/x.so", "x.so.1")]);
        assert!(check(&mut l, "a", "."));
        assert!(
            !check(&mut l, "b", "a/.."),
            "a is the root, so a/.. is above it"
        );
        assert!(check(&mut l, "lib/x.so", "x.so.1"));
        assert!(check(&mut l, "lib/y", "../lib/x.so"));
        assert!(!check(&mut l, "lib/z", "../../etc"));
        assert!(check(&mut l, "d/e", "../d") && !check(&mut l, "d/f", "../../d"));
        let mut l = links(&[("up", "..")]);
        assert!(!check(&mut l, "z", "up/x"));
        let mut loop_ = links(&[("p", "q"), ("q", "p")]);
        assert!(!check(&mut loop_, "p", "q"));
    }

    #[test]
    fn parents_must_be_directories() {
        let mut p = Paths::new();
        let (f, created) = p.insert(&comps("a/b/f")).unwrap();
        assert_eq!(created, 3);
        p.set_kind(f, Kind::File);
        assert_eq!(p.insert(&comps("a/b/f/g")), Err(Blocked::ByFile(2)));
        let (l, created) = p.insert(&comps("a/l")).unwrap();
        assert_eq!(created, 1);
        p.set_kind(l, Kind::Symlink(b".".to_vec()));
        assert_eq!(p.insert(&comps("a/l/x")), Err(Blocked::BySymlink(1)));
        assert_eq!(p.find(&comps("a/b")), Some(p.parent(f)));
        assert_eq!(p.len(), 4);
    }

    /// One path of many components costs its length, not its square: 2,000 components,
    /// a link through all of them, resolved at once.
    #[test]
    fn deep_paths_cost_their_length() {
        let deep = vec!["d"; 2000].join("/");
        let mut p = Paths::new();
        let (n, created) = p.insert(&comps(&format!("{deep}/f"))).unwrap();
        assert_eq!(created, 2001);
        p.set_kind(n, Kind::File);
        let up = vec![".."; 2000].join("/");
        assert!(check(
            &mut p,
            &format!("{deep}/l"),
            &format!("{up}/{deep}/f")
        ));
        assert!(!check(&mut p, &format!("{deep}/m"), &format!("{up}/../x")));
    }
}
