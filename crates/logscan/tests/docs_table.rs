//! docs/logscan.md lists every signature; this keeps the table in step with signatures.toml.
//! After changing the knowledge base: `UPDATE_DOCS=1 cargo test -p commstack-logscan --test docs_table`.

use std::path::Path;

use commstack_logscan::{KnowledgeBase, Phase};

const START: &str = "<!-- signatures:start (generated from crates/logscan/signatures.toml) -->";
const END: &str = "<!-- signatures:end -->";

fn table() -> String {
    let cell = |s: &str| {
        s.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace('|', "\\|")
    };
    let mut out = String::from(
        "| id | phase | severity | cause | fix | reference |\n| --- | --- | --- | --- | --- | --- |\n",
    );
    for phase in Phase::ALL {
        for sig in KnowledgeBase::builtin()
            .signatures()
            .iter()
            .filter(|s| s.phase == phase)
        {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} | {} | {} |\n",
                sig.id,
                sig.phase,
                sig.severity,
                cell(&sig.cause),
                cell(&sig.fix),
                sig.reference
            ));
        }
    }
    out
}

#[test]
fn docs_list_every_signature() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/logscan.md");
    let doc = std::fs::read_to_string(&path).expect("docs/logscan.md exists");
    let (head, rest) = doc
        .split_once(START)
        .expect("docs/logscan.md has the signatures:start marker");
    let (_, tail) = rest
        .split_once(END)
        .expect("docs/logscan.md has the signatures:end marker");
    let wanted = format!("{head}{START}\n{}{END}{tail}", table());
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &wanted).unwrap();
    } else {
        assert!(
            doc == wanted,
            "docs/logscan.md is out of date: run `UPDATE_DOCS=1 cargo test -p commstack-logscan --test docs_table`"
        );
    }
}
