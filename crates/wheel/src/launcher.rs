//! Console-script launchers: the `[console_scripts]` and `[gui_scripts]` sections of a
//! wheel's `entry_points.txt`, and the small Python script an installer writes for each
//! (the text pip's distlib writes, with a given shebang). Deterministic: entries sorted by
//! name, no timestamps, and module/attribute names checked to be dotted identifiers so an
//! entry point cannot inject code into the script.

use anyhow::{Context, Result, bail};

use crate::read::Wheel;

/// One `name = module:attr [extras]` line of a script section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryPoint {
    /// The script's file name (`torchrun`).
    pub name: String,
    pub module: String,
    /// `attr` or `obj.attr`.
    pub attr: String,
    /// From `[gui_scripts]` (same launcher on Linux).
    pub gui: bool,
}

/// The script entry points of `entry_points.txt`, sorted by name. Other sections are
/// ignored; a malformed script line is an error naming it.
pub fn parse_entry_points(text: &str) -> Result<Vec<EntryPoint>> {
    let mut out = Vec::new();
    let mut section: Option<bool> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = match name.trim() {
                "console_scripts" => Some(false),
                "gui_scripts" => Some(true),
                _ => None,
            };
            continue;
        }
        let Some(gui) = section else { continue };
        let where_ = || format!("entry_points.txt line {}: {raw:?}", i + 1);
        let (name, value) = line.split_once('=').with_context(where_)?;
        let name = name.trim();
        // Extras (`[extra]`) select optional dependencies; the launcher ignores them.
        let value = value.split('[').next().unwrap_or_default().trim();
        let (module, attr) = value
            .split_once(':')
            .with_context(|| format!("{}: no `module:attribute`", where_()))?;
        let (module, attr) = (module.trim(), attr.trim());
        let bad_name = name.is_empty()
            || name == "."
            || name == ".."
            || name.contains(['/', '\0'])
            || name.chars().any(char::is_whitespace);
        if bad_name || !dotted_identifier(module) || !dotted_identifier(attr) {
            bail!(
                "{}: not a script name and a dotted module:attribute",
                where_()
            );
        }
        out.push(EntryPoint {
            name: name.to_string(),
            module: module.to_string(),
            attr: attr.to_string(),
            gui,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(w) = out.windows(2).find(|w| w[0].name == w[1].name) {
        bail!("entry_points.txt names the script {} twice", w[0].name);
    }
    Ok(out)
}

/// The wheel's script entry points (none when it has no `entry_points.txt`).
pub fn entry_points(wheel: &Wheel) -> Result<Vec<EntryPoint>> {
    let inner = format!("{}/entry_points.txt", wheel.dist_info);
    if !wheel.entries.iter().any(|e| e.path == inner) {
        return Ok(Vec::new());
    }
    let bytes = wheel.read_dist_info("entry_points.txt")?;
    let text = String::from_utf8(bytes)
        .with_context(|| format!("{}: {inner} is not UTF-8", wheel.path.display()))?;
    parse_entry_points(&text).with_context(|| format!("{}: {inner}", wheel.path.display()))
}

/// The launcher script for `ep`, run by `python` (an absolute interpreter path).
pub fn launcher_script(python: &str, ep: &EntryPoint) -> String {
    let first = ep.attr.split('.').next().unwrap_or(&ep.attr);
    format!(
        "#!{python}\n\
         # -*- coding: utf-8 -*-\n\
         import re\n\
         import sys\n\
         from {module} import {first}\n\
         if __name__ == \"__main__\":\n    \
         sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n    \
         sys.exit({attr}())\n",
        module = ep.module,
        attr = ep.attr,
    )
}

fn dotted_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
                && chars.all(|c| c == '_' || c.is_alphanumeric())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_sections_are_parsed_sorted_and_others_ignored() {
        let text = "\
[console_scripts]
torchrun = torch.distributed.run:main
convert-caffe2 = caffe2.python.onnx.bin:main [extra]
; a comment
[torch.backends]
device = not_a:script
[gui_scripts]
viewer = pkg.gui:App.run
";
        let eps = parse_entry_points(text).unwrap();
        let names: Vec<&str> = eps.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["convert-caffe2", "torchrun", "viewer"]);
        assert_eq!(eps[1].module, "torch.distributed.run");
        assert_eq!(eps[1].attr, "main");
        assert!(eps[2].gui && !eps[1].gui);
        assert_eq!(eps[0].attr, "main", "extras dropped");
    }

    #[test]
    fn the_launcher_is_pips_text_with_the_given_shebang() {
        let ep = EntryPoint {
            name: "viewer".into(),
            module: "pkg.gui".into(),
            attr: "App.run".into(),
            gui: false,
        };
        let script = launcher_script("/opt/commstack/venv/bin/python", &ep);
        assert_eq!(
            script,
            "#!/opt/commstack/venv/bin/python\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n\
             from pkg.gui import App\nif __name__ == \"__main__\":\n    \
             sys.argv[0] = re.sub(r\"(-script\\.pyw|\\.exe)?$\", \"\", sys.argv[0])\n    \
             sys.exit(App.run())\n"
        );
    }

    #[test]
    fn code_in_an_entry_point_or_a_path_as_a_name_is_refused() {
        for bad in [
            "[console_scripts]\nx = os:system('rm -rf /')\n",
            "[console_scripts]\n../../etc/x = m:f\n",
            "[console_scripts]\nx = m\n",
            "[console_scripts]\nx = m:f\nx = m:g\n",
        ] {
            assert!(parse_entry_points(bad).is_err(), "{bad}");
        }
    }
}
