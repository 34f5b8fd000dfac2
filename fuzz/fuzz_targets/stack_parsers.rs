//! Any text as stack.toml and as stack.lock: errors are fine, panics are not.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(diags) = commstack_stack::Stack::parse(Path::new("stack.toml"), text) {
        let _ = diags.to_string();
    }
    if let Ok(lock) = commstack_stack::Lock::parse(Path::new("stack.lock"), text) {
        let _ = lock.render(Some(text));
        let _ = lock.requirements_txt();
    }
});
