//! A render is refused when envlint finds anything in the environment it sets: the
//! rendered files are read back as any manifest or script would be, and each finding about
//! a variable of `[deploy.env]` points at its line in stack.toml.

use anyhow::{Result, bail};
use commstack_envlint::{Build, Catalog, Finding, NvshmemTables, input, lint};

use crate::Shape;
use crate::rendered::Rendered;

/// The findings of the rendered files, in file order.
pub fn findings(
    shape: &Shape,
    nvshmem: &NvshmemTables,
    rendered: &Rendered,
) -> Result<Vec<Finding>> {
    let catalog = Catalog::new(
        nvshmem,
        Build::from_transports(&shape.stack.nvshmem.transports),
    );
    let mut settings = Vec::new();
    for (path, text) in &rendered.files {
        if path.ends_with(".yaml") && !path.ends_with("kustomization.yaml") {
            settings.extend(input::manifest(path, text)?);
        } else if path.ends_with(".sbatch") {
            settings.extend(input::script(path, text));
        }
    }
    Ok(lint(&catalog, &settings))
}

pub fn refuse_findings(shape: &Shape, nvshmem: &NvshmemTables, rendered: &Rendered) -> Result<()> {
    let found = findings(shape, nvshmem, rendered)?;
    if found.is_empty() {
        return Ok(());
    }
    let mut text = String::new();
    let mut named = std::collections::BTreeSet::new();
    for f in &found {
        // One line per variable: the rendered files repeat it in every container.
        if !named.insert((f.name.clone(), f.rule)) {
            continue;
        }
        let at = match shape.stack.locate(&format!("deploy.env.{}", f.name)) {
            Some(loc) => loc.to_string(),
            None => format!("rendered ({})", f.place),
        };
        text.push_str(&format!(
            "\n  {at}: {}: {}\n    fix: {}",
            f.rule.as_str(),
            commstack_digest::terminal_safe(&f.message),
            commstack_digest::terminal_safe(&f.fix)
        ));
    }
    bail!(
        "the deploy's environment has {} problem(s), nothing was written:{text}\n(NVSHMEM's variables read from {}; `cargo xtask envlint FILE` checks any file the same way)",
        named.len(),
        nvshmem.origin.display()
    )
}
