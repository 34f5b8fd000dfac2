//! The length of every function of a file, read with syn: free functions, methods, trait
//! methods with a body, and functions nested in them, each from its `fn` line to its closing
//! brace (doc comments and attributes not counted).

use syn::visit::Visit;

/// One function of a file.
#[derive(Debug, PartialEq, Eq)]
pub struct Function {
    /// `name`, `Type::name` for a method, prefixed by the inline modules around it
    /// (`tests::name`).
    pub name: String,
    /// The line of its `fn`.
    pub line: usize,
    /// Lines from its `fn` to its closing brace, both counted.
    pub lines: usize,
    /// Test code: in a `#[cfg(test)]` module or impl, or a `#[test]` function itself.
    pub test: bool,
}

/// Every function of `text` (a Rust source file), in the order they appear.
pub fn functions(text: &str) -> syn::Result<Vec<Function>> {
    let file = syn::parse_file(text)?;
    let mut v = Collect::default();
    v.visit_file(&file);
    Ok(v.found)
}

#[derive(Default)]
struct Collect {
    found: Vec<Function>,
    /// Inline modules, impl types and functions around the current item.
    scope: Vec<String>,
    /// Depth of `#[cfg(test)]`/`#[test]` items around the current one.
    test_depth: usize,
}

impl Collect {
    fn add(&mut self, attrs: &[syn::Attribute], sig: &syn::Signature, close: proc_macro2::Span) {
        let line = sig.fn_token.span.start().line;
        let mut name = self.scope.clone();
        name.push(sig.ident.to_string());
        self.found.push(Function {
            name: name.join("::"),
            line,
            lines: close.end().line + 1 - line,
            test: self.test_depth > 0 || is_test(attrs),
        });
    }

    /// Visit what is inside an item, in its scope and test-ness.
    fn within(&mut self, name: String, attrs: &[syn::Attribute], inner: impl FnOnce(&mut Self)) {
        let test = is_test(attrs);
        self.scope.push(name);
        self.test_depth += usize::from(test);
        inner(self);
        self.test_depth -= usize::from(test);
        self.scope.pop();
    }
}

/// `#[test]`, `#[cfg(test)]`, `#[tokio::test]` and the like.
fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        if path.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        // `cfg(test)`, `cfg(all(test, unix))`; not `cfg(not(test))`.
        let words = |list: &syn::MetaList| -> Vec<String> {
            list.tokens
                .to_string()
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .map(str::to_string)
                .collect()
        };
        path.is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(list)
                if words(list).iter().any(|w| w == "test")
                    && !words(list).iter().any(|w| w == "not"))
    })
}

impl<'ast> Visit<'ast> for Collect {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.add(&f.attrs, &f.sig, f.block.brace_token.span.close());
        self.within(f.sig.ident.to_string(), &f.attrs, |v| {
            syn::visit::visit_item_fn(v, f)
        });
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.add(&f.attrs, &f.sig, f.block.brace_token.span.close());
        self.within(f.sig.ident.to_string(), &f.attrs, |v| {
            syn::visit::visit_impl_item_fn(v, f)
        });
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.add(&f.attrs, &f.sig, body.brace_token.span.close());
        }
        self.within(f.sig.ident.to_string(), &f.attrs, |v| {
            syn::visit::visit_trait_item_fn(v, f)
        });
    }

    fn visit_item_impl(&mut self, i: &'ast syn::ItemImpl) {
        let name = match &*i.self_ty {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map_or("impl".to_string(), |s| s.ident.to_string()),
            _ => "impl".to_string(),
        };
        self.within(name, &i.attrs, |v| syn::visit::visit_item_impl(v, i));
    }

    fn visit_item_trait(&mut self, t: &'ast syn::ItemTrait) {
        self.within(t.ident.to_string(), &t.attrs, |v| {
            syn::visit::visit_item_trait(v, t)
        });
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.within(m.ident.to_string(), &m.attrs, |v| {
            syn::visit::visit_item_mod(v, m)
        });
    }
}

#[test]
fn functions_measures_each_function_from_fn_to_its_closing_brace() {
    let text = "\
/// doc
#[inline]
pub fn one() {
    let x = 1;
}

impl Thing {
    fn method(&self) -> u32 {
        fn nested() {}
        3
    }
}

trait T {
    fn required(&self);
    fn provided(&self) {
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_test() {
    }
    fn helper() {}
}

#[tokio::test(flavor = \"multi_thread\")]
async fn async_test() {}
";
    let found: Vec<(String, usize, usize, bool)> = functions(text)
        .unwrap()
        .into_iter()
        .map(|f| (f.name, f.line, f.lines, f.test))
        .collect();
    let expected: Vec<(String, usize, usize, bool)> = [
        ("one", 3, 3, false),
        ("Thing::method", 8, 4, false),
        ("Thing::method::nested", 9, 1, false),
        ("T::provided", 16, 2, false),
        ("tests::a_test", 23, 2, true),
        ("tests::helper", 25, 1, true),
        ("async_test", 29, 1, true),
    ]
    .into_iter()
    .map(|(n, l, c, t)| (n.to_string(), l, c, t))
    .collect();
    assert_eq!(found, expected);
}
